"""A step's parts, measured: its matrix products alone, and its ops on a time axis (C11, C20).

The three bounds of `overhead` are ideal floors: every byte at the streaming bandwidth, every FLOP at the peak, and
they overlap on a GPU, where the CPU queues kernels while the GPU runs earlier ones. On a CPU the same cores
dispatch each op and then run it, so the parts of a step add up: its matmuls' own time (their kernels attain a
bandwidth or FLOP/s of their own, often far below the peaks) plus the rest of the step. `time_matmuls` times both
parts, `serial_regime` names the regime from them, and `step_timeline` shows one step op by op.
Units: seconds, FLOP, bytes.
"""

from __future__ import annotations

import itertools
from collections import Counter
import math
from dataclasses import dataclass

import torch

from ..errors import CourseError
from .overhead import UNEXPLAINED, profiled_events, python_ops
from .peaks import Peaks
from .timing import time_it


@dataclass
class MatmulPass:
    """A step's matrix products timed alone, and the rest of the step timed without them.

    timing: the passes through the matmuls alone (seconds; read min_s: another program can only add time);
    rest: the step run with every matmul layer answering at once (a ready tensor of its output's shape), so the
        rest of the step, its other ops' dispatch and their own work (norms, attention, the cache), timed alone;
    flops, weight_bytes: what one pass computes and reads (2 FLOPs per weight per row; each weight read once);
    linears: how many matmul calls it made (each one op of the step's count).
    """

    timing: object
    flops: int
    weight_bytes: int
    linears: int
    rest: object = None

    @property
    def rest_s(self) -> float:
        return self.rest.min_s

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


def _matmul_layers(model) -> list:
    """The layers that multiply by a weight matrix: leaf modules with `out_features` (nn.Linear, and notebook 09's
    fused and packed projections)."""
    return [m for m in model.modules() if hasattr(m, "out_features") and next(m.children(), None) is None]


def _layer_bytes(layer) -> int:
    return sum(t.numel() * t.element_size() for t in [*layer.parameters(), *layer.buffers()])


def layer_calls(layers, step) -> list[tuple]:
    """(layer, its input, its output) for every call of one of `layers` during one call of `step()`, in order (read
    with a forward hook on each, removed after)."""
    calls = []
    hooks = [layer.register_forward_hook(lambda layer, args, out: calls.append((layer, args[0], out)))
             for layer in layers]
    try:
        step()
    finally:
        for hook in hooks:
            hook.remove()
    return calls


def time_matmuls(model, step, *, repeats: int = 5) -> MatmulPass:
    """Time the matmuls of one call of `step()` alone: the model's matmul layers, in the order the step called
    them, on random inputs of the shapes it gave them (read once, with a hook on each layer, from one call of
    `step`); and the rest of the step alone: `step()` again with each matmul layer answering at once. The shapes carry what the step does: a prompt's rows, one row a sequence in decode, the LM head on the
    last position only.

    The timed pass runs them all, never one layer again and again: a small layer's weights would then stay in the
    CPU's cache and read far faster than a step reads them. Bytes are each layer's weights as it holds them (fp32, or
    packed codes with their scales), read once per call.
    """
    layers = _matmul_layers(model)
    if not layers:
        raise CourseError("This model has no matmul layers (nn.Linear or a projection with out_features) to time.")
    calls = [(layer, x.shape, x.dtype, out) for layer, x, out in layer_calls(layers, step)]
    if not calls:
        raise CourseError("The step called none of the model's matmul layers: pass the model's own step.")
    device = next(itertools.chain(calls[0][0].parameters(), calls[0][0].buffers())).device
    inputs = {}
    for _, shape, dtype, _ in calls:
        inputs.setdefault((shape, dtype), torch.randn(shape, device=device).to(dtype))

    def one_pass():
        with torch.inference_mode():
            for layer, shape, dtype, _ in calls:
                layer(inputs[(shape, dtype)])

    answers = {layer: torch.zeros_like(out) for layer, _, _, out in calls}  # one ready output per layer

    def without_matmuls():
        for layer, ready in answers.items():
            layer.forward = lambda *args, ready=ready: ready  # an instance attribute: the class's forward is untouched
        try:
            step()
        finally:
            for layer in answers:
                del layer.forward

    timing = time_it(one_pass, device, warmup=1, repeats=repeats)
    rest = time_it(without_matmuls, device, warmup=1, repeats=repeats)
    flops = sum(2 * math.prod(shape) * layer.out_features for layer, shape, _, _ in calls)
    return MatmulPass(timing, flops, sum(_layer_bytes(layer) for layer, _, _, _ in calls), len(calls), rest)


@dataclass
class SerialRegime:
    """What bounded a step whose parts run one after another (on a CPU the same cores dispatch each op and run it,
    so nothing overlaps): its matmuls' own time plus the rest of the step.

    name: 'compute', 'memory' or 'overhead', or UNEXPLAINED when the step took more than `slack` times the parts;
    reason: one sentence with the figures that decided it;
    matmul_s, rest_s: the two parts (seconds); parts_s their sum, the time the parts explain.
    """

    name: str
    reason: str
    matmul_s: float
    rest_s: float

    @property
    def parts_s(self) -> float:
        return self.matmul_s + self.rest_s


def serial_regime(matmuls: MatmulPass, other_ops: int, per_op_s: float, peaks: Peaks, measured_s: float,
                  slack: float = 1.5) -> SerialRegime:
    """The regime of a step on a CPU, where its parts add: its matmuls timed alone, and the rest of the step
    (`matmuls.rest`, timed without the matmuls; where it was not timed, the dispatch of its `other_ops` ops at
    `per_op_s` each stands in). The larger part names the regime. When it is the matmuls, their own intensity
    against the ridge says which roof they sit under: a matrix-vector product (decode) reads 4 bytes per 2 FLOPs in
    fp32, so the bytes, at the bandwidth its kernel attains, are its limit (memory-bound); a prompt's matrix-matrix
    products reuse each weight for every row (compute-bound). When it is the rest, the step is overhead-bound if the
    dispatch of its ops accounts for the rest (within `slack`). The reason names the figures that decided it.
    """
    if other_ops < 0 or per_op_s < 0 or measured_s <= 0:
        raise CourseError(f"other_ops and per_op_s must be >= 0 and measured_s > 0, not {other_ops}, {per_op_s} and "
                          f"{measured_s}.")
    dispatch_s = other_ops * per_op_s
    rest_s = dispatch_s if matmuls.rest is None else matmuls.rest_s
    parts = matmuls.seconds + rest_s
    kernel = (f"its {matmuls.linears} matmuls took {matmuls.seconds * 1e3:.1f} ms alone and the rest of the step "
              f"{rest_s * 1e3:.1f} ms (its other {other_ops} ops' dispatch: {dispatch_s * 1e3:.1f} ms)")

    def verdict(name, why=""):
        return SerialRegime(name, kernel + why, matmuls.seconds, rest_s)

    if measured_s > slack * parts:
        return SerialRegime(UNEXPLAINED, f"{measured_s / parts:.1f}x what its parts add up to ({kernel})",
                            matmuls.seconds, rest_s)
    if rest_s >= matmuls.seconds:
        if rest_s <= slack * dispatch_s:
            return verdict("overhead", ": dispatching its ops costs more than its arithmetic and bytes")
        return verdict(UNEXPLAINED, ": the rest outweighs the matmuls, and the ops' dispatch does not account for it")
    if matmuls.flops / matmuls.weight_bytes >= peaks.ridge_intensity:
        return verdict("compute", f"; they ran at {matmuls.flops_per_s / 1e9:.1f} GFLOP/s, "
                                  f"{matmuls.flops_per_s / peaks.flops_per_s:.0%} of the matmul peak")
    return verdict("memory", f"; they read the weights at {matmuls.bytes_per_s / 1e9:.1f} GB/s, "
                             f"{matmuls.bytes_per_s / peaks.bytes_per_s:.0%} of the streaming bandwidth")


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

    device = torch.device(device)
    fn()  # warm-up; profiled_events synchronizes before it starts the profiler
    events = profiled_events(fn, device)
    rows = {"cpu": python_ops(events)}
    if device.type == "cuda":
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


def quickest_timelines(steps: dict, device: torch.device | str = "cpu", repeats: int = 3) -> dict:
    """step_timeline of every step of `steps` ({name: step}), `repeats` times in turns (A, B, C, A, B, C, ...),
    keeping each one's quickest call: on a busy machine another program can only add time, and taking turns makes a
    busy moment slow them all alike. Returns {name: (rows, Timing of the profiled calls' spans)}; print the Timing's
    noise_warning() beside a picture drawn from them."""
    from .timing import Timing

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise CourseError(f"Profile each step at least once: repeats = {repeats!r}.")
    runs = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            rows = step_timeline(step, device)
            runs[name].append((max(s.end_s for row in rows.values() for s in row), rows))
    return {name: (min(found, key=lambda run: run[0])[1], Timing([span for span, _ in found], warmup=1))
            for name, found in runs.items()}


# --------------------------------------------------------------------------- a step's time, split by kind of op

SPLIT_MATMULS = ("aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int4pack_mm", "aten::_weight_int8pack_mm",
                 "aten::linear", "aten::mm", "aten::addmm", "aten::matmul")
SPLIT_CASTS = ("aten::to", "aten::_to_copy", "aten::type_as")
SPLIT_ATTENTION = ("aten::scaled_dot_product_attention",  # eager; a compiled graph calls the CPU kernel itself
                   "aten::_scaled_dot_product_flash_attention_for_cpu")


def step_split(step, steps: int = 5, device: torch.device | str = "cpu") -> dict:
    """Where `steps` calls of `step()` spend their time, per step, from torch.profiler (after one warm-up call):
    the matmuls (the packed kernels, and any plain linear), the dtype casts around them (aten::to), attention (SDPA),
    and the rest: the other aten ops, and the time between ops (Python, the dispatcher). Also `ops`, the aten ops
    Python called per step: each is one trip through the dispatcher, what a compiled step would take away;
    `names`, a Counter of those ops' names over the `steps` steps.

    The parts come from the profiler's spans (between_ops: the gaps between one op's end and the next one's start);
    step_s is the wall time of the calls, clocked apart (under the profiler, which slows each op a little), so that
    the parts adding up to it checks the split: an op counted twice would make them exceed it. Seconds per step.
    """
    from ..device import timed

    device = torch.device(device)
    step()  # warm-up
    wall = {}

    def run():
        wall["s"] = timed(lambda: [step() for _ in range(steps)], device)[0]

    ops = python_ops(profiled_events(run, device))
    if not ops:
        raise CourseError("The step called no aten ops under the profiler: pass a function that runs one step.")
    parts = dict.fromkeys(("matmuls", "casts", "attention", "other_ops"), 0.0)
    for op in ops:
        kind = ("matmuls" if op.name in SPLIT_MATMULS else "casts" if op.name in SPLIT_CASTS
                else "attention" if op.name in SPLIT_ATTENTION else "other_ops")
        parts[kind] += (op.time_range.end - op.time_range.start) / 1e6
    spans = sorted((op.time_range.start, op.time_range.end) for op in ops)
    busy, (lo, hi) = 0.0, spans[0]
    for start, end in spans[1:]:  # the union of the ops' spans: top-level ops do not overlap, but be safe
        if start > hi:
            busy, lo, hi = busy + hi - lo, start, end
        else:
            hi = max(hi, end)
    busy += hi - lo
    between = (max(end for _, end in spans) - spans[0][0] - busy) / 1e6
    split = {name: seconds / steps for name, seconds in parts.items()}
    split["between_ops"] = between / steps
    split["rest"] = split["other_ops"] + split["between_ops"]
    named = ("matmuls", "casts", "attention", "rest")
    split.update(step_s=wall["s"] / steps, ops=round(len(ops) / steps), steps=steps,  # fractions of the four parts' sum
                 names=Counter(op.name for op in ops),  # each op's calls over the `steps` steps
                 fractions={name: split[name] / sum(split[n] for n in named) for name in named})
    return split


def format_split(split: dict) -> list[str]:
    """step_split's figures as two lines of a table (ms per step, and each part's share of the four)."""
    names = ("matmuls", "casts", "attention", "rest")
    return [f"{split.get('model', 'the')} decode step, profiled over {split['steps']} steps: {split['step_s'] * 1e3:.1f} ms "
            f"a step, {split['ops']} aten ops",
            "  " + ", ".join(f"{n} {split[n] * 1e3:.2f} ms ({split['fractions'][n]:.0%})" for n in names)
            + f"; the rest: other ops {split['other_ops'] * 1e3:.2f} ms + between ops {split['between_ops'] * 1e3:.2f} ms"]
