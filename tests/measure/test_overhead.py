"""Counting a step's ops, the cost of one op, and the three regimes (compute-, memory-, overhead-bound)."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.generate.decode import decode_step, prefill
from llm_anatomy.errors import CourseError
from llm_anatomy.measure.peaks import Peaks
from llm_anatomy.measure.roofline import Work
from llm_anatomy.measure.overhead import (count_ops, count_step_ops, dispatch_cost_s, op_mix_cost_s, regime,
                                         regime_times)
from llm_anatomy.model.scratch import ScratchLlama

PEAKS = Peaks("test", "fp32", flops_per_s=1e11, bytes_per_s=1e10, how="by hand")  # ridge at 10 FLOP/byte


def _decode_step_of(hf_model):
    """A ScratchLlama of `hf_model` and one repeatable decode step of it (the cache rewound to 3 positions)."""
    model = ScratchLlama.from_hf(hf_model)
    cache = model.new_cache(1, 16)
    prefill(model, torch.tensor([[5, 6, 7]]), cache)
    token = torch.tensor([[8]])

    def step():
        cache.length = 3
        decode_step(model, token, cache)
    return model, step


def test_a_decode_step_is_counted_op_by_op(tiny_model):
    model, step = _decode_step_of(tiny_model)

    ops = count_step_ops(step)
    layers = model.cfg.num_layers
    assert ops.by_name["linear"] == 7 * layers + 1  # q, k, v, o, gate, up, down per layer, and the LM head
    assert ops.ops == sum(ops.by_name.values()) > 20 * layers
    assert ops.launches == ops.kernels == 0 and ops.kernel_s == 0.0  # a CPU launches no kernels
    assert count_step_ops(step).ops == ops.ops  # the same step, the same count
    with pytest.raises(CourseError, match="no PyTorch op"):
        count_step_ops(lambda: None)


@pytest.mark.parametrize("mode", [torch.enable_grad, torch.no_grad, torch.inference_mode])
def test_the_count_is_what_python_calls_in_every_autograd_mode(tiny_model, mode):
    # One counter for every caller (fused.py's count_ops is gone): it counts the ops Python called, so linear is one
    # op in every mode. A TorchDispatchMode counter, the old fused.count_ops, sat below autograd: outside
    # inference_mode it saw each linear as t + mm (and reshape, softmax, chunk as their parts), so one forward of this
    # model counted 218 ops there and 169 under inference_mode.
    model = ScratchLlama.from_hf(tiny_model)
    cache = model.new_cache(1, 16)
    prefill(model, torch.tensor([[5, 6, 7]]), cache)

    def forward():
        cache.length = 3
        model(torch.tensor([[8]]), cache=cache)

    with torch.inference_mode():
        reference = count_ops(forward)
    with mode():
        counted = count_ops(forward)
        step = count_step_ops(forward)
    assert counted == reference == step.by_name  # the same ops, one by one, whatever the mode
    assert counted["linear"] == 7 * model.cfg.num_layers + 1 and counted["mm"] == counted["t"] == 0
    assert step.ops == sum(counted.values())


def test_one_op_costs_microseconds_not_milliseconds():
    seconds = dispatch_cost_s("cpu", calls=200)
    assert 1e-8 < seconds < 1e-3


def test_the_largest_bound_names_the_regime():
    bounds = regime_times(Work(flops=2e9, bytes=1e7), ops=1000, peaks=PEAKS, per_op_s=5e-6)
    assert bounds == pytest.approx({"compute": 0.02, "memory": 0.001, "overhead": 0.005})
    assert regime(bounds) == "compute"
    assert regime(regime_times(Work(2e8, 5e8), 1000, PEAKS, 5e-6)) == "memory"  # 0.002 s, 0.05 s, 0.005 s
    assert regime(regime_times(Work(1e5, 1e5), 1000, PEAKS, 5e-6)) == "overhead"  # a tiny step


def test_a_step_far_above_every_bound_is_unexplained():
    bounds = regime_times(Work(2e8, 5e8), 1000, PEAKS, 5e-6)  # memory 0.05 s is the largest
    assert regime(bounds, measured_s=0.06) == "memory"  # within the slack: the bound explains it
    assert regime(bounds, measured_s=0.2) == "unexplained"  # 4x the largest bound
    assert regime(bounds, measured_s=0.2, slack=5) == "memory"
    with pytest.raises(CourseError, match=">= 0"):
        regime_times(Work(1, 1), -1, PEAKS, 1e-6)


def test_the_op_mix_cost_is_a_real_step_over_its_op_count(tiny_model):
    model, step = _decode_step_of(tiny_model)

    per_op, ops = op_mix_cost_s(step, repeats=3)
    assert ops == count_step_ops(step).ops and 0 < per_op < 0.1  # seconds per op: far from a tenth of a second
    with pytest.raises(CourseError, match="no PyTorch op"):
        op_mix_cost_s(lambda: None)


# --------------------------------------------------------------------------- the parts of a step on a CPU


def test_the_matmul_pass_runs_each_layer_as_the_step_called_it(tiny_model):
    from llm_anatomy.fast.fused import fuse
    from llm_anatomy.fast.packed import PackedProjection, pack
    from llm_anatomy.measure.step_parts import time_matmuls

    model = ScratchLlama.from_hf(tiny_model)
    cfg = model.cfg
    cache = model.new_cache(1, 16)
    ids = torch.tensor([[5, 6, 7, 9, 11]])

    def prompt(m=model):
        cache.reset()
        prefill(m, ids, cache)  # 5 rows through every block, the LM head on the last one

    def step(m=model):
        cache.length = 5
        decode_step(m, torch.tensor([[8]]), cache)

    prompt()
    one, five = time_matmuls(model, step, repeats=2), time_matmuls(model, prompt, repeats=2)
    assert one.linears == five.linears == 7 * cfg.num_layers + 1
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    head = model.lm_head.weight.numel()
    assert one.weight_bytes == 4 * weights and five.weight_bytes == one.weight_bytes  # fp32, each weight read once
    assert one.flops == 2 * weights and five.flops == 2 * (5 * (weights - head) + head)  # the head on one row
    assert len(one.timing.times_s) == 2 and one.seconds == min(one.timing.times_s) > 0
    assert one.bytes_per_s == pytest.approx(one.weight_bytes / one.seconds)
    fused = fuse(model, "in_out")  # 4 projections a layer, stored [in, out]: the same FLOPs and bytes
    fused_pass = time_matmuls(fused, lambda: step(fused), repeats=1)
    assert fused_pass.linears == 4 * cfg.num_layers + 1 and fused_pass.flops == one.flops
    assert fused_pass.weight_bytes == one.weight_bytes
    packed = pack(model, "int8")  # codes and a bf16 scale a row: about a quarter of the bytes
    packed_cache = packed.new_cache(1, 16)
    prefill(packed, ids, packed_cache)
    packed_pass = time_matmuls(packed, lambda: decode_step(packed, torch.tensor([[8]]), packed_cache), repeats=1)
    layers = [m for m in packed.modules() if isinstance(m, PackedProjection)]
    assert packed_pass.weight_bytes == sum(m.nbytes for m in layers) < 0.3 * one.weight_bytes
    # the rest of the step: timed with every matmul layer answering at once, then the layers are as they were
    assert 0 < one.rest_s and len(one.rest.times_s) == 2
    assert all("forward" not in vars(m) for m in model.modules())  # no instance attribute left behind
    with torch.no_grad():
        assert torch.equal(model(ids), ScratchLlama.from_hf(tiny_model)(ids))  # the model computes as before
    with pytest.raises(CourseError, match="none of the model's matmul layers"):
        time_matmuls(model, lambda: None)
    with pytest.raises(CourseError, match="no matmul layers"):
        time_matmuls(torch.nn.ReLU(), lambda: None)


def _matmuls(seconds, flops, weight_bytes, linears=211, rest_s=None):
    from llm_anatomy.measure.step_parts import MatmulPass
    from llm_anatomy.measure.timing import Timing

    rest = None if rest_s is None else Timing([rest_s, rest_s * 1.2], warmup=1)
    return MatmulPass(Timing([seconds, seconds * 1.1], warmup=1), flops, weight_bytes, linears, rest)


def test_on_a_cpu_the_parts_add_and_the_larger_names_the_regime():
    from llm_anatomy.measure.step_parts import serial_regime

    decode = _matmuls(0.05, flops=2.7e8, weight_bytes=5.4e8)  # 0.5 FLOP/byte, left of the ridge (10)
    memory = serial_regime(decode, other_ops=2000, per_op_s=5e-6, peaks=PEAKS, measured_s=0.065)
    assert memory.name == "memory" and memory.parts_s == pytest.approx(0.06)  # 50 ms + 2000 x 5 µs
    assert "10.8 GB/s" in memory.reason and "108% of the streaming bandwidth" in memory.reason  # 5.4e8 B / 50 ms
    # the same step where each op costs 40 µs: 80 ms of dispatch against 50 of matmuls
    assert serial_regime(decode, 2000, 4e-5, PEAKS, 0.14).name == "overhead"
    prompt = _matmuls(0.3, flops=4.3e10, weight_bytes=5.4e8)  # 80 FLOP/byte: right of the ridge
    compute = serial_regime(prompt, 2000, 5e-6, PEAKS, 0.35)
    assert compute.name == "compute" and "143.3 GFLOP/s" in compute.reason and "143% of the matmul peak" in compute.reason
    # a step the parts do not explain: more than 1.5x what they add up to (the largest bound alone is not the test)
    far = serial_regime(decode, 2000, 5e-6, PEAKS, 0.1)
    assert far.name == "unexplained" and far.reason.startswith("1.7x what its parts add up to")
    assert serial_regime(decode, 2000, 5e-6, PEAKS, 0.1, slack=2).name == "memory"
    with pytest.raises(CourseError, match=">= 0"):
        serial_regime(decode, -1, 5e-6, PEAKS, 0.1)


def test_the_measured_rest_of_the_step_replaces_the_dispatch_estimate():
    from llm_anatomy.measure.step_parts import serial_regime

    # a prompt whose rest (attention, norms over 160 rows) is real work: 100 ms, where dispatch alone is 10
    prompt = _matmuls(0.25, flops=4.3e10, weight_bytes=5.4e8, rest_s=0.1)
    verdict = serial_regime(prompt, 2000, 5e-6, PEAKS, measured_s=0.42)
    assert verdict.name == "compute" and verdict.parts_s == pytest.approx(0.35) and "rest of the step 100.0 ms" in verdict.reason
    assert serial_regime(_matmuls(0.25, 4.3e10, 5.4e8), 2000, 5e-6, PEAKS, 0.42).name == "unexplained"  # 1.6x 0.26 s
    # the rest outweighs the matmuls: overhead where dispatch accounts for it, else not explained
    tiny = _matmuls(1e-4, flops=1e5, weight_bytes=2e5, linears=15, rest_s=8e-4)
    assert serial_regime(tiny, 154, 5e-6, PEAKS, 9e-4).name == "overhead"  # 154 x 5 µs = 0.77 ms of 0.8
    heavy = serial_regime(_matmuls(0.01, 1e8, 2e8, rest_s=0.05), 100, 5e-6, PEAKS, 0.06)  # 50 ms against 0.5 of dispatch
    assert heavy.name == "unexplained" and "does not account for it" in heavy.reason


def test_the_timeline_is_the_steps_ops_in_order(tiny_model):
    from llm_anatomy.measure.step_parts import Span, busy_share, step_timeline

    model, step = _decode_step_of(tiny_model)

    rows = step_timeline(step)
    spans = rows["cpu"]
    assert list(rows) == ["cpu"]  # a CPU has no kernels row
    assert len(spans) == count_step_ops(step).ops
    assert [s.name for s in spans].count("linear") == 7 * model.cfg.num_layers + 1
    assert spans[0].start_s == 0.0 and all(a.start_s <= b.start_s for a, b in zip(spans, spans[1:]))
    assert all(s.end_s >= s.start_s for s in spans) and 0 < busy_share(spans) <= 1
    # busy_share counts overlaps once and gaps not at all
    assert busy_share([Span("a", 0, 2), Span("b", 1, 3), Span("c", 5, 6)]) == pytest.approx(4 / 6)
    assert busy_share([]) == 0.0
    with pytest.raises(CourseError, match="no PyTorch op"):
        step_timeline(lambda: None)


def test_the_quickest_timelines_take_turns_and_keep_each_steps_shortest_call(tiny_model, monkeypatch):
    from llm_anatomy.measure import step_parts
    from llm_anatomy.measure.step_parts import Span, quickest_timelines

    lengths = {"a": iter([0.3, 0.1, 0.2]), "b": iter([0.5, 0.6, 0.4])}
    order = []

    def fake_timeline(step, device="cpu"):  # each call profiles one step; its span is the next of its lengths
        name = step()
        order.append(name)
        return {"cpu": [Span("linear", 0.0, next(lengths[name]))]}

    monkeypatch.setattr(step_parts, "step_timeline", fake_timeline)
    found = quickest_timelines({"a": lambda: "a", "b": lambda: "b"}, repeats=3)
    assert order == ["a", "b"] * 3  # in turns
    assert found["a"][0]["cpu"][0].end_s == 0.1 and found["b"][0]["cpu"][0].end_s == 0.4  # the quickest of each
    assert found["a"][1].times_s == [0.3, 0.1, 0.2] and found["a"][1].noisy  # the spans' spread, to warn beside
    with pytest.raises(CourseError, match="at least once"):
        quickest_timelines({"a": lambda: "a"}, repeats=0)
