"""What a server needs of the continuous-batching scheduler (notebook 11): each request's own sampling settings and
seed, its logprobs, and cancel(), whose blocks are free before the next step."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.decode import decode_step, generate_greedy, prefill
from llm_anatomy.generate.sampling import SamplingParams, sample_next, seeded_generator, token_logprobs
from llm_anatomy.serve.batching import Request
from llm_anatomy.serve.paged_kv import PagedKVPool
from llm_anatomy.serve.scheduler import ContinuousScheduler


def _scheduler(model, blocks=64, block_size=4, **kwargs):
    return ContinuousScheduler(model, PagedKVPool.for_model(model, blocks, block_size), **kwargs)


def _sampled_alone(model, prompt, n, params):
    """The reference: the course's one decoding loop, each token drawn by sample_next from a generator of params.seed."""
    cache, gen, out = model.new_cache(1, len(prompt) + n), seeded_generator(params.seed), []
    logits = prefill(model, torch.tensor([prompt]), cache).logits[0, -1]
    for _ in range(n):
        out.append(int(sample_next(logits, params, gen)[0]))
        logits = decode_step(model, torch.tensor([[out[-1]]]), cache).logits[0, -1]
    return out


def test_each_request_samples_with_its_own_settings_and_seed_whatever_the_batch(tiny):
    hot = dict(temperature=1.5)
    cool = dict(temperature=0.7, top_k=20, top_p=0.9)
    requests = [Request([5, 9, 11, 3], 12, params=SamplingParams(**hot, seed=1)), Request([7, 8], 12),  # greedy
                Request([5, 9, 11, 3], 12, params=SamplingParams(**hot, seed=2)),
                Request([40, 2, 6], 9, params=SamplingParams(**cool, seed=1))]
    together = _scheduler(tiny, max_batch=4, max_batched_tokens=3).run(requests)
    alone = [_scheduler(tiny, max_batch=1).run([r])[0] for r in requests]
    assert [r.output for r in together] == [r.output for r in alone]  # a request's draws are its own
    assert together[0].output == _sampled_alone(tiny, requests[0].prompt, 12, requests[0].params)
    assert together[3].output == _sampled_alone(tiny, requests[3].prompt, 9, requests[3].params)
    assert together[1].output == generate_greedy(tiny, torch.tensor([[7, 8]]), 12).tokens[0].tolist()
    assert together[0].output != together[2].output  # another seed, other draws
    assert requests[0].fresh().params == SamplingParams(**hot, seed=1, max_tokens=12)


def test_logprobs_are_recorded_for_the_requests_that_ask(tiny):
    asked, plain = Request([3, 4, 5], 4, params=SamplingParams(0.0, top_logprobs=3)), Request([3, 4, 5], 4)
    out = _scheduler(tiny, max_batch=2).run([asked, plain])
    assert out[1].logprobs == [] and len(out[0].logprobs) == 4
    cache = tiny.new_cache(1, 8)
    logits = prefill(tiny, torch.tensor([[3, 4, 5]]), cache).logits[0, -1]
    first, top = out[0].logprobs[0]
    want_first, want_top = token_logprobs(logits, out[0].output[0], 3)
    assert first == pytest.approx(want_first, abs=1e-5) and [i for i, _ in top] == [i for i, _ in want_top]
    assert top[0][0] == out[0].output[0]  # greedy: the chosen token is the most likely one
    with pytest.raises(CourseError, match="top_logprobs"):
        SamplingParams(top_logprobs=-1)
    with pytest.raises(CourseError, match="temperature"):
        SamplingParams({"temperature": 1.0})


def test_a_cancelled_request_hands_its_blocks_back_before_the_next_step(tiny):
    sched = _scheduler(tiny, blocks=16, block_size=4, max_batch=2)
    long = sched.submit(Request(list(range(3, 15)), 20))
    other = sched.submit(Request([7, 8, 9], 6))
    waiting = sched.submit(Request([4, 4], 3))
    for _ in range(3):
        sched.step()
    held = len(sched.admission_of(long).blocks)
    free = sched.pool.allocator.num_free
    assert sched.cancel(long.id) is long and long.cancelled and not long.done
    assert sched.pool.allocator.num_free == free + held  # free now, before any step
    assert sched.admission_of(long) is None and long.spans[-1][2] == sched.now
    assert sched.cancel(long.id) is None  # once only
    while sched.step():
        pass
    assert other.output == generate_greedy(tiny, torch.tensor([[7, 8, 9]]), 6).tokens[0].tolist()
    assert waiting.done and long not in sched.finished and sched.pool.allocator.num_free == 16
    assert ("cancel", long.id) in [(kind, rid) for _, kind, rid, _ in sched.events]


def test_a_waiting_request_can_be_cancelled_and_a_finished_one_is_not(tiny):
    sched = _scheduler(tiny, max_batch=1)
    first, second = sched.submit(Request([3, 4], 2)), sched.submit(Request([5, 6], 2))
    assert sched.cancel(second.id) is second and second.cancelled and list(sched.waiting) == [first]
    while sched.step():
        pass
    assert sched.cancel(first.id) is None and not first.cancelled and second.output == []
    assert sched.cancel(999) is None
