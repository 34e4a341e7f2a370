"""Honest measurements on the learner's own machine: timing, the machine's peaks, and a roofline.

Timing rules (each one fixes a way to fool yourself):
- warm up first: the first call pays for memory allocation, kernel selection and caches;
- on a GPU, synchronize before reading the clock: kernels are queued, and a timer that does not wait
  measures only how fast Python can queue them (`llm_anatomy.device.synchronize`);
- repeat and take the median: one slow run (another program, a page fault) must not set the figure.

The machine's peaks are measured, not assumed: a large matmul gives the FLOP/s it can reach, and a
sum over a large tensor gives the rate at which it can read memory (decode reads the weights and writes
almost nothing, so read bandwidth is the limit that matters). Published peaks of common GPUs stand
beside them for comparison.

Units: seconds, FLOP/s, bytes/s; FLOP = one multiply or one add.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .device import synchronize
from .errors import CourseError

# Dense bf16/fp16 tensor-core peaks and memory bandwidth, from NVIDIA's data sheets.
# name pattern (matched in the device name, most specific first) -> (FLOP/s, bytes/s)
PUBLISHED_PEAKS: dict[str, tuple[float, float]] = {
    "H200": (989e12, 4.8e12),
    "H100 PCIe": (756e12, 2.0e12),
    "H100": (989e12, 3.35e12),  # SXM
    "A100-SXM4-40GB": (312e12, 1.555e12),
    "A100-PCIE-40GB": (312e12, 1.555e12),
    "A100": (312e12, 2.039e12),  # 80 GB
    "L4": (121e12, 0.300e12),
    "T4": (65e12, 0.320e12),
}


# --------------------------------------------------------------------------- timing


@dataclass
class Timing:
    """Repeated wall-clock times of one piece of work, seconds."""

    times_s: list[float]
    warmup: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def median_ms(self) -> float:
        return self.median_s * 1e3

    def __repr__(self) -> str:
        return f"Timing(median {self.median_ms:.3f} ms over {len(self.times_s)} runs, {self.warmup} warm-up)"


def time_it(fn: Callable[[], object], device: torch.device | str = "cpu", *, warmup: int = 1,
            repeats: int = 5, cuda_events: bool = False) -> Timing:
    """Time `fn()` `repeats` times after `warmup` untimed calls; the device is synchronized around each.

    cuda_events=True (CUDA only) reads the time the GPU spent between two events instead of the wall clock;
    it excludes Python's time before the first kernel starts, so it is the GPU's own time.
    """
    device = torch.device(device)
    if repeats < 1 or warmup < 0:
        raise CourseError(f"Use repeats >= 1 and warmup >= 0, not {repeats} and {warmup}.")
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    use_events = cuda_events and device.type == "cuda"
    for _ in range(repeats):
        if use_events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times.append(time.perf_counter() - t0)
    return Timing(times, warmup)


# --------------------------------------------------------------------------- the machine's peaks


@dataclass
class Peaks:
    """What this machine reached: matmul FLOP/s and memory read bandwidth (bytes/s), with how."""

    device: str
    dtype: str
    flops_per_s: float
    bytes_per_s: float
    how: str
    published: tuple[float, float] | None = None  # (FLOP/s, bytes/s) from the data sheet, if known

    @property
    def ridge_intensity(self) -> float:
        """FLOP per byte where the two roofs meet: below it, memory sets the speed."""
        return self.flops_per_s / self.bytes_per_s


def measure_matmul_flops(device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                         size: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of a square matmul of `size` (2 x size^3 FLOP each): about the most a device can compute."""
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    timing = time_it(lambda: torch.mm(a, b, out=out), device, warmup=2, repeats=repeats)
    return 2 * size ** 3 / timing.median_s


def measure_bandwidth(device: torch.device | str = "cpu", nbytes: int | None = None, repeats: int = 5,
                      method: str = "sum") -> float:
    """Memory bandwidth, bytes/s.

    method="sum" reads a large tensor once (bytes = its size): the pattern of decode, which streams the
    weights and writes almost nothing. method="copy" reads and writes it (bytes = 2 x size).
    The tensor is far larger than any cache, so caches cannot flatter the figure.
    """
    device = torch.device(device)
    if method not in ("sum", "copy"):
        raise CourseError(f"method must be 'sum' or 'copy', not {method!r}.")
    nbytes = nbytes or ((1 << 31) if device.type == "cuda" else (1 << 28))
    x = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    if method == "sum":
        fn, moved = (lambda: x.sum()), x.numel() * 4
    else:
        y = torch.empty_like(x)
        fn, moved = (lambda: y.copy_(x)), 2 * x.numel() * 4
    timing = time_it(fn, device, warmup=2, repeats=repeats)
    return moved / timing.median_s


def published_peaks(device_name: str) -> tuple[float, float] | None:
    """(FLOP/s, bytes/s) from the data sheet of a known GPU whose name contains a pattern, else None."""
    import re

    for pattern, peaks in PUBLISHED_PEAKS.items():  # whole words only: "L4" must not match "L40S"
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(pattern)}(?![A-Za-z0-9])", device_name, re.IGNORECASE):
            return peaks
    return None


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import os

    return f"{device.type} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def measure_peaks(device: torch.device | str = "cpu", dtype: torch.dtype | None = None, quick: bool = False) -> Peaks:
    """Measure this device's matmul FLOP/s and memory read bandwidth (smaller and faster with quick=True)."""
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    cuda = device.type == "cuda"
    size = (4096 if quick else 8192) if cuda else (512 if quick else 1024)
    nbytes = ((1 << 29) if quick else (1 << 31)) if cuda else ((1 << 26) if quick else (1 << 28))
    flops = measure_matmul_flops(device, dtype, size)
    bandwidth = measure_bandwidth(device, nbytes)
    name = device_name(device)
    how = (f"{size}x{size} {str(dtype).removeprefix('torch.')} matmul; sum over {nbytes / 2**20:.0f} MiB "
           "(read bandwidth, as decode reads the weights)")
    return Peaks(name, str(dtype).removeprefix("torch."), flops, bandwidth, how,
                 published_peaks(name) if cuda else None)


def peaks_table(peaks: Peaks) -> str:
    """A small text table: measured peaks beside the data-sheet peaks of common GPUs."""
    rows = [f"{'device':<28} {'TFLOP/s':>9} {'GB/s':>8}",
            f"{'this machine (measured)':<28} {peaks.flops_per_s / 1e12:>9.3g} {peaks.bytes_per_s / 1e9:>8.3g}"]
    if peaks.published:
        rows.append(f"{'this GPU (data sheet)':<28} {peaks.published[0] / 1e12:>9.3g} {peaks.published[1] / 1e9:>8.4g}")
    for name in ["T4", "L4", "A100", "H100", "H200"]:
        f, b = PUBLISHED_PEAKS[name]
        label = {"A100": "A100-80GB", "H100": "H100 SXM"}.get(name, name)
        rows.append(f"{label + ' (data sheet, bf16)':<28} {f / 1e12:>9.3g} {b / 1e9:>8.4g}")
    return "\n".join(rows)


# --------------------------------------------------------------------------- FLOPs and bytes of a Llama-family model


@dataclass(frozen=True)
class Work:
    """FLOPs done and bytes moved by one forward pass."""

    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte."""
        if self.bytes <= 0:
            raise CourseError("Arithmetic intensity needs a positive number of bytes.")
        return self.flops / self.bytes


def matmul_parameters(cfg) -> int:
    """Weights that take part in matmuls per token (every projection and the LM head; not the embedding lookup).

    `cfg` is a ScratchConfig (llm_anatomy.scratch).
    """
    d, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * cfg.intermediate_size
    return cfg.num_layers * per_layer + cfg.vocab_size * d


def forward_work(cfg, new_tokens: int, past: int = 0, batch: int = 1, bytes_per_element: int = 4) -> Work:
    """FLOPs and bytes of one forward pass of `new_tokens` per sequence after `past` cached positions.

    FLOPs: 2 per matmul weight per token, plus attention's two matmuls (q.k and weights.v) over the context.
    Bytes: every matmul weight read once (shared by all tokens of the pass), plus the KV cache read and the
    new K/V written. Activations are left out: they are small beside the weights for short passes.
    """
    weights = matmul_parameters(cfg)
    tokens = batch * new_tokens
    context = past + (new_tokens + 1) / 2  # average positions each new token attends to (causal)
    attention_flops = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context * tokens
    flops = 2 * weights * tokens + attention_flops
    kv_per_position = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * bytes_per_element
    moved = weights * bytes_per_element + kv_per_position * batch * (past + new_tokens)
    return Work(float(flops), float(moved))


@dataclass(frozen=True)
class RooflinePoint:
    """One measured run on the roofline: its intensity (FLOP/byte) and attained FLOP/s."""

    label: str
    intensity: float
    flops_per_s: float


def roofline_point(label: str, work: Work, seconds: float) -> RooflinePoint:
    """Place a run that did `work` in `seconds` on the roofline."""
    if seconds <= 0:
        raise CourseError(f"seconds must be positive, not {seconds}.")
    return RooflinePoint(label, work.intensity, work.flops / seconds)


def roof(peaks: Peaks, intensity: float) -> float:
    """The most FLOP/s any run of this intensity can reach here: min(compute peak, bandwidth x intensity)."""
    return min(peaks.flops_per_s, peaks.bytes_per_s * intensity)


def plot_roofline(peaks: Peaks, points: list[RooflinePoint], ax=None, title: str | None = None):
    """Log-log roofline: the measured roofs and each run as a point. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    lows = [p.intensity for p in points] + [peaks.ridge_intensity]
    x = np.logspace(np.log10(min(lows) / 4), np.log10(max(lows + [p.intensity for p in points]) * 4), 200)
    ax.loglog(x, [roof(peaks, i) / 1e9 for i in x], color="black", lw=2, label="measured roof")
    ax.axvline(peaks.ridge_intensity, color="grey", ls=":", lw=1)
    markers = {"prefill": "o", "decode": "s"}
    for p in points:
        kind = next((k for k in markers if p.label.startswith(k)), None)
        ax.loglog(p.intensity, p.flops_per_s / 1e9, markers.get(kind, "^"),
                  color={"prefill": "tab:orange", "decode": "tab:blue"}.get(kind, "tab:green"))
        ax.annotate(p.label, (p.intensity, p.flops_per_s / 1e9), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attained GFLOP/s")
    ax.set_title(title or f"Roofline of {peaks.device} ({peaks.dtype})")
    ax.grid(True, which="both", alpha=0.3)
    return ax


# --------------------------------------------------------------------------- generation timing


@dataclass
class GenerationTiming:
    """TTFT and time per output token of one generation, seconds."""

    prompt_tokens: int
    new_tokens: int
    batch: int
    ttft_s: float
    tpot_s: float
    step_seconds: list[float] = field(default_factory=list)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second while decoding, all sequences of the batch together."""
        return self.batch / self.tpot_s

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.batch * self.prompt_tokens / self.ttft_s


def time_generation(model, prompt_ids: torch.Tensor, new_tokens: int = 16, warmup: bool = True) -> GenerationTiming:
    """TTFT (the prefill) and median time per output token of a greedy generation by a from-scratch model."""
    from .kv_cache import generate_greedy

    if warmup:
        generate_greedy(model, prompt_ids[:, : min(8, prompt_ids.shape[1])], 2)
    result = generate_greedy(model, prompt_ids, new_tokens, timed=True)
    return GenerationTiming(prompt_ids.shape[1], new_tokens, prompt_ids.shape[0], result.ttft_s, result.tpot_s,
                            result.step_seconds)
