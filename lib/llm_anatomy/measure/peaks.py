"""The machine's peaks, measured the way the field measures them: the denominators of every "% of peak".

- compute: the FLOP/s of a large square matmul in the course's dtype (a size large enough to saturate);
- memory: the best of three streaming kernels (read = sum, copy, triad a + s*b) over buffers far larger than
  the last-level cache, and at least as large as the model's weights, with all cores.

Published data-sheet peaks of common GPUs stand beside them, labelled with their dtype.
Units: FLOP/s and bytes/s; FLOP = one multiply or one add.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..device import describe_device, dtype_name
from ..errors import CourseError
from .timing import time_it

# Dense 16-bit tensor-core peaks and memory bandwidth, from NVIDIA's data sheets.
# name pattern (matched in the device name, most specific first) -> (FLOP/s, bytes/s, dtype of the FLOP/s).
# The T4 has no bf16 tensor cores (bf16 is emulated there), so its figure is fp16's.
PUBLISHED_PEAKS: dict[str, tuple[float, float, str]] = {
    "H200": (989e12, 4.8e12, "bf16"),
    "H100 PCIe": (756e12, 2.0e12, "bf16"),
    "H100": (989e12, 3.35e12, "bf16"),  # SXM
    "A100-SXM4-40GB": (312e12, 1.555e12, "bf16"),
    "A100-PCIE-40GB": (312e12, 1.555e12, "bf16"),
    "A100": (312e12, 2.039e12, "bf16"),  # 80 GB
    "L4": (121e12, 0.300e12, "bf16"),
    "T4": (65e12, 0.320e12, "fp16"),
}

BANDWIDTH_METHODS = ("sum", "copy", "triad")


@dataclass
class Peaks:
    """What this machine reached: matmul FLOP/s (in `dtype`) and memory bandwidth (bytes/s), with how."""

    device: str
    dtype: str
    flops_per_s: float
    bytes_per_s: float
    how: str
    published: tuple[float, float, str] | None = None  # (FLOP/s, bytes/s, dtype) from the data sheet, if known
    bandwidth_by_method: dict[str, float] | None = None  # bytes/s of each streaming kernel

    @property
    def ridge_intensity(self) -> float:
        """FLOP per byte where the two roofs meet: below it, memory sets the speed."""
        return self.flops_per_s / self.bytes_per_s


def measure_matmul_flops(device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                         size: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of a square matmul of `size` (2 x size^3 FLOP each): about the most a device can compute."""
    from ..device import default_dtype

    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    timing = time_it(lambda: torch.mm(a, b, out=out), device, warmup=2, repeats=repeats)
    return 2 * size ** 3 / timing.median_s


def measure_bandwidth(device: torch.device | str = "cpu", nbytes: int | None = None, repeats: int = 5,
                      method: str = "sum") -> float:
    """Memory bandwidth of one streaming kernel, bytes/s, over float32 buffers of `nbytes` each.

    "sum" reads x once (bytes = size of x): the pattern of decode, which streams the weights.
    "copy" y = x reads and writes (2 x size); "triad" z = x + 2 y reads two and writes one (3 x size).
    Make `nbytes` far larger than the last-level cache, so that caches cannot flatter the figure.
    """
    device = torch.device(device)
    if method not in BANDWIDTH_METHODS:
        raise CourseError(f"method must be one of {', '.join(BANDWIDTH_METHODS)}, not {method!r}.")
    nbytes = nbytes or ((1 << 31) if device.type == "cuda" else (1 << 28))
    x = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    if method == "sum":
        fn, moved = (lambda: x.sum()), x.numel() * 4
    elif method == "copy":
        y = torch.empty_like(x)
        fn, moved = (lambda: y.copy_(x)), 2 * x.numel() * 4
    else:
        y, z = torch.ones_like(x), torch.empty_like(x)
        fn, moved = (lambda: torch.add(x, y, alpha=2.0, out=z)), 3 * x.numel() * 4
    timing = time_it(fn, device, warmup=2, repeats=repeats)
    return moved / timing.median_s


def matvec_over(nbytes: float, width: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """A matrix-vector product that reads `nbytes` of weights: one [rows, width] matrix in `dtype` times one vector,
    as a decode step multiplies each weight matrix by its one token's activations, but in a single kernel call.
    Returns (fn, bytes its matrix holds). Timed in turns with a decode step (measured_in_turns), it is what reading
    the step's bytes costs with this framework's own matrix-vector kernel, with none of the step's other ops: a
    memory-bound step takes about as long, an overhead-bound one far longer (claim_memory_bound)."""
    if width < 1 or nbytes <= 0:
        raise CourseError(f"width must be at least 1 and nbytes positive, not {width} and {nbytes}.")
    size = torch.tensor([], dtype=dtype).element_size()
    rows = max(1, round(nbytes / size / width))
    weight = torch.randn(rows, width, device=device).to(dtype)
    vector = torch.randn(1, width, device=device).to(dtype)
    return (lambda: torch.nn.functional.linear(vector, weight)), rows * width * size


def published_peaks(device_name: str) -> tuple[float, float, str] | None:
    """(FLOP/s, bytes/s, dtype) from the data sheet of a known GPU whose name contains a pattern, else None."""
    for pattern, peaks in PUBLISHED_PEAKS.items():  # whole words only: "L4" must not match "L40S"
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(pattern)}(?![A-Za-z0-9])", device_name, re.IGNORECASE):
            return peaks
    return None


def measure_peaks(device: torch.device | str = "cpu", dtype: torch.dtype | None = None, quick: bool = False,
                  min_bytes: int = 0) -> Peaks:
    """Measure this device's matmul FLOP/s and its best streaming bandwidth (read, copy, triad).

    Buffers are 2 GiB on a GPU and 256 MiB on a CPU (or `min_bytes`, e.g. the model's weight bytes, if larger);
    quick=True uses smaller sizes (for tests). The bandwidth is the best of the three kernels.
    """
    from ..device import default_dtype

    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    cuda = device.type == "cuda"
    size = (4096 if quick else 8192) if cuda else (512 if quick else 1024)
    nbytes = ((1 << 29) if quick else (1 << 31)) if cuda else ((1 << 26) if quick else (1 << 28))
    nbytes = max(nbytes, int(min_bytes))
    flops = measure_matmul_flops(device, dtype, size)
    by_method = {m: measure_bandwidth(device, nbytes, method=m) for m in BANDWIDTH_METHODS}
    best = max(by_method, key=by_method.get)
    name = describe_device(device)
    how = (f"{size}x{size} {dtype_name(dtype)} matmul; best of read (sum), copy and triad over "
           f"{nbytes / 2**20:.0f} MiB buffers ({best} was best)")
    return Peaks(name, dtype_name(dtype), flops, by_method[best], how, published_peaks(name) if cuda else None,
                 by_method)


def peaks_table(peaks: Peaks) -> str:
    """A small text table: measured peaks beside the data-sheet peaks of common GPUs, with their dtypes."""
    rows = [f"{'device':<30} {'TFLOP/s':>9} {'GB/s':>8}",
            f"{'this machine (measured, ' + peaks.dtype + ')':<30} {peaks.flops_per_s / 1e12:>9.3g} "
            f"{peaks.bytes_per_s / 1e9:>8.3g}"]
    if peaks.published:
        rows.append(f"{'this GPU (data sheet, ' + peaks.published[2] + ')':<30} {peaks.published[0] / 1e12:>9.3g} "
                    f"{peaks.published[1] / 1e9:>8.4g}")
    for name in ["T4", "L4", "A100", "H100", "H200"]:
        f, b, kind = PUBLISHED_PEAKS[name]
        label = {"A100": "A100-80GB", "H100": "H100 SXM"}.get(name, name)
        rows.append(f"{label + ' (data sheet, ' + kind + ')':<30} {f / 1e12:>9.3g} {b / 1e9:>8.4g}")
    return "\n".join(rows)


def measured_in_turns(runs: dict, device: torch.device | str = "cpu", dtype: torch.dtype | None = None, *,
                      nbytes: int | None = None, size: int | None = None, repeats: int = 5) -> tuple[dict, Peaks]:
    """Time `runs` ({name: fn}) in turns with the two peaks' own kernels, a square matmul of `size` and a sum over a
    float32 buffer of `nbytes` (time_interleaved: A, B, matmul, sum, A, B, ...), so that a claim that compares a run
    with a peak compares figures of the same moment. On a busy machine the load changes from one second to the next:
    a bandwidth measured at a quiet moment against a step timed at a loud one would read a share that neither had.
    Returns ({name: Timing} of the runs, Peaks from the quickest matmul and the quickest sum). Sizes default to those
    of measure_peaks (the sum's buffer: 256 MiB on a CPU, 2 GiB on a GPU; make it at least the run's bytes)."""
    from ..device import default_dtype
    from .timing import time_interleaved

    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    cuda = device.type == "cuda"
    size = size or (8192 if cuda else 1024)
    nbytes = nbytes or ((1 << 31) if cuda else (1 << 28))
    if "matmul" in runs or "sum" in runs:
        raise CourseError("Name the runs something other than 'matmul' and 'sum': those are the peaks' kernels.")
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    out = torch.empty(size, size, device=device, dtype=dtype)
    x = torch.ones(int(nbytes) // 4, device=device, dtype=torch.float32)
    timings = time_interleaved({**runs, "matmul": lambda: torch.mm(a, b, out=out), "sum": lambda: x.sum()}, device,
                               warmup=1, repeats=repeats)
    name = describe_device(device)
    peaks = Peaks(name, dtype_name(dtype), 2 * size ** 3 / timings["matmul"].min_s,
                  x.numel() * 4 / timings["sum"].min_s,
                  f"in turns with the run: a {size}x{size} {dtype_name(dtype)} matmul and a sum over "
                  f"{x.numel() * 4 / 2**20:,.0f} MiB, the quickest of {repeats} each",
                  published_peaks(name) if cuda else None)
    return {k: timings[k] for k in runs}, peaks
