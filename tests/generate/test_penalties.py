"""Penalties: repetition against transformers' processor; presence and frequency against the OpenAI API's formula."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.penalties import apply_penalties


@pytest.mark.parametrize("penalty", [1.3, 0.8, 2.0])
def test_repetition_penalty_matches_transformers(penalty):
    torch.manual_seed(0)
    logits = torch.randn(300) * 4  # [vocab], both signs
    seen = [3, 17, 17, 250, 3, 99]
    ref = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([seen]), logits.clone().unsqueeze(0))[0]
    torch.testing.assert_close(apply_penalties(logits, seen, repetition=penalty), ref)


def test_presence_and_frequency_follow_the_openai_formula():
    logits = torch.zeros(6)
    seen = [1, 1, 1, 4]
    out = apply_penalties(logits, seen, presence=0.5, frequency=0.25)
    # logit - presence * [count > 0] - frequency * count, token by token
    assert out.tolist() == [0.0, -0.5 - 0.75, 0.0, 0.0, -0.5 - 0.25, 0.0]


def test_no_penalty_and_nothing_seen_change_nothing():
    logits = torch.randn(50)
    assert torch.equal(apply_penalties(logits, [1, 2, 3]), logits)
    assert torch.equal(apply_penalties(logits, [], repetition=1.5, presence=1.0), logits)


def test_a_repeated_token_becomes_less_likely_on_the_real_model(real):
    ids = real.tokenizer("the the the the the", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = real.model(ids).logits[0, -1]
    the = int(ids[0, -1])
    before = torch.softmax(logits, -1)[the]
    after = torch.softmax(apply_penalties(logits, ids[0].tolist(), repetition=1.3, frequency=0.5), -1)[the]
    assert after < before / 2, (float(before), float(after))


@pytest.mark.parametrize("kwargs, words", [
    (dict(repetition=0.0), "repetition_penalty"), (dict(repetition=math.inf), "repetition_penalty"),
    (dict(presence=2.5), "presence_penalty"), (dict(frequency=-3), "frequency_penalty"),
    (dict(frequency=math.nan), "frequency_penalty"), (dict(presence="high"), "presence_penalty"),
])
def test_bad_penalties_are_refused(kwargs, words):
    with pytest.raises(CourseError, match=words):
        apply_penalties(torch.zeros(5), [1], **kwargs)


def test_ids_outside_the_vocabulary_and_batches_are_refused():
    with pytest.raises(CourseError, match="outside the vocabulary"):
        apply_penalties(torch.zeros(5), [7], repetition=1.2)
    with pytest.raises(CourseError, match="one row"):
        apply_penalties(torch.zeros(2, 5), [1], repetition=1.2)


def test_the_penalties_setting_counts_the_prompt_for_repetition_and_only_the_output_for_presence_and_frequency():
    from llm_anatomy.generate.penalties import Penalties

    logits = torch.ones(8)
    prompt, output = [1, 2], [2, 5, 5]
    out = Penalties(repetition=2.0, presence=0.5, frequency=0.25).apply(logits, prompt, output)
    # token 1: the prompt only -> repetition only; 2: both -> all three; 5: the output twice; 0: unseen
    assert out.tolist() == [1.0, 0.5, 0.5 - 0.5 - 0.25, 1.0, 1.0, 0.5 - 0.5 - 0.5, 1.0, 1.0]
    assert torch.equal(Penalties().apply(logits, prompt, output), logits) and not Penalties().active
    assert Penalties(presence=0.5).describe() == "presence 0.5" and Penalties().describe() == "no penalties"
    with pytest.raises(CourseError, match="presence_penalty"):
        Penalties(presence=3.0)
