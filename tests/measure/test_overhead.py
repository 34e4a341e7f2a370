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


def test_a_decode_step_is_counted_op_by_op(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    cache = model.new_cache(1, 16)
    prefill(model, torch.tensor([[5, 6, 7]]), cache)
    token = torch.tensor([[8]])

    def step():
        cache.length = 3
        decode_step(model, token, cache)

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
    model = ScratchLlama.from_hf(tiny_model)
    cache = model.new_cache(1, 16)
    prefill(model, torch.tensor([[5, 6, 7]]), cache)

    def step():
        cache.length = 3
        decode_step(model, torch.tensor([[8]]), cache)

    per_op, ops = op_mix_cost_s(step, repeats=3)
    assert ops == count_step_ops(step).ops and 0 < per_op < 0.1  # seconds per op: far from a tenth of a second
    with pytest.raises(CourseError, match="no PyTorch op"):
        op_mix_cost_s(lambda: None)
