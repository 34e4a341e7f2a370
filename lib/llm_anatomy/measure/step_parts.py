"""A step's parts, measured: its matrix products alone, and its ops on a time axis (C11, C20).

The three bounds of `overhead` are ideal floors: every byte at the streaming bandwidth, every FLOP at the peak, and
they overlap on a GPU, where the CPU queues kernels while the GPU runs earlier ones. On a CPU the same cores
dispatch each op and then run it, so the parts of a step add up: its matmuls' own time (their kernels attain a
bandwidth or FLOP/s of their own, often far below the peaks) plus its other ops' dispatch. `time_matmuls` measures
the first part, `serial_regime` names the regime from both, and `step_timeline` shows one step op by op.
Units: seconds, FLOP, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..device import synchronize
from ..errors import CourseError
from .overhead import UNEXPLAINED, _inside_aten
from .peaks import Peaks
from .timing import time_it


@dataclass
class MatmulPass:
    """One pass through every Linear layer of a model, alone, timed: the step's matrix products without the rest.

    timing: the passes' times (seconds; read min_s: another program can only add time);
    flops, weight_bytes: what one pass computes and reads (2 FLOPs per weight per row; each weight read once);
    linears: how many Linear layers it ran (each one op of the step's count).
    """

    timing: object
    flops: int
    weight_bytes: int
    linears: int

    @property
    def seconds(self) -> float:
        return self.timing.min_s

    @property
    def bytes_per_s(self) -> float:
        """The bandwidth the matmul kernels attained: the weights' bytes over the pass's time."""
        return self.weight_bytes / self.seconds

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds


def time_matmuls(model, tokens: int = 1, *, head_tokens: int = 1, repeats: int = 5) -> MatmulPass:
    """Time the model's Linear layers alone, in the model's order, on `tokens` rows of random numbers each (the LM
    head on `head_tokens` rows: generation keeps the logits of the last position only).

    It runs the whole pass each time, never one layer again and again: a small layer's weights would then stay in
    the CPU's cache and read far faster than a step reads them. `model` is a ScratchLlama (or any nn.Module whose
    Linear layers a step runs once each, with `lm_head` its head).
    """
    import torch.nn.functional as F
    from torch import nn

    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1 or head_tokens < 1:
        raise CourseError(f"Time the matmuls on at least one row: tokens = {tokens}, head_tokens = {head_tokens}.")
    head = getattr(model, "lm_head", None)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise CourseError("This model has no nn.Linear layers to time.")
    device, dtype = linears[0].weight.device, linears[0].weight.dtype
    inputs = {}
    for layer in linears:
        rows = head_tokens if layer is head else tokens
        inputs.setdefault((rows, layer.in_features), torch.randn(rows, layer.in_features, device=device, dtype=dtype))

    def one_pass():
        with torch.inference_mode():
            for layer in linears:
                F.linear(inputs[(head_tokens if layer is head else tokens, layer.in_features)], layer.weight, layer.bias)

    timing = time_it(one_pass, device, warmup=1, repeats=repeats)
    flops = sum(2 * layer.weight.numel() * (head_tokens if layer is head else tokens) for layer in linears)
    weight_bytes = sum(layer.weight.numel() * layer.weight.element_size() for layer in linears)
    return MatmulPass(timing, flops, weight_bytes, len(linears))


@dataclass
class SerialRegime:
    """What bounded a step whose parts run one after another (on a CPU the same cores dispatch each op and run it,
    so nothing overlaps): its matmuls' own time plus its other ops' dispatch.

    name: 'compute', 'memory' or 'overhead', or UNEXPLAINED when the step took more than `slack` times the parts;
    reason: one sentence with the figures that decided it;
    matmul_s, overhead_s: the two parts (seconds); parts_s their sum, the time the parts explain.
    """

    name: str
    reason: str
    matmul_s: float
    overhead_s: float

    @property
    def parts_s(self) -> float:
        return self.matmul_s + self.overhead_s


def serial_regime(matmuls: MatmulPass, other_ops: int, per_op_s: float, peaks: Peaks, measured_s: float,
                  slack: float = 1.5) -> SerialRegime:
    """The regime of a step on a CPU, where its parts add: the matmuls (timed alone, `matmuls`) and `other_ops`
    ops at `per_op_s` each. The larger part names the regime; when it is the matmuls, their own intensity against
    the ridge says which roof they sit under: a matrix-vector product (decode) reads 4 bytes per 2 FLOPs in fp32, so
    the bytes, at the bandwidth its kernel attains, are its limit (memory-bound); a prompt's matrix-matrix products
    reuse each weight for every row (compute-bound). The reason names the attained figure against the measured peak.
    """
    if other_ops < 0 or per_op_s < 0 or measured_s <= 0:
        raise CourseError(f"other_ops and per_op_s must be >= 0 and measured_s > 0, not {other_ops}, {per_op_s} and "
                          f"{measured_s}.")
    overhead_s = other_ops * per_op_s
    parts = matmuls.seconds + overhead_s
    kernel = (f"its {matmuls.linears} matmuls took {matmuls.seconds * 1e3:.1f} ms alone and the other {other_ops} ops "
              f"{overhead_s * 1e3:.1f} ms")
    if measured_s > slack * parts:
        return SerialRegime(UNEXPLAINED, f"{measured_s / parts:.1f}x what its parts add up to ({kernel})",
                            matmuls.seconds, overhead_s)
    if overhead_s >= matmuls.seconds:
        return SerialRegime("overhead", f"{kernel}: dispatching its ops costs more than its arithmetic and bytes",
                            matmuls.seconds, overhead_s)
    intensity = matmuls.flops / matmuls.weight_bytes
    if intensity >= peaks.ridge_intensity:
        return SerialRegime("compute", f"{kernel}; they ran at {matmuls.flops_per_s / 1e9:.1f} GFLOP/s, "
                                       f"{matmuls.flops_per_s / peaks.flops_per_s:.0%} of the matmul peak",
                            matmuls.seconds, overhead_s)
    return SerialRegime("memory", f"{kernel}; they read the weights at {matmuls.bytes_per_s / 1e9:.1f} GB/s, "
                                  f"{matmuls.bytes_per_s / peaks.bytes_per_s:.0%} of the streaming bandwidth",
                        matmuls.seconds, overhead_s)


# --------------------------------------------------------------------------- a step on a time axis


@dataclass(frozen=True)
class Span:
    """One op (on the CPU) or one kernel (on a GPU) of a profiled step: name, start and end in seconds from the
    step's first span."""

    name: str
    start_s: float
    end_s: float


def step_timeline(fn, device: torch.device | str = "cpu") -> dict[str, list[Span]]:
    """One call of `fn()` (after a warm-up call) under torch.profiler, as spans on a time axis.

    Returns {"cpu": the aten ops Python called, in order} and, on a GPU, {"gpu": the kernels that ran}. The gaps
    between spans are what the step spent outside ops (Python, the dispatcher) or, on a GPU, waiting for launches.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    cuda = device.type == "cuda"
    fn()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        fn()
        synchronize(device)
    events = list(prof.events())
    rows = {"cpu": [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")
                    and not _inside_aten(e)]}
    if cuda:
        rows["gpu"] = [e for e in events if e.device_type == DeviceType.CUDA]
    starts = [e.time_range.start for row in rows.values() for e in row]
    if not starts:
        raise CourseError("The step called no PyTorch op: pass the step itself, e.g. lambda: decode_step(...).")
    t0 = min(starts)
    return {kind: sorted((Span(e.name.removeprefix("aten::"), (e.time_range.start - t0) / 1e6,
                               (e.time_range.end - t0) / 1e6) for e in row), key=lambda s: s.start_s)
            for kind, row in rows.items()}


def busy_share(spans: list[Span]) -> float:
    """The share of the time from the first span's start to the last one's end that some span covers (0 to 1)."""
    if not spans:
        return 0.0
    covered, reach = 0.0, spans[0].start_s
    for span in sorted(spans, key=lambda s: s.start_s):
        if span.end_s > reach:
            covered += span.end_s - max(span.start_s, reach)
            reach = span.end_s
    total = max(s.end_s for s in spans) - min(s.start_s for s in spans)
    return covered / total if total > 0 else 1.0
