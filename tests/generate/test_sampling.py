"""Sampling filters against transformers' logits warpers, and their edge cases."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.sampling import (GREEDY, SamplingParams, greedy, next_token_probs, sample_next,
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
    assert sample_next(logits, GREEDY)[0].dim() == 0
    ids, probs = sample_next(logits.repeat(3, 1), SamplingParams(1.0), seeded_generator(0))
    assert ids.shape == (3,) and probs.shape == (3, 4)


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
        assert t >= 1e-3 or probs.max(-1).values.tolist() == [1.0, 1.0]  # all on the best token, not NaN
    gen = seeded_generator(1)
    assert all(sample_next(logits, SamplingParams(1e-20), gen)[0].tolist() == [1, 0] for _ in range(20))


def test_high_temperature_flattens():
    logits = torch.tensor([0.0, 1.0, 2.0])
    spread = [next_token_probs(logits, t).max().item() for t in (0.5, 1.0, 2.0, 100.0)]
    assert spread == sorted(spread, reverse=True)
    assert spread[-1] == pytest.approx(1 / 3, abs=0.01)


def test_seeded_sampling_is_reproducible_and_follows_the_distribution():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    draws = lambda seed: [int(sample_next(logits, SamplingParams(), g)[0]) for g in [seeded_generator(seed)]
                          for _ in range(2000)]
    a, b, c = draws(7), draws(7), draws(8)
    assert a == b and a != c
    freq = torch.bincount(torch.tensor(a), minlength=3).float() / len(a)
    torch.testing.assert_close(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.04, rtol=0)
    assert set(int(sample_next(logits, SamplingParams(top_k=1), seeded_generator(s))[0]) for s in range(20)) == {0}


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
        SamplingParams(**kwargs)


def test_bad_shapes_and_seeds_are_refused():
    with pytest.raises(CourseError, match="logits"):
        next_token_probs(torch.zeros(2, 3, 4))
    with pytest.raises(CourseError, match="seed"):
        seeded_generator(1.5)


def test_params_describe_themselves():
    assert SamplingParams(0.0).describe() == "greedy"
    assert SamplingParams(0.7, 40, 0.9).describe() == "temperature 0.7, top-k 40, top-p 0.9"
    assert SamplingParams().describe() == "temperature 1"
    assert SamplingParams(0.0, repetition_penalty=1.3).describe() == "greedy, repetition 1.3"


def _assert_same_as_transformers(logits, temperature=1.0, top_k=None, top_p=1.0):
    ours = next_token_probs(logits, temperature, top_k, top_p)
    ref = _reference_probs(logits, temperature, top_k, top_p)
    setting = f"temperature={temperature}, top_k={top_k}, top_p={top_p!r}"
    assert torch.equal(ours > 0, ref > 0), f"a different set of tokens is kept ({setting})"
    gap = float((ours - ref).abs().max())
    assert gap <= 1e-6, f"probabilities differ by {gap:.3g} ({setting})"
    return ours


# The kept tokens add up to p itself (so the float32 sums land on p, or one ulp either side): the
# rounding decides, in either direction, whether the token at the edge is kept too.
EXACT_BOUNDARIES = [
    ([0.5, 0.3, 0.2], 0.8),  # 0.5 + 0.3 comes out as 0.80000001
    ([0.45, 0.35, 0.2], 0.8),  # 0.45 + 0.35 comes out as 0.79999995
    ([0.5, 0.3, 0.2], 0.5),  # transformers keeps one token (the old code kept two)
    ([0.45, 0.3, 0.2, 0.05], 0.75),  # transformers keeps two (the old code kept three)
    ([0.65, 0.3, 0.05], 0.65),  # transformers keeps two (the old code kept one)
    ([0.45, 0.4, 0.1, 0.05], 0.85),
    ([0.65, 0.25, 0.1], 0.9),
    ([0.5, 0.25, 0.125, 0.125], 0.75),
]


@pytest.mark.parametrize("probs, p", EXACT_BOUNDARIES)
def test_top_p_at_the_exact_boundary_matches_transformers(probs, p):
    logits = torch.log(torch.tensor([probs]))
    ranked = torch.softmax(logits[0], -1).sort(descending=True).values
    assert (ranked.double().cumsum(0) - p).abs().min() < 1e-6, "not a boundary case"
    _assert_same_as_transformers(logits, top_p=p)
    # the same tokens in another order, beside masked tokens, in a batch, and as a single row
    order = torch.randperm(len(probs), generator=torch.Generator().manual_seed(1))
    padded = torch.cat([logits[:, order], torch.full((1, 3), float("-inf"))], dim=-1)
    batch = torch.cat([padded, padded.flip(-1)])
    ours = _assert_same_as_transformers(batch, top_p=p)
    assert torch.equal(next_token_probs(padded[0], top_p=p), ours[0])


def test_top_p_with_equal_logits_is_exact():
    # four equal logits: every probability is exactly 0.25, so the sums are exact too
    logits = torch.zeros(1, 4)
    half = _assert_same_as_transformers(logits, top_p=0.5)
    assert sorted(half[0].tolist()) == [0.0, 0.0, 0.5, 0.5]  # 0.25 + 0.25 reaches 0.5: two tokens, no more
    assert (_assert_same_as_transformers(logits, top_p=0.75)[0] > 0).sum() == 3
    assert (_assert_same_as_transformers(logits, top_p=0.76)[0] > 0).sum() == 4
    assert (_assert_same_as_transformers(logits, top_p=0.25)[0] > 0).sum() == 1


def test_top_k_keeps_every_token_tied_with_the_kth():
    inf = float("inf")
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0], [5.0, 4.0, 3.0, 3.0, -inf]])
    expected = {1: [[1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]],
                2: [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]],
                3: [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]}
    for k, kept in expected.items():
        assert (next_token_probs(logits, top_k=k) > 0).int().tolist() == kept
        for temperature in (0.5, 1.0, 2.0):
            _assert_same_as_transformers(logits, temperature, k)
            for top_p in (0.3, 0.5, 0.7, 0.9):
                _assert_same_as_transformers(logits, temperature, k, top_p)


@pytest.mark.parametrize("probs, p", [
    ([0.25, 0.25, 0.25, 0.25], 0.5), ([0.4, 0.2, 0.2, 0.2], 0.5), ([0.4, 0.2, 0.2, 0.2], 0.6),
    ([0.7, 0.1, 0.1, 0.1], 0.8), ([0.3, 0.3, 0.2, 0.2], 0.5), ([0.3, 0.3, 0.2, 0.2], 0.7),
    ([0.5, 0.5], 0.5), ([0.2, 0.2, 0.2, 0.2, 0.2], 0.3),
])
def test_ties_at_the_top_p_boundary_match_transformers(probs, p):
    logits = torch.log(torch.tensor([probs]))
    for temperature in (1.0, 0.7):
        _assert_same_as_transformers(logits, temperature, top_p=p)
        _assert_same_as_transformers(logits.flip(-1), temperature, top_p=p)
        _assert_same_as_transformers(logits, temperature, top_k=2, top_p=p)


def test_many_ties_in_a_large_vocabulary_match_transformers():
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(4, 5000, generator=gen) * 2).round() / 2  # a few dozen distinct values
    for temperature in (0.6, 1.0, 1.4):
        for top_k in (None, 1, 7, 300):
            for top_p in (1.0, 0.05, 0.3, 0.5, 0.9):
                ours = _assert_same_as_transformers(logits, temperature, top_k, top_p)
                assert torch.equal(next_token_probs(logits[2], temperature, top_k, top_p), ours[2])


def _random_logits(kind, gen):
    if kind == "smooth":
        return torch.randn(4, 500, generator=gen) * float(torch.empty(()).uniform_(0.5, 8, generator=gen))
    if kind == "ties":
        return (torch.randn(4, 500, generator=gen) * 3).round()
    if kind == "masked":
        logits = torch.randn(4, 500, generator=gen) * 3
        masked = torch.rand(4, 500, generator=gen) < 0.7
        masked[:, 0] = False  # every row keeps a finite logit
        return logits.masked_fill(masked, float("-inf"))
    # peaked: a few tokens carry almost all the probability
    logits = torch.randn(4, 500, generator=gen)
    logits[:, :3] += 12
    return logits


@pytest.mark.parametrize("kind", ["smooth", "ties", "masked", "peaked"])
def test_random_logits_match_transformers_at_many_seeds_and_settings(kind):
    for seed in range(8):
        gen = torch.Generator().manual_seed(seed)
        logits = _random_logits(kind, gen)
        for temperature in (0.3, 1.0, 1.7):
            for top_k in (None, 1, 4, 50, 1000):
                for top_p in (1.0, 0.1, 0.6, 0.9, 0.995):
                    _assert_same_as_transformers(logits, temperature, top_k, top_p)
            # p set to a sum of the most likely probabilities themselves: boundary cases in bulk
            ranked = torch.softmax(logits / temperature, -1).sort(-1, descending=True).values
            for rank in (0, 1, 2, 5, 20):
                top_p = float(ranked[seed % 4, : rank + 1].sum())
                if top_p < 1.0:
                    _assert_same_as_transformers(logits, temperature, None, top_p)


def test_the_nucleus_is_the_fewest_tokens_reaching_p():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(8, 300, generator=gen) * 3
    full = torch.softmax(logits, -1).double()
    for top_p in (0.2, 0.5, 0.8, 0.95):
        kept = next_token_probs(logits, top_p=top_p) > 0
        mass = (full * kept).sum(-1)
        smallest_kept = full.masked_fill(~kept, 1.0).min(-1).values
        assert (mass >= top_p - 1e-6).all()  # the kept tokens reach p...
        assert (mass - smallest_kept < top_p + 1e-6).all()  # ...and without the least likely of them they do not


def test_masked_tokens_stay_allowed():
    inf = float("inf")
    logits = torch.tensor([[2.0, -inf, 1.0, -inf, 0.5], [-inf, -inf, 0.5, -inf, -inf]])
    for temperature, top_k, top_p in [(1.0, None, 1.0), (0.7, 2, 1.0), (1.3, None, 0.6), (1.0, 4, 0.99)]:
        probs = _assert_same_as_transformers(logits, temperature, top_k, top_p)
        assert (probs[logits == -inf] == 0).all()
    assert greedy(logits).tolist() == [0, 2]
    assert sample_next(logits, GREEDY)[0].tolist() == [0, 2]
    gen = seeded_generator(0)
    drawn = torch.stack([sample_next(logits, SamplingParams(1.5), gen)[0] for _ in range(200)])
    assert set(drawn[:, 0].tolist()) <= {0, 2, 4} and set(drawn[:, 1].tolist()) == {2}


_NAN, _INF = float("nan"), float("inf")


@pytest.mark.parametrize("row, cause", [
    ([0.5, _NAN, 1.0], "NaN"), ([_NAN] * 3, "NaN"), ([0.5, _INF, 1.0], r"\+inf"), ([_INF, -_INF, 1.0], r"\+inf"),
    ([-_INF] * 3, "Every logit is -inf: no token is allowed"), ([_NAN, _INF, -_INF], "NaN"),
])
@pytest.mark.parametrize("batched", [False, True])
def test_logits_that_overflowed_are_refused_before_drawing(row, cause, batched):
    logits = torch.tensor(row)
    if batched:  # one bad row among good ones
        logits = torch.stack([torch.tensor([1.0, 2.0, 3.0]), logits])
    bad = logits[-1] if batched else logits  # the penalties take one row
    calls = {
        "next_token_probs": lambda g: next_token_probs(logits, 0.7, 2, 0.9),
        "next_token_probs greedy": lambda g: next_token_probs(logits, 0.0),
        "sample_next": lambda g: sample_next(logits, SamplingParams(), g),
        "sample_next filtered": lambda g: sample_next(logits, SamplingParams(0.8, top_k=2, top_p=0.9), g),
        "sample_next greedy": lambda g: sample_next(logits, GREEDY, g),
        "sample_next penalized": lambda g: sample_next(bad, SamplingParams(0.7, 2, 0.9, presence_penalty=1.0),
                                                       g, prompt=[0], output=[1]),
        "sample_next penalized greedy": lambda g: sample_next(bad, SamplingParams(0.0, repetition_penalty=2.0),
                                                              g, prompt=[0], output=[]),
        "greedy": lambda g: greedy(logits),
    }
    for name, call in calls.items():
        gen = seeded_generator(3)
        before = gen.get_state().clone()
        with pytest.raises(CourseError, match=cause) as refused:
            call(gen)
        assert torch.equal(gen.get_state(), before), f"{name} advanced the generator"
        if cause != "Every logit is -inf: no token is allowed":
            assert "fp16" in str(refused.value) and "bf16" in str(refused.value)


def test_an_fp16_overflow_is_named():
    logits = torch.tensor([[70000.0, 1.0, 2.0]]).half()  # 70000 is beyond fp16's largest number: +inf
    with pytest.raises(CourseError, match=r"\+inf.*fp16"):
        sample_next(logits, SamplingParams(), seeded_generator(0))
    with pytest.raises(CourseError, match="NaN.*fp16"):
        sample_next(logits - logits, SamplingParams(), seeded_generator(0))  # inf - inf is NaN
    assert int(sample_next(torch.tensor([[60000.0, 1.0, 2.0]]).half(), GREEDY)[0][0]) == 0  # large but finite is fine


def test_the_generator_state_check_sees_a_draw():
    gen = seeded_generator(3)
    before = gen.get_state().clone()
    sample_next(torch.zeros(3), GREEDY, gen)
    sample_next(torch.zeros(3), SamplingParams(0.0, presence_penalty=1.0), gen, prompt=[], output=[1])
    assert torch.equal(gen.get_state(), before)  # greedy draws nothing
    sample_next(torch.zeros(3), SamplingParams(), gen)
    assert not torch.equal(gen.get_state(), before)  # a draw moves it, so the checks above can fail


@pytest.mark.parametrize("temperature, top_k, top_p, min_p", [
    (1.0, None, 1.0, 0.05), (0.7, None, 1.0, 0.1), (1.3, 40, 0.95, 0.05), (1.0, None, 0.9, 0.3), (1.0, None, 1.0, 1.0),
])
def test_min_p_matches_transformers_warper_after_the_others(temperature, top_k, top_p, min_p):
    from transformers.generation.logits_process import MinPLogitsWarper

    torch.manual_seed(1)
    logits = torch.randn(4, 500) * 3  # [batch, vocab]
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k is not None:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    warpers.append(MinPLogitsWarper(min_p))
    ref = torch.softmax(warpers(torch.zeros(4, 1, dtype=torch.long), logits.clone()), dim=-1)
    ours = next_token_probs(logits, temperature, top_k, top_p, min_p)
    assert torch.equal(ours > 0, ref > 0), "a different set of tokens is kept"
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-7)


def test_min_p_follows_the_models_confidence():
    confident = torch.tensor([5.0, 1.0, 0.9, 0.8])  # one token dominates: min-p keeps only it
    unsure = torch.tensor([1.0, 0.99, 0.98, -4.0])  # three nearly tied: min-p keeps all three
    assert (next_token_probs(confident, min_p=0.1) > 0).tolist() == [True, False, False, False]
    assert (next_token_probs(unsure, min_p=0.1) > 0).tolist() == [True, True, True, False]
    assert SamplingParams(min_p=0.05).describe() == "temperature 1, min-p 0.05"


@pytest.mark.parametrize("min_p", [-0.1, 1.5, math.nan, "a", True])
def test_bad_min_p_is_refused(min_p):
    with pytest.raises(CourseError, match="min_p"):
        next_token_probs(torch.zeros(5), min_p=min_p)


def test_logprobs_are_the_raw_distributions():
    from llm_anatomy.generate.sampling import token_logprobs

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    chosen, top = token_logprobs(logits, 1, top=2)
    expected = torch.log_softmax(logits, -1)
    assert chosen == pytest.approx(float(expected[1]))
    assert [i for i, _ in top] == [0, 1] and top[0][1] == pytest.approx(float(expected[0]))
    assert token_logprobs(logits, 3)[1] == []


# --------------------------------------------------------------------------- one SamplingParams, one sampler


@pytest.mark.parametrize("kwargs, words", [
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=math.nan), "frequency_penalty"), (dict(seed=1.5), "seed"), (dict(seed=True), "seed"),
    (dict(top_logprobs=-1), "top_logprobs"), (dict(top_logprobs=2.0), "top_logprobs"), (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=True), "max_tokens"), (dict(stop_token_ids=[1, -2]), "stop_token_ids"),
    (dict(stop_token_ids=7), "stop_token_ids"), (dict(stop=[""]), "stop"), (dict(stop=[3]), "stop"),
])
def test_every_field_of_the_params_is_checked(kwargs, words):
    with pytest.raises(CourseError, match=words):
        SamplingParams(**kwargs)


def test_params_hold_tuples_their_penalties_and_greedy():
    params = SamplingParams(stop_token_ids=[2, 7], stop=["\n\nUser:"])
    assert params.stop_token_ids == (2, 7) and params.stop == ("\n\nUser:",) and hash(params)  # frozen and hashable
    assert SamplingParams(stop="END").stop == ("END",)
    assert params.penalties is None and not params.greedy and GREEDY.greedy and GREEDY == SamplingParams(0.0)
    assert SamplingParams(presence_penalty=0.5).penalties.presence == 0.5


def test_the_one_sampler_applies_the_penalties_then_the_filters():
    from llm_anatomy.generate.penalties import Penalties

    logits = torch.tensor([3.0, 2.9, 1.0, 0.5, -1.0])
    params = SamplingParams(0.8, top_k=3, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.2)
    ids, probs = sample_next(logits, params, seeded_generator(0), prompt=[0], output=[1, 1])
    penalized = Penalties(2.0, 0.5, 0.2).apply(logits, [0], [1, 1])
    assert torch.equal(probs, next_token_probs(penalized, 0.8, 3))
    assert int(sample_next(logits, SamplingParams(0.0, repetition_penalty=2.0), prompt=[0], output=[])[0]) == 1
    assert int(sample_next(logits, GREEDY)[0]) == 0  # without the penalty the best: the penalty changed the choice
    with pytest.raises(CourseError, match="pass the prompt and output ids"):
        sample_next(logits, params)  # penalties that would silently count nothing are refused
    with pytest.raises(CourseError, match="one row"):
        sample_next(logits.repeat(2, 1), params, prompt=[0], output=[])
    with pytest.raises(CourseError, match="SamplingParams"):
        sample_next(logits, 0.7)
