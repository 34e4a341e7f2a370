"""Sampling filters against transformers' logits warpers, and their edge cases."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

from llm_anatomy.errors import CourseError
from llm_anatomy.sampling import (SamplingSettings, greedy, next_token_probs, sample_next, scale_by_temperature,
                                  seeded_generator)


def _reference_probs(logits, temperature=1.0, top_k=None, top_p=1.0):
    """transformers' warpers in generate()'s order: temperature, top-k, top-p; then softmax."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k is not None:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    scores = warpers(torch.zeros(logits.shape[0], 1, dtype=torch.long), logits.clone())
    return torch.softmax(scores, dim=-1)


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, None, 1.0), (0.7, None, 1.0), (1.5, None, 1.0), (1.0, 5, 1.0), (1.0, 1, 1.0), (0.8, 50, 1.0),
    (1.0, None, 0.9), (1.0, None, 0.5), (1.0, None, 0.01), (0.6, 20, 0.8), (1.3, 200, 0.95),
])
def test_filtered_probabilities_match_transformers(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(4, 500) * 3  # [batch, vocab]
    ours = next_token_probs(logits, temperature, top_k, top_p)
    ref = _reference_probs(logits, temperature, top_k, top_p)
    assert torch.equal(ours > 0, ref > 0), "a different set of tokens is kept"
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours.sum(-1), torch.ones(4))


def test_on_the_real_next_token_distribution(real):
    ids = real.tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = real.model(ids).logits[:, -1]  # [1, vocab]
    for temperature, top_k, top_p in [(0.7, 40, 0.9), (1.0, None, 0.95), (1.2, 10, 1.0)]:
        ours = next_token_probs(logits, temperature, top_k, top_p)
        ref = _reference_probs(logits, temperature, top_k, top_p)
        assert torch.equal(ours > 0, ref > 0)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-7)
    assert int(greedy(logits[0])) == int(logits[0].argmax()) == real.tokenizer(" Paris")["input_ids"][0]


def test_single_row_and_batch_shapes():
    logits = torch.tensor([1.0, 3.0, 2.0, -1.0])
    assert next_token_probs(logits).shape == (4,)
    assert int(greedy(logits)) == 1
    assert sample_next(logits, 0.0).dim() == 0
    assert sample_next(logits.repeat(3, 1), 1.0, generator=seeded_generator(0)).shape == (3,)


def test_top_k_keeps_the_k_best_and_top_p_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert (next_token_probs(logits, top_k=2) > 0).tolist() == [True, True, False, False]
    torch.testing.assert_close(next_token_probs(logits, top_k=2), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # 0.5 < 0.7, then 0.5 + 0.3 >= 0.7: the first two tokens make the nucleus
    assert (next_token_probs(logits, top_p=0.7) > 0).tolist() == [True, True, False, False]
    assert (next_token_probs(logits, top_p=0.4) > 0).tolist() == [True, False, False, False]
    assert (next_token_probs(logits, top_p=0.85) > 0).tolist() == [True, True, True, False]
    assert (next_token_probs(logits, top_k=100) > 0).all()


def test_temperature_zero_is_greedy_and_tiny_temperatures_stay_finite():
    logits = torch.tensor([[2.0, 5.0, 4.999, -3.0], [80.0, -80.0, 0.0, 79.0]])
    assert next_token_probs(logits, 0.0).tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]
    for t in (1e-3, 1e-8, 1e-30, 1e-45):
        probs = next_token_probs(logits, t)
        assert torch.isfinite(probs).all()
        assert probs.argmax(-1).tolist() == [1, 0]
        log_probs = scale_by_temperature(logits, t)
        assert not torch.isnan(log_probs).any() and (t >= 1e-3 or log_probs.max(-1).values.tolist() == [0.0, 0.0])
    gen = seeded_generator(1)
    assert all(sample_next(logits, 1e-20, generator=gen).tolist() == [1, 0] for _ in range(20))


def test_high_temperature_flattens():
    logits = torch.tensor([0.0, 1.0, 2.0])
    spread = [next_token_probs(logits, t).max().item() for t in (0.5, 1.0, 2.0, 100.0)]
    assert spread == sorted(spread, reverse=True)
    assert spread[-1] == pytest.approx(1 / 3, abs=0.01)


def test_seeded_sampling_is_reproducible_and_follows_the_distribution():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    draws = lambda seed: [int(sample_next(logits, generator=g)) for g in [seeded_generator(seed)] for _ in range(2000)]
    a, b, c = draws(7), draws(7), draws(8)
    assert a == b and a != c
    freq = torch.bincount(torch.tensor(a), minlength=3).float() / len(a)
    torch.testing.assert_close(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.04, rtol=0)
    assert set(int(sample_next(logits, top_k=1, generator=seeded_generator(s))) for s in range(20)) == {0}


@pytest.mark.parametrize("kwargs, words", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=math.nan), "temperature"),
    (dict(temperature=math.inf), "temperature"), (dict(temperature="hot"), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=math.nan), "top_p"),
    (dict(top_p=-0.2), "top_p"), (dict(top_k=0), "top_k"), (dict(top_k=-3), "top_k"),
    (dict(top_k=2.5), "top_k"), (dict(top_k=True), "top_k"),
])
def test_invalid_settings_are_refused_clearly(kwargs, words):
    logits = torch.zeros(10)
    with pytest.raises(CourseError, match=words):
        next_token_probs(logits, **kwargs)
    with pytest.raises(CourseError, match=words):
        sample_next(logits, **kwargs)
    with pytest.raises(CourseError, match=words):
        SamplingSettings(**kwargs)


def test_bad_shapes_and_seeds_are_refused():
    with pytest.raises(CourseError, match="logits"):
        next_token_probs(torch.zeros(2, 3, 4))
    with pytest.raises(CourseError, match="seed"):
        seeded_generator(1.5)


def test_settings_describe_themselves():
    assert SamplingSettings(0.0).describe() == "greedy"
    assert SamplingSettings(0.7, 40, 0.9).describe() == "temperature 0.7, top-k 40, top-p 0.9"
    assert SamplingSettings().describe() == "temperature 1"
