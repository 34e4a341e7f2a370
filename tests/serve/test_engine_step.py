"""The scheduler's step as nano-vllm's LLMEngine.step (issue 45): schedule -> run -> sample -> post-process, returning
what the step did for each request; a failed step ends only its own requests; bounded logs and stats()."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.generate.decode import generate_greedy
from llm_anatomy.serve.batching import Request
from llm_anatomy.serve.paged_kv import PagedKVPool
from llm_anatomy.serve.scheduler import ContinuousScheduler


def _scheduler(model, blocks=64, block_size=4, **kwargs):
    return ContinuousScheduler(model, PagedKVPool.for_model(model, blocks, block_size), **kwargs)


def _greedy(model, prompt, n):
    return generate_greedy(model, torch.tensor([prompt]), n).tokens[0].tolist()


def test_each_step_returns_what_it_did_for_every_request_it_touched(tiny):
    sched = _scheduler(tiny, max_batch=2, max_batched_tokens=4)
    a, b, c = (sched.submit(Request(p, n)) for p, n in (([5, 9, 11, 3, 7, 2], 3), ([7, 8], 4), ([40, 2, 6], 2)))
    seen = {r.id: [] for r in (a, b, c)}
    finished, admitted = {}, []
    while sched.has_unfinished():
        outputs = sched.step()
        assert outputs, "a step with work to do returns its outputs"
        assert len({id(o.request) for o in outputs}) == len(outputs)  # one per request
        for out in outputs:
            seen[out.request.id] += out.new_tokens
            admitted += [out.request.id] if out.admitted else []
            assert len(out.new_tokens) <= 1  # one token per request per step at most
            if out.finished:
                assert out.request.id not in finished
                finished[out.request.id] = out.finish_reason
    assert sched.step() == []  # nothing left to do
    assert sorted(admitted) == [a.id, b.id, c.id]
    assert finished == {a.id: "length", b.id: "length", c.id: "length"}
    for r in (a, b, c):  # the outputs, put together, are the request's tokens: the course's greedy decoding
        assert seen[r.id] == r.output == _greedy(tiny, r.prompt, r.max_new_tokens)


def test_a_prompt_still_being_prefilled_has_no_token_yet(tiny):
    sched = _scheduler(tiny, max_batch=1, max_batched_tokens=2)
    r = sched.submit(Request([5, 9, 11, 3, 7], 2))
    first = sched.step()  # two of its five prompt tokens
    assert [(o.request, o.new_tokens, o.finished, o.admitted) for o in first] == [(r, [], False, True)]
    while sched.has_unfinished():
        sched.step()
    assert r.output == _greedy(tiny, [5, 9, 11, 3, 7], 2)


def test_an_end_token_finishes_a_request_with_reason_stop(tiny):
    free_run = _greedy(tiny, [5, 9, 11, 3], 6)
    sched = _scheduler(tiny)
    r = sched.submit(Request([5, 9, 11, 3], 6, eos_token_id=free_run[2]))
    outputs = []
    while sched.has_unfinished():
        outputs += sched.step()
    last = [o for o in outputs if o.finished]
    assert len(last) == 1 and last[0].finish_reason == "stop" and r.output == free_run[:free_run.index(free_run[2]) + 1]


def _failing_once(sched, when):
    """Make the runner's `when`-th call (0 = the first) raise, as a GPU that runs out of memory would."""
    run, calls = sched.runner.run, [0]

    def flaky(*args, **kwargs):
        calls[0] += 1
        if calls[0] - 1 == when:
            raise RuntimeError("CUDA out of memory (injected)")
        return run(*args, **kwargs)

    sched.runner.run = flaky


def test_a_failed_step_ends_only_its_own_requests_and_frees_their_blocks(tiny):
    # max_batch 2: the third request waits while the first two run; prefill_first keeps decodes out of prompt steps
    sched = _scheduler(tiny, blocks=32, block_size=4, max_batch=2, prefill_first=True)
    a, b = sched.submit(Request([5, 9, 11, 3], 5)), sched.submit(Request([7, 8, 1], 5))
    waiting = sched.submit(Request([40, 2, 6], 4))
    sched.step()  # both prompts
    _failing_once(sched, 0)
    outputs = sched.step()  # the decode step of a and b fails
    assert {o.request.id: o.finish_reason for o in outputs} == {a.id: "error", b.id: "error"}
    assert all(o.finished and "out of memory" in o.error for o in outputs)
    assert a.error and b.error and waiting.error is None and not waiting.cancelled
    assert sched.running_ids() == [] and list(sched.waiting) == [waiting]
    assert sched.pool.allocator.num_free == 32  # their blocks are back
    while sched.has_unfinished():  # the scheduler keeps serving: the waiting request is served as if alone
        sched.step()
    assert waiting.output == _greedy(tiny, [40, 2, 6], 4) and waiting.finish_reason == "length"
    assert sched.pool.allocator.num_free == 32
    assert [kind for _, kind, rid, _ in sched.events if rid in (a.id, b.id)].count("error") == 2


def test_a_failed_step_leaves_the_requests_that_were_not_in_it_untouched(tiny):
    # prefill_first: the step that runs the newcomer's prompt runs only that; the decoding request waits it out
    sched = _scheduler(tiny, blocks=32, block_size=4, max_batch=2, prefill_first=True)
    old = sched.submit(Request([5, 9, 11, 3], 5))
    sched.step()
    sched.step()
    new = sched.submit(Request([7, 8, 1], 3, arrival_s=sched.now))
    _failing_once(sched, 0)
    outputs = sched.step()
    assert [(o.request, o.finish_reason) for o in outputs] == [(new, "error")]
    while sched.has_unfinished():
        sched.step()
    assert old.output == _greedy(tiny, [5, 9, 11, 3], 5) and old.error is None
    assert sched.pool.allocator.num_free + sched.stats().blocks_cached == 32


def test_a_row_whose_token_cannot_be_drawn_ends_alone(tiny, monkeypatch):
    import llm_anatomy.serve.scheduler as scheduler_module

    sched = _scheduler(tiny, max_batch=2)
    bad, good = sched.submit(Request([5, 9, 11, 3], 4)), sched.submit(Request([7, 8, 1], 4))
    real = scheduler_module.sample

    def sample(request, logits):
        if request is bad and len(request.output) == 1:
            raise ValueError("The logits hold NaN (injected)")
        return real(request, logits)

    monkeypatch.setattr(scheduler_module, "sample", sample)
    outputs = []
    while sched.has_unfinished():
        outputs += sched.step()
    assert bad.error and len(bad.output) == 1 and [o.finish_reason for o in outputs if o.request is bad][-1] == "error"
    assert good.output == _greedy(tiny, [7, 8, 1], 4) and good.error is None


def test_stats_and_the_logs_stay_bounded(tiny):
    sched = _scheduler(tiny, blocks=12, block_size=4, max_batch=2, keep_log=5, prefix_cache=True)
    for i in range(6):
        sched.submit(Request([5, 9, 11, 3, 8, i + 3], 3))
    while sched.has_unfinished():
        sched.step()
    stats = sched.stats()
    assert stats.finished == 6 and stats.running == 0 and stats.waiting == 0 and stats.steps == sched.steps > 5
    assert len(sched.history) == len(sched.events) == len(sched.calls) == len(sched.finished) == 5
    assert stats.blocks_total == 12 and stats.blocks_used == 0
    assert stats.blocks_free + stats.blocks_cached == 12 and stats.prefix_query_tokens > 0
    assert stats.now_s == sched.now


def test_stats_count_preemptions(tiny):
    sched = _scheduler(tiny, blocks=6, block_size=4, max_batch=3)
    for p in ([5, 9, 11, 3, 8], [7, 8, 1, 2, 2], [4, 4, 4, 4, 4]):
        sched.submit(Request(p, 6))
    while sched.has_unfinished():
        sched.step()
    preempted = sum(r.preempted for r in sched.finished)
    assert preempted > 0 and sched.stats().preemptions == preempted
