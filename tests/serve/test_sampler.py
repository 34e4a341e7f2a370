"""The sampler: a request's own SamplingParams choose its token (greedy, seeded draws, penalties first, logprobs of
the penalized logits); bad parameters are refused with a clear message."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.penalties import Penalties
from llm_anatomy.generate.sampling import SamplingSettings, sample_with, seeded_generator, token_logprobs
from llm_anatomy.serve.batching import Request
from llm_anatomy.serve.sampler import SamplingParams, sample

LOGITS = torch.tensor([0.5, 3.0, 2.9, -1.0, 0.0])


def test_greedy_is_the_highest_logit_and_records_nothing():
    request = Request([1, 2], 4)
    assert request.params == SamplingParams() and request.params.greedy
    assert sample(request, LOGITS) == 1 and request.logprobs == [] and request.generator is None


def test_penalties_apply_before_the_choice_and_the_logprobs_are_the_penalized_ones():
    penalties = Penalties(repetition=2.0)
    request = Request([1, 4], 4, params=SamplingParams(penalties=penalties, top_logprobs=2))
    token = sample(request, LOGITS)  # token 1 was in the prompt: 3.0 / 2 = 1.5 falls below token 2's 2.9
    assert token == 2
    want = token_logprobs(penalties.apply(LOGITS, [1, 4], []), 2, 2)
    assert request.logprobs == [want] and want[1][0][0] == 2


def test_draws_come_from_the_requests_own_generator_seeded_by_its_params():
    hot = SamplingSettings(temperature=1.5)
    first, again, other = (Request([1], 20, params=SamplingParams(hot, seed)) for seed in (7, 7, 8))
    draws = {id(r): [sample(r, LOGITS) for _ in range(20)] for r in (first, again, other)}
    gen = seeded_generator(7)
    assert draws[id(first)] == [int(sample_with(LOGITS, hot, gen)[0]) for _ in range(20)]
    assert draws[id(first)] == draws[id(again)] and draws[id(first)] != draws[id(other)]
    assert first.generator is not None  # made at the first draw, carried on the request


@pytest.mark.parametrize("kwargs, message", [
    (dict(settings={"temperature": 1.0}), "settings must be a SamplingSettings"), (dict(seed=1.5), "seed"), (dict(seed=True), "seed"),
    (dict(penalties=2.0), "Penalties"), (dict(top_logprobs=-1), "top_logprobs"), (dict(top_logprobs=True), "top_logprobs")])
def test_bad_parameters_are_refused(kwargs, message):
    with pytest.raises(CourseError, match=message):
        SamplingParams(**kwargs)


def test_penalties_all_off_are_no_penalties():
    assert SamplingParams(penalties=Penalties()) == SamplingParams() and SamplingParams(penalties=Penalties()).greedy
    request = Request([1, 4], 2, params=SamplingParams(penalties=Penalties(), top_logprobs=0))
    logits = LOGITS.to(torch.bfloat16)
    assert sample(request, logits) == 1 and request.logprobs == [token_logprobs(logits, 1, 0)]


def test_a_request_takes_only_sampling_params():
    with pytest.raises(CourseError, match="SamplingParams"):
        Request([1], 1, params={"temperature": 1.0})
