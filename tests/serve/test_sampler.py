"""The sampler: a request's own SamplingParams choose its token (greedy, seeded draws, penalties first, logprobs of
the penalized logits); bad parameters are refused with a clear message."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.penalties import Penalties
from llm_anatomy.generate.sampling import GREEDY, SamplingParams, sample_next, seeded_generator, token_logprobs
from llm_anatomy.serve.batching import Request
from llm_anatomy.serve.sampler import sample

LOGITS = torch.tensor([0.5, 3.0, 2.9, -1.0, 0.0])


def test_greedy_is_the_highest_logit_and_records_nothing():
    request = Request([1, 2], 4)
    assert request.params == SamplingParams(0.0, max_tokens=4) and request.params.greedy
    assert sample(request, LOGITS) == 1 and request.logprobs == [] and request.generator is None


def test_penalties_apply_before_the_choice_and_the_logprobs_are_the_penalized_ones():
    penalties = Penalties(repetition=2.0)
    request = Request([1, 4], 4, params=SamplingParams(0.0, repetition_penalty=2.0, top_logprobs=2))
    token = sample(request, LOGITS)  # token 1 was in the prompt: 3.0 / 2 = 1.5 falls below token 2's 2.9
    assert token == 2
    want = token_logprobs(penalties.apply(LOGITS, [1, 4], []), 2, 2)
    assert request.logprobs == [want] and want[1][0][0] == 2


def test_draws_come_from_the_requests_own_generator_seeded_by_its_params():
    hot = SamplingParams(temperature=1.5, seed=7)
    first, again, other = (Request([1], 20, params=SamplingParams(1.5, seed=seed)) for seed in (7, 7, 8))
    draws = {id(r): [sample(r, LOGITS) for _ in range(20)] for r in (first, again, other)}
    gen = seeded_generator(7)
    assert draws[id(first)] == [int(sample_next(LOGITS, hot, gen)[0]) for _ in range(20)]
    assert draws[id(first)] == draws[id(again)] and draws[id(first)] != draws[id(other)]
    assert first.generator is not None  # made at the first draw, carried on the request


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature="hot"), "temperature"), (dict(seed=1.5), "seed"), (dict(seed=True), "seed"),
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(top_logprobs=-1), "top_logprobs"),
    (dict(top_logprobs=True), "top_logprobs")])
def test_bad_parameters_are_refused(kwargs, message):
    with pytest.raises(CourseError, match=message):
        SamplingParams(**kwargs)


def test_penalties_all_off_are_no_penalties():
    assert SamplingParams(0.0, repetition_penalty=1.0).penalties is None
    request = Request([1, 4], 2, params=SamplingParams(0.0, top_logprobs=0))
    logits = LOGITS.to(torch.bfloat16)
    assert sample(request, logits) == 1 and request.logprobs == [token_logprobs(logits, 1, 0)]


def test_a_request_takes_only_sampling_params():
    with pytest.raises(CourseError, match="SamplingParams"):
        Request([1], 1, params={"temperature": 1.0})


def test_the_request_params_are_the_one_truth_of_its_length_and_stop():
    """max_new_tokens and eos_token_id, when given, go into the params; the readers read them back; fresh() keeps them."""
    request = Request([1, 4], 5, eos_token_id=3, params=SamplingParams(0.7, seed=4, stop_token_ids=[9]))
    assert request.params == SamplingParams(0.7, seed=4, max_tokens=5, stop_token_ids=(9, 3))
    assert (request.max_new_tokens, request.eos_token_id) == (5, 3)
    assert request.fresh().params == request.params and request.fresh().eos_token_id == 3
    assert Request([1], params=SamplingParams(max_tokens=7)).max_new_tokens == 7
    assert Request([1]).params == GREEDY  # notebook 08's request: greedy
    request.output = [5, 9]
    assert request.finish_reason == "stop" and request.done  # a stop id of its params
    request.output = [5, 6, 7, 8, 0]
    assert request.finish_reason == "length" and request.done
    request.output = [5]
    assert request.finish_reason is None and not request.done
    for bad, words in ((dict(max_new_tokens=0), "max_new_tokens"), (dict(eos_token_id=-1), "eos_token_id"),
                       (dict(params=SamplingParams(), max_new_tokens=2.5), "max_new_tokens")):
        with pytest.raises(CourseError, match=words):
            Request([1], **bad)
