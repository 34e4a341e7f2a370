"""Static batching and the Request (C13, C15): a left-padded rectangle, the same tokens as one at a time; a request's
ask and outcome, its latencies as measure/timing.py defines them."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.serve.batching import Request, run_static
from llm_anatomy.generate.decode import generate_greedy
from llm_anatomy.errors import CourseError


def test_a_request_records_its_times_and_knows_when_it_is_done():
    r = Request(torch.tensor([[5, 6, 7]]), 3, arrival_s=1.0, eos_token_id=9)
    assert r.prompt == [5, 6, 7] and not r.done
    r.output, r.token_times = [4, 9], [1.5, 1.7]
    assert r.done  # the end-of-sequence token stops it before max_new_tokens
    assert r.ttft_s == pytest.approx(0.5) and r.mean_token_gap_s == pytest.approx(0.2)
    assert r.inter_token_gaps_s == pytest.approx([0.2]) and r.end_to_end_s == pytest.approx(0.7)
    again = r.fresh()
    assert again.output == [] and again.token_times == [] and again.prompt == r.prompt and again.arrival_s == 1.0
    assert again.tokens == [5, 6, 7] and r.tokens == [5, 6, 7, 4, 9]
    one = Request([5], 1)
    one.output, one.token_times = [3], [0.25]
    assert one.mean_token_gap_s == 0.0 and one.ttft_s == 0.25
    with pytest.raises(CourseError, match="no token yet"):
        Request([5], 1).ttft_s
    import numpy as np

    assert Request(np.array([3, 4]).tolist() + [np.int64(5)], 1).prompt == [3, 4, 5]
    with pytest.raises(CourseError):
        Request([5, 6], 2, arrival_s=float("nan"))
    with pytest.raises(CourseError):
        Request([5, True], 2)


def test_static_batches_run_to_their_longest_and_stop_on_eos(tiny):
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    alone = [generate_greedy(tiny, torch.tensor([p]), 6).tokens[0].tolist() for p in prompts]
    eos = alone[1][1]  # the second request's second token ends it early
    reqs = [Request(p, 6, eos_token_id=eos) for p in prompts]
    out = run_static(tiny, reqs, max_batch=3, cost=lambda tokens, rows, **_: 1.0)
    for r, a in zip(out, alone):
        cut = a[:a.index(eos) + 1] if eos in a else a
        assert r.output == cut
    assert out[1].finished_s == alone[1].index(eos) + 1.0  # one second per call: the prefill gives token 1
    assert out[1].released_s == max(r.finished_s for r in out)
    assert all(r.spans == [(i, 0.0, r.released_s)] for i, r in enumerate(out))
    assert reqs[0].output == []  # the requests given are not changed: fresh copies are served


def test_static_batching_waits_for_arrivals_and_takes_max_batch_at_a_time(tiny):
    reqs = [Request([5 + i, 6], 2, arrival_s=t) for i, t in enumerate([0.0, 0.0, 0.0, 10.0])]
    out = run_static(tiny, reqs, max_batch=2, cost=lambda tokens, rows, **_: 1.0)
    assert [r.admitted_s for r in out] == [0.0, 0.0, 2.0, 10.0]  # two, then the third, then idle until 10 s
    assert [r.spans[0][0] for r in out] == [0, 1, 0, 0]  # the slot each one held
    assert [r.spans for r in out][2] == [(0, 2.0, 4.0)]


def test_static_batching_refuses_a_bad_request_before_serving_any(tiny):
    good = Request([5, 6], 2)
    for bad, words in (("nope", "Submit a Request"), (Request([5] * 1020, 10), "context"), (Request([999], 1), "vocab")):
        with pytest.raises(CourseError, match=words):
            run_static(tiny, [good, bad])
    assert good.output == [] and good.token_times == []


def test_static_batching_picks_each_token_by_the_requests_own_params(tiny):
    """Bug 2: run_static took the argmax whatever a request asked. A request's draws come from its own generator, so
    static batching gives seeded sampled requests exactly the tokens the continuous scheduler gives them (penalties
    and logprobs included); greedy requests keep their greedy tokens."""
    from llm_anatomy.generate.sampling import SamplingParams
    from llm_anatomy.serve.paged_kv import PagedKVPool
    from llm_anatomy.serve.scheduler import ContinuousScheduler

    hot, cool = dict(temperature=1.5), dict(temperature=0.8, top_k=20, top_p=0.9)
    reqs = [Request([5, 9, 11, 3], 10, params=SamplingParams(**hot, seed=1)), Request([7, 8], 10),  # greedy
            Request([5, 9, 11, 3], 8, params=SamplingParams(**hot, seed=2)),
            Request([40, 2, 6], 9, params=SamplingParams(**cool, seed=1, repetition_penalty=1.3, presence_penalty=0.5,
                                                         top_logprobs=2))]
    static = run_static(tiny, reqs, max_batch=4)
    continuous = ContinuousScheduler(tiny, PagedKVPool.for_model(tiny, 64, 4), max_batch=4).run(reqs)
    assert [r.output for r in static] == [r.output for r in continuous]
    greedy = [generate_greedy(tiny, torch.tensor([r.prompt]), r.max_new_tokens).tokens[0].tolist() for r in reqs]
    assert static[1].output == greedy[1]
    assert static[0].output != greedy[0] and static[0].output[:8] != static[2].output  # sampled, each by its seed
    flat = lambda r: [(lp, *(x for pair in top for x in pair)) for lp, top in r.logprobs]  # logprob, id, lp, id, lp
    assert len(static[3].logprobs) == 9 and all(a == pytest.approx(b, abs=1e-4)
                                                for a, b in zip(flat(static[3]), flat(continuous[3])))
    assert static[0].logprobs == []  # only the request that asked
