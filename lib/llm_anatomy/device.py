"""Choosing where the model runs, in which number format, and how to time work on it.

`timed(fn, device)` is the course's one clock: every timing (the benchmarks, the session's
milliseconds, TTFT and TPOT) goes through it, so that all of them wait for the device the same way.
`use_cpu_threads` is the course's one thread policy on a CPU: as many torch threads as cores are free now.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

from .errors import CourseError


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """Return the device to use: CUDA first, then Apple's MPS, then the CPU for "auto"."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError):
        raise CourseError(
            f"Unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'mps'."
        ) from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise CourseError("You asked for 'cuda' but this machine has no CUDA GPU: use device='auto'.")
    if chosen.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise CourseError("You asked for 'mps' but Apple's MPS is not available here: use device='auto'.")
    return chosen


def native_bf16(device: torch.device) -> bool:
    """Whether this CUDA GPU computes bf16 in hardware (Ampere and newer), not by emulation.

    A T4 reports bf16 as "supported" through emulation, which is slow and has no bf16 tensor-core
    peak to compare with: there fp16 is the right 16-bit format.
    """
    if device.type != "cuda":
        return False
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # older torch without the argument: compute capability 8.0 or newer has bf16 units
        return torch.cuda.get_device_capability(device)[0] >= 8


# The number formats by the short names the course and its benchmarks use: the one table of them.
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                                  "fp8": torch.float8_e4m3fn}


def dtype_named(name: str) -> torch.dtype:
    """The torch dtype of a short name ("bf16", "fp16", "fp32", "fp8"), or one clear CourseError."""
    if name not in DTYPES:
        raise CourseError(f"Unknown number format {name!r}: choose one of {', '.join(DTYPES)}.")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """The short name of a dtype ("bf16" for torch.bfloat16), or torch's own name for one not in DTYPES."""
    return next((name for name, d in DTYPES.items() if d == dtype), str(dtype).removeprefix("torch."))


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on the CPU (exact, and fast enough); bf16 on GPUs with native bf16, else fp16."""
    if device.type == "cuda":
        return torch.bfloat16 if native_bf16(device) else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


def describe_device(device: torch.device) -> str:
    """A one-line, human description such as 'cuda (NVIDIA H100, 80.0 GB)' or 'cpu (2 cores)'."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"cuda ({props.name}, {props.total_memory / 1e9:.1f} GB)"
    if device.type == "mps":
        return "mps (Apple GPU)"
    threads = torch.get_num_threads()
    return f"cpu ({os.cpu_count()} cores, {threads} torch thread{'s' if threads != 1 else ''})"


def synchronize(device: torch.device) -> None:
    """Wait until queued GPU work has finished, so that a timer measures the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


T = TypeVar("T")


def timed(fn: Callable[[], T], device: torch.device | str = "cpu") -> tuple[float, T]:
    """(seconds, result) of one call of `fn`, the device synchronized before and after.

    On a GPU, kernels are queued and run later: without the synchronize, a timer measures only how
    fast Python queues them.
    """
    device = torch.device(device)
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


# --------------------------------------------------------------------------- CPU threads: the course's one policy
#
# torch splits every operation across its threads, and an operation is done when its slowest thread is. On an idle
# machine that is a gain; when another program holds one of the cores, every small operation waits for the thread
# that lost its core, and a decode step of the default model took from 2x to 20x its idle time (workshop/
# INSTRUCTOR.md). So the course gives torch as many threads as there are cores free *now*, measured, never more
# than torch's own choice, and re-measures before each timed comparison (`measure.timing.time_interleaved`).

TORCH_DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice at start (physical cores, OMP_NUM_THREADS)
SAMPLE_S = 0.2  # how long the cores are watched, seconds
RECHECK_S = 10.0  # a choice younger than this is reused by `recheck_cpu_threads`
FREE_ENOUGH = 0.75  # a core counts as free when other programs used less than a quarter of it


@dataclass(frozen=True)
class ThreadChoice:
    """The torch threads this CPU can give now, and why. cores: the cores this process may run on (affinity and a
    container's CPU quota), at most torch's own choice; busy: how many cores' worth of time other programs used while
    we watched for `sampled_s` seconds (this process's own threads not counted)."""

    threads: int
    cores: int
    busy: float
    sampled_s: float
    pinned: bool = False  # set by hand (pin_cpu_threads, a command's --threads): the policy leaves it alone

    def reason(self) -> str:
        if self.pinned:
            return "set by hand (--threads), not measured"
        free = max(0.0, self.cores - self.busy)
        return (f"{self.cores} core{'s' if self.cores > 1 else ''} for torch, {self.busy:.1f} of them kept busy by other "
                f"programs over {self.sampled_s:.1f} s ({free:.1f} free)")

    def __str__(self) -> str:
        return f"{self.threads} torch thread{'s' if self.threads > 1 else ''}: {self.reason()}"


def usable_cores() -> int:
    """The cores torch may use here: those this process may run on (its CPU affinity, a container's quota in
    /sys/fs/cgroup/cpu.max), and no more than torch's own choice at start."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, min(cores, TORCH_DEFAULT_THREADS))


def busy_cores(sample_s: float = SAMPLE_S) -> float:
    """How many cores' worth of CPU time other programs used over the next `sample_s` seconds (0.0 = idle, 1.0 = one
    core kept busy). This process's own time (torch threads that still spin after their last operation) is left out."""
    import psutil

    me = psutil.Process()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None

    def used() -> tuple[float, float]:
        per_cpu = psutil.cpu_times(percpu=True)
        chosen = [per_cpu[i] for i in cpus if i < len(per_cpu)] if cpus else per_cpu
        busy = sum(sum(t) - t.idle - getattr(t, "iowait", 0.0) for t in chosen)
        own = me.cpu_times()
        return busy, own.user + own.system

    (busy0, own0), start = used(), time.monotonic()
    time.sleep(sample_s)
    (busy1, own1), elapsed = used(), time.monotonic() - start
    return max(0.0, (busy1 - busy0) - (own1 - own0)) / max(elapsed, 1e-3)


def choose_cpu_threads(sample_s: float = SAMPLE_S) -> ThreadChoice:
    """Measure the cores free now and choose torch's threads: one per free core, at least 1 (a core is free when
    other programs used less than a quarter of it)."""
    cores, busy = usable_cores(), busy_cores(sample_s)
    threads = max(1, min(cores, int(cores - busy + (1 - FREE_ENOUGH))))
    return ThreadChoice(threads, cores, round(busy, 2), sample_s)


_policy: dict = {}  # the last choice applied, and when: {"choice": ThreadChoice, "at": monotonic seconds}


def pin_cpu_threads(threads: int) -> ThreadChoice:
    """Set torch's threads by hand (a command's --threads): the policy keeps them from here on."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise CourseError(f"Give at least 1 thread, not {threads!r}.")
    torch.set_num_threads(threads)
    choice = ThreadChoice(threads, usable_cores(), 0.0, 0.0, pinned=True)
    _policy.update(choice=choice, at=time.monotonic())
    return choice


def use_cpu_threads(device: torch.device | str = "cpu", sample_s: float = SAMPLE_S) -> ThreadChoice | None:
    """Apply the course's thread policy: on a CPU, torch gets `choose_cpu_threads()` threads from here on (load_model
    calls this), unless they were pinned by hand. Returns the choice, or None on a GPU (its CPU threads only queue
    kernels; torch keeps its own)."""
    if torch.device(device).type != "cpu":
        return None
    last = _policy.get("choice")
    if last is not None and last.pinned:
        return last
    choice = choose_cpu_threads(sample_s)
    torch.set_num_threads(choice.threads)
    _policy.update(choice=choice, at=time.monotonic())
    return choice


def recheck_cpu_threads(max_age_s: float = RECHECK_S) -> ThreadChoice | None:
    """Before a timed comparison: measure the free cores again and apply the policy, if the policy set torch's threads
    and nobody has pinned them since (`torch_threads`, a test's fixture). A choice younger than `max_age_s` seconds
    is kept. Returns the choice in force, or None when the policy is not in charge."""
    last = _policy.get("choice")
    if last is None or last.pinned or torch.get_num_threads() != last.threads:
        return None
    if time.monotonic() - _policy["at"] < max_age_s:
        return last
    return use_cpu_threads("cpu")


@contextmanager
def torch_threads(n: int | None):
    """Run the block with `n` torch threads (None: as they are), and restore the count after. For what must not
    depend on the policy: a result compared bit for bit with a rank that runs on `n` threads (fp32 sums split among
    threads round differently), or a comparison of thread counts."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
