"""The pipeline's arithmetic (C23): stages cut the layers evenly, the calibrated schedule of equal stages idles
exactly (p - 1) / (m + p - 1), and a schedule that does not overlap its micro-batches fails the claim's evidence."""

from __future__ import annotations

import pytest
import torch
from llm_anatomy.weights.random import random_llama

from llm_anatomy.claims import ClaimFailed, claim
from llm_anatomy.distributed.pipeline import (bubble_fraction, check_stages, measured_bubble, pipeline_stage,
                                              schedule, schedule_bubble, stage_forward, stage_layers, timeline)
from llm_anatomy.distributed.tensor_parallel import state_dict_reader
from llm_anatomy.errors import CourseError
from llm_anatomy.model.scratch import ScratchLlama


def test_stages_cut_the_layers_evenly():
    cfg = ScratchLlama.from_hf(random_llama(num_hidden_layers=6)).cfg
    assert [list(stage_layers(cfg, s, 2)) for s in range(2)] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(CourseError, match=r"4 stages do not cut this model's 6 layers into equal parts: choose a "
                                          r"number of stages from \[1, 2, 3, 6\]\."):
        check_stages(cfg, 4)
    with pytest.raises(CourseError, match="whole number"):
        check_stages(cfg, 0)


def test_stages_in_one_process_give_the_plain_models_logits_bit_for_bit():
    plain = ScratchLlama.from_hf(random_llama(seed=5, num_hidden_layers=4))
    ids = torch.tensor([[3, 14, 15, 92, 65], [35, 89, 79, 32, 38]])
    read = state_dict_reader(plain)
    first, last = (pipeline_stage(read, plain.cfg, s, 2) for s in range(2))
    hidden = stage_forward(first, ids)  # [2, 5, hidden]: what stage 0 sends
    assert hidden.shape == (2, 5, plain.cfg.hidden_size)
    assert torch.equal(stage_forward(last, hidden), plain(ids))
    assert torch.equal(stage_forward(last, hidden, last_only=True), plain(ids, logits_to_keep=1))
    assert torch.equal(last.layers[0].mlp.up_proj.weight, plain.layers[2].mlp.up_proj.weight)  # layer 2 of 0-3


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("micro", [1, 2, 4, 8])
def test_equal_stages_idle_exactly_as_the_formula_says(stages, micro):
    equal = [[0.01] * micro for _ in range(stages)]
    assert schedule_bubble(equal) == pytest.approx(bubble_fraction(stages, micro))


def test_the_schedule_waits_for_the_stage_before():
    slots = schedule([[1.0, 1.0], [2.0, 2.0]])  # the second stage is twice as slow
    assert slots == [(0, 0, 0.0, 1.0), (0, 1, 1.0, 2.0), (1, 0, 1.0, 3.0), (1, 1, 3.0, 5.0)]


def test_the_measured_bubble_reads_a_ranks_segments():
    first = [("compute", 0, 1.0), ("compute", 1, 1.0)]
    second = [("wait", 0, 1.0), ("compute", 0, 1.0), ("wait", 1, 0.0), ("compute", 1, 1.0)]
    assert measured_bubble([first, second]) == pytest.approx(1 / 3) == pytest.approx(bubble_fraction(2, 2))
    assert timeline(second)[1] == ("compute", 0, 1.0, 2.0)


def test_a_pipeline_that_does_not_overlap_breaks_the_claims_evidence():
    """C23's cell asserts that micro-batches shrink the bubble: if stage 0 waited for stage 1 to finish each
    micro-batch before starting the next (no overlap), the bubble would stay at a half and the claim fails."""
    serial_first = [("compute", 0, 1.0), ("wait", 0, 1.0), ("compute", 1, 1.0), ("wait", 1, 1.0)]
    serial_second = [("wait", 0, 1.0), ("compute", 0, 1.0), ("wait", 1, 1.0), ("compute", 1, 1.0)]
    one = measured_bubble([[("compute", 0, 2.0)], [("wait", 0, 2.0), ("compute", 0, 2.0)]])
    two = measured_bubble([serial_first, serial_second])
    with pytest.raises(ClaimFailed):
        claim("C23", two < one - 0.05, f"bubble with 1 micro-batch {one:.0%}, with 2 {two:.0%}")


@pytest.mark.parametrize("tied", [True, False])
def test_a_middle_stage_holds_no_vocabulary_matrix_and_three_stages_give_the_plain_logits(tied):
    """As picotron builds a stage: what it does not run is an nn.Identity, and the model's own forward runs it."""
    plain = ScratchLlama.from_hf(random_llama(seed=7, num_hidden_layers=3, tie_word_embeddings=tied))
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    read = state_dict_reader(plain)
    stages = [pipeline_stage(read, plain.cfg, s, 3) for s in range(3)]
    middle = dict(stages[1].named_parameters())
    assert not any(name.startswith(("embed_tokens", "lm_head", "norm.")) for name in middle), sorted(middle)
    assert isinstance(stages[1].embed_tokens, torch.nn.Identity) and isinstance(stages[0].lm_head, torch.nn.Identity)
    x = ids
    for stage in stages:
        x = stage_forward(stage, x)
    assert torch.equal(x, plain(ids))
    assert torch.equal(stages[2].lm_head.weight, plain.lm_head.weight)  # the tied matrix read for the last stage
