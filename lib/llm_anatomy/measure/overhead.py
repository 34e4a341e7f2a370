"""What a decode step launches, what one launch costs, and the three regimes a step can be in (C11, C20).

Every PyTorch op called from Python is one trip through the interpreter and the dispatcher; on a GPU most
of them also launch a kernel. When each op has little work (one token of a small model), those trips, and
not the arithmetic or the bytes, set the speed. Three lower bounds on the time of a step:

    compute-bound:  FLOPs / peak FLOP/s
    memory-bound:   bytes / bandwidth
    overhead-bound: ops x the cost of dispatching (and launching) one op

The largest of the three names the regime, when it explains the measured time. The overhead figure is an estimate
(the cost of the smallest op times the number of ops: a view costs less than an add, a big matmul more), so a
measured time may fall a little below it. When the measured time is far above all three, none of them explains
the step: something else holds it back (a kernel that does not reach the bandwidth, for one), and `regime` says so.
Units: seconds, FLOP, bytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from ..device import synchronize, timed
from ..errors import CourseError
from .peaks import Peaks
from .roofline import Work
from .timing import time_it

REGIMES = ("compute", "memory", "overhead")
_LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch",
                 "cuGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync")


@dataclass
class StepOps:
    """What one call of a step did, counted by torch.profiler.

    ops: aten ops called from Python (each a trip through the dispatcher; ops they call inside are not counted);
    launches: kernel launches the CPU made (CUDA runtime calls; a replayed CUDA graph is one); 0 on a CPU;
    kernels: kernels (and copies) that ran on the GPU; 0 on a CPU;
    kernel_s: seconds the GPU spent running them (CUDA), 0 on a CPU;
    by_name: the ops by name without the "aten::" prefix ("linear", "mul", ...), most common first.
    """

    ops: int
    launches: int = 0
    kernels: int = 0
    kernel_s: float = 0.0
    by_name: Counter = field(default_factory=Counter)


def _inside_aten(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def profiled_events(fn, device: torch.device) -> list:
    """The profiler's events of one call of `fn()` (CPU ops and, on a GPU, its kernels), the device synchronized."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    return list(prof.events())


def python_ops(events) -> list:
    """The aten ops that Python called among profiler `events`: an op PyTorch implements with others (linear = t +
    mm, softmax, ...) is one op, its parts are not counted again."""
    return [e for e in events if e.name.startswith("aten::") and not _inside_aten(e)]


def _profile(fn, device: torch.device) -> StepOps:
    """One call of `fn()` under torch.profiler: the course's one op counter.

    It counts the aten ops that Python called, whatever the autograd mode: an op that PyTorch implements with others
    (linear = t + mm, softmax, reshape, chunk, ...) is one op, its parts are not counted again. (A TorchDispatchMode
    counter counts below autograd, so outside inference_mode it sees linear as t and mm: 218 ops for a step of the
    tiny test model where this counts 169, and under inference_mode the same 169.)
    """
    from torch.autograd import DeviceType

    events = profiled_events(fn, device)
    top = python_ops(events)
    on_gpu = [e for e in events if e.device_type == DeviceType.CUDA]
    launches = sum(1 for e in events if e.device_type == DeviceType.CPU and e.name in _LAUNCH_CALLS)
    kernel_s = sum(e.time_range.elapsed_us() for e in on_gpu) / 1e6
    return StepOps(len(top), launches, len(on_gpu), kernel_s, Counter(e.name.removeprefix("aten::") for e in top))


def count_step_ops(fn, device: torch.device | str = "cpu") -> StepOps:
    """Run `fn()` once to warm up, then once under torch.profiler, and count its ops, launches and kernels.

    `fn` must be repeatable (a decode step that rewinds its cache first, for one)."""
    device = torch.device(device)
    fn()
    ops = _profile(fn, device)
    if not ops.ops and device.type != "cuda":
        raise CourseError("The step called no PyTorch op: pass the step itself, e.g. lambda: decode_step(...).")
    return ops


def count_ops(fn, device: torch.device | str = "cpu") -> Counter:
    """The ops that one call of `fn()` makes from Python, by name ({"linear": 15, "mul": 30, ...}), no warm-up.

    The same counter as count_step_ops (its by_name), for work that runs once, such as a step that fills its cache.
    """
    return _profile(fn, torch.device(device)).by_name


def dispatch_cost_s(device: torch.device | str = "cpu", calls: int = 2000) -> float:
    """Seconds per op of the smallest op there is (adding 1 to one number), called `calls` times from Python.

    That is the cost of a trip through Python and the dispatcher, plus a kernel launch on a GPU: what every
    op of a step pays however little work it does. The device is synchronized once, at the end.
    """
    device = torch.device(device)
    x = torch.zeros(1, device=device)
    y = torch.empty_like(x)

    def many():
        for _ in range(calls):
            torch.add(x, 1, out=y)

    many()  # warm-up
    seconds, _ = timed(many, device)
    return seconds / calls


def op_mix_cost_s(step, device: torch.device | str = "cpu", repeats: int = 20) -> tuple[float, int]:
    """Seconds per op of a real op mix, and the op count: the median time of `step` over the ops it calls.

    Give it a step that moves almost no bytes and does almost no arithmetic (a decode step of a tiny model): its time
    is then all dispatch, so this is what an op of a real step's mix (linear, mul, softmax, cat, views, ...) costs,
    more than the smallest op of dispatch_cost_s. `step` must be repeatable.
    """
    device = torch.device(device)
    ops = count_step_ops(step, device).ops
    return time_it(step, device, warmup=2, repeats=repeats).median_s / ops, ops


def regime_times(work: Work, ops: int, peaks: Peaks, per_op_s: float) -> dict[str, float]:
    """The three lower bounds on a step's time, seconds: compute (FLOPs / peak), memory (bytes / bandwidth),
    overhead (ops x seconds per op)."""
    if ops < 0 or per_op_s < 0:
        raise CourseError(f"ops and per_op_s must be >= 0, not {ops} and {per_op_s}.")
    return {"compute": work.flops / peaks.flops_per_s, "memory": work.bytes / peaks.bytes_per_s,
            "overhead": ops * per_op_s}


UNEXPLAINED = "unexplained"


def regime(times: dict[str, float], measured_s: float | None = None, slack: float = 1.5) -> str:
    """The regime a step is in: the name of the largest bound ('compute', 'memory' or 'overhead'), or UNEXPLAINED
    when the step's measured time is more than `slack` times that bound (none of the three accounts for it)."""
    largest = max(REGIMES, key=lambda name: times[name])
    if measured_s is not None and measured_s > slack * times[largest]:
        return UNEXPLAINED
    return largest



# --------------------------------------------------------------------------- C20 on a CPU: the matmuls' share of a step

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")
# On a CPU a small model's decode step is mostly its matmuls. Measured on the 2-core test machine, the real model's
# plain fp32 step under the profiler: 66-79% in matmul ops busy (other agents on both cores, and with one core
# burned by tools/busy_check.py); the tiny random
# model (2 layers, hidden 64), whose step is its ops' dispatch, 1%. A bar of one half separates them.
MATMUL_SHARE_BAR = 0.5


def matmul_share(step, device: torch.device | str = "cpu") -> tuple[float, float]:
    """(wall seconds of one call of `step` under torch.profiler, seconds of it inside matmul ops' own code), after
    a warm-up call. On a CPU every op runs on the calling thread, so the two are comparable."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall, _ = timed(step, device)
    return wall, sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in MATMUL_OPS) / 1e6  # µs -> s


def matmul_share_evidence(wall_s: float, in_matmuls_s: float, bar: float = MATMUL_SHARE_BAR) -> tuple[bool, str]:
    """C20's CPU half: (the matmul ops took more than `bar` of the profiled step, the evidence). Then fusing and
    cutting dispatch, which shrink the ops around the matmuls, can save at most the rest; a faster matmul kernel or
    another layout of the weights shrinks the matmuls themselves and is not bounded by it."""
    if wall_s <= 0 or in_matmuls_s < 0:
        raise CourseError(f"Give a positive step time and a matmul time >= 0, not {wall_s} and {in_matmuls_s}.")
    share = in_matmuls_s / wall_s
    return share > bar, (f"the matmul ops took {in_matmuls_s * 1e3:.1f} ms of the profiled {wall_s * 1e3:.1f} ms step, "
                         f"{share:.0%} (bar: more than {bar:.0%}); fusing and cutting dispatch can save at most the "
                         f"other {1 - share:.0%}; a faster matmul kernel or layout is not bounded by it")
