"""Continuous batching (claim C15): the same greedy tokens as one request at a time, transformers' `generate` and its
`generate_batch`; admission, chunked prefill, preemption by recompute, and bad input refused without a change."""

from __future__ import annotations

import math

import pytest
import torch

from llm_anatomy.serve.batching import Request, run_static
from llm_anatomy.generate.decode import generate_greedy
from llm_anatomy.errors import CourseError
from llm_anatomy.serve.metrics import transformers_generate_batch
from llm_anatomy.serve.paged_kv import PagedKVPool
from llm_anatomy.serve.scheduler import ContinuousScheduler, admit

COST = lambda tokens, rows, **_: 0.01 + 0.001 * tokens  # noqa: E731  a clock that does not depend on the machine


def _alone(model, requests):
    return [generate_greedy(model, torch.tensor([r.prompt]), r.max_new_tokens).tokens[0].tolist() for r in requests]


def _scheduler(model, blocks=64, block_size=4, **kwargs):
    return ContinuousScheduler(model, PagedKVPool.for_model(model, blocks, block_size), **kwargs)


# --------------------------------------------------------------------------- the same tokens, whatever the schedule


@pytest.mark.parametrize("max_batch, budget, block_size", [(1, None, 4), (4, None, 4), (4, 3, 4), (6, 1, 1),
                                                           (3, 16, 16)])
def test_continuous_batching_gives_each_request_its_own_greedy_tokens(tiny, trace, max_batch, budget, block_size):
    sched = _scheduler(tiny, 64, block_size, max_batch=max_batch, max_batched_tokens=budget)
    out = sched.run(trace)
    assert [r.output for r in out] == _alone(tiny, trace)
    assert [r.id for r in out] == list(range(len(trace)))  # in the order given
    assert all(r.done and r.finished_s is not None and len(r.token_times) == len(r.output) for r in out)
    assert sched.pool.allocator.num_free == sched.pool.num_blocks  # every block is back
    assert not sched.running and not sched.waiting and len(sched.finished) == len(trace)
    assert max(len(entry[1]) for entry in sched.history) <= max_batch


def test_static_batching_gives_the_same_tokens_and_keeps_finished_rows(tiny, trace):
    out = run_static(tiny, trace, max_batch=4, cost=COST)
    assert [r.output for r in out] == _alone(tiny, trace)
    assert all(r.released_s >= r.finished_s for r in out)
    assert any(r.released_s > r.finished_s for r in out)  # a short request waited for its batch's longest
    for r in out:
        assert r.token_times == sorted(r.token_times) and r.token_times[0] >= r.arrival_s


# --------------------------------------------------------------------------- the schedule itself


def test_admit_is_first_come_first_served_within_slots_and_blocks():
    assert admit([0.0, 0.0, 0.0], [1, 1, 1], running=0, free_blocks=9, max_batch=8, now=0.0) == 3
    assert admit([0.0, 0.5, 3.0], [1, 1, 1], 0, 9, 8, now=1.0) == 2  # the third has not arrived
    assert admit([0.0, 0.0, 0.0], [1, 1, 1], 3, 9, 4, 0.0) == 1  # one slot left
    assert admit([0.0, 0.0, 0.0], [3, 3, 3], 0, 7, 8, 0.0) == 2  # blocks for two prompts
    assert admit([0.0, 0.0, 0.0], [2, 9, 1], 0, 5, 8, 0.0) == 1  # the big one waits, and nobody overtakes it
    assert admit([], [], 0, 5, 8, 0.0) == 0


def test_short_requests_do_not_wait_for_a_long_one(tiny):
    long = Request([5, 6, 7], 40, arrival_s=0.0)
    shorts = [Request([8 + i, 9], 2, arrival_s=0.05 + 0.01 * i) for i in range(3)]
    cont = _scheduler(tiny, max_batch=4, cost=COST).run([long] + shorts)
    static = run_static(tiny, [long] + shorts, max_batch=4, cost=COST)
    assert all(r.finished_s < cont[0].finished_s for r in cont[1:])  # they joined mid-flight and left early
    assert all(r.ttft_s > static_long_end - r.arrival_s - 1e-9 for r, static_long_end in
               zip(static[1:], [static[0].released_s] * 3))  # static: they waited for the whole long batch
    assert max(r.ttft_s for r in cont[1:]) < min(r.ttft_s for r in static[1:])


def test_chunked_prefill_caps_each_iteration_and_smooths_the_decoders_gaps(tiny):
    decoders = [Request([10 + i, 11, 12], 30, arrival_s=0.0) for i in range(3)]
    long_prompt = Request([3 + i % 120 for i in range(150)], 2, arrival_s=0.08)
    gaps, ttft = {}, {}
    for budget in (None, 16):
        sched = _scheduler(tiny, 128, 4, max_batch=4, max_batched_tokens=budget, cost=COST)
        out = sched.run(decoders + [long_prompt])
        assert [r.output for r in out] == _alone(tiny, decoders + [long_prompt])
        if budget is not None:  # no call carries more than the budget (prompt chunks get what decodes leave)
            assert max(c.tokens for c in sched.calls) <= budget
        gaps[budget] = max(b - a for r in out[:3] for a, b in zip(r.token_times, r.token_times[1:]))
        ttft[budget] = out[3].ttft_s
    assert gaps[16] < gaps[None] / 3  # the long prefill no longer stalls the decoders for one long iteration
    assert ttft[16] > ttft[None]  # the price: the long prompt's own first token comes later


@pytest.mark.parametrize("budget, flatten", [(None, False), (3, False), (None, True), (5, True)])
def test_prefill_first_runs_prompts_alone_and_gives_a_new_request_its_first_token_sooner(tiny, trace, budget, flatten):
    sched = _scheduler(tiny, 64, 4, max_batch=4, max_batched_tokens=budget, cost=COST, flatten=flatten,
                       prefill_first=True)
    assert [r.output for r in sched.run(trace)] == _alone(tiny, trace)
    if not flatten:  # no iteration has a decode call beside a prompt call: each prompt's iteration is its own
        per_step = {}
        for c in sched.calls:
            per_step.setdefault(c.start_s, []).append(c.kind)
        assert all(kinds in (["decode"], ["prefill"]) for kinds in per_step.values())
    # one long decoder and a request arriving while it decodes: its first token comes after its prompt's call only
    ttft, gaps = {}, {}
    for first in (False, True):
        old, new = Request([5, 6, 7], 30, arrival_s=0.0), Request([3 + i for i in range(12)], 2, arrival_s=0.1)
        out = _scheduler(tiny, 64, 4, max_batch=4, cost=COST, flatten=flatten, prefill_first=first).run([old, new])
        ttft[first] = out[1].ttft_s
        gaps[first] = max(b - a for a, b in zip(out[0].token_times, out[0].token_times[1:]))
    assert ttft[True] < ttft[False]  # the decode call it no longer waits for
    assert gaps[True] >= gaps[False] - 1e-9  # the price: the decoder waits a prompt's iteration before its next token


def test_preemption_by_recompute_never_loses_a_produced_token(tiny, trace):
    sched = _scheduler(tiny, 8, 4, max_batch=6, cost=COST)  # 8 blocks of 4: too few for everyone at once
    reqs = [sched.submit(r.fresh()) for r in trace]
    seen = {r.id: [] for r in reqs}
    while sched.step():
        for r in reqs:
            assert r.output[:len(seen[r.id])] == seen[r.id], "a produced token was lost"
            seen[r.id] = list(r.output)
        held = [b for a in sched.running for b in a.blocks]
        assert len(held) == len(set(held)) <= 8  # no block in two tables (no prefix cache here)
    assert sum(r.preempted for r in reqs) > 0
    assert [r.output for r in reqs] == _alone(tiny, trace)


@pytest.mark.parametrize("max_batch, budget, blocks", [(6, None, 8), (4, 3, 8), (3, 2, 8)])
def test_every_span_runs_from_an_admission_to_a_retirement_or_preemption(tiny, trace, max_batch, budget, blocks):
    # The Gantt chart draws Request.spans: a request must not be drawn in a slot while it waited. (The bug this
    # guards against: a preempted request's next span began at its preemption, not at its readmission; request 10
    # of this trace, with 8 blocks of 4, was drawn in slot 0 for 88 ms before it was readmitted.)
    sched = _scheduler(tiny, blocks, 4, max_batch=max_batch, max_batched_tokens=budget, cost=COST)
    out = sched.run(trace)
    assert any(r.preempted for r in out), "the pool is small enough to preempt someone"
    for r in out:
        mine = [(t, kind, slot) for t, kind, rid, slot in sched.events if rid == r.id]
        admits = [(t, slot) for t, kind, slot in mine if kind == "admit"]
        leaves = [(t, slot) for t, kind, slot in mine if kind != "admit"]
        assert [kind for _, kind, _ in mine] == ["admit", "preempt"] * r.preempted + ["admit", "retire"]
        assert [(start, slot) for slot, start, _ in r.spans] == admits  # each span starts at an admission ...
        assert [(end, slot) for slot, _, end in r.spans] == leaves  # ... and ends where that admission ended
        assert r.spans[0][1] == r.admitted_s and r.spans[-1][2] == r.released_s == r.finished_s
        waits = [(a[2], b[1]) for a, b in zip(r.spans, r.spans[1:])]  # (preempted at, readmitted at)
        assert all(left <= back for left, back in waits)
    for slot in range(max_batch):  # and no two requests are drawn in one slot at once
        stays = sorted((start, end) for r in out for s, start, end in r.spans if s == slot)
        assert all(end <= start for (_, end), (start, _) in zip(stays, stays[1:]))


# --------------------------------------------------------------------------- bad input: a clear message, no change


def _state(sched):
    return ([r.id for r in sched.waiting], [a.request.id for a in sched.running], sched.pool.allocator.num_free, sched.now,
            sched.steps, sched._next_id)


@pytest.mark.parametrize("make, words", [
    (lambda: Request([], 3), "empty"),
    (lambda: Request([5, 6], 0), "max_new_tokens"),
    (lambda: Request([5, 6], -2), "max_new_tokens"),
    (lambda: Request([5, -1], 2), "token ids"),
    (lambda: Request([5, 6], 2, arrival_s=-1.0), "arrival_s"),
])
def test_malformed_requests_are_refused(make, words):
    with pytest.raises(CourseError, match=words):
        make()


@pytest.mark.parametrize("request_, words", [
    (Request([5] * 60, 10), "more than the whole KV pool"),  # 70 positions, the pool holds 64
    (Request([5] * 1000, 100), "context"),  # the tiny model reads 1,024 positions
    (Request([500, 6], 2), "vocabulary"),
    ("not a request", "Submit a Request"),
])
def test_requests_the_scheduler_cannot_serve_are_refused_and_change_nothing(tiny, request_, words):
    sched = _scheduler(tiny, 16, 4, max_batch=2)
    sched.submit(Request([5, 6, 7], 3))
    sched.step()
    before = _state(sched)
    with pytest.raises(CourseError, match=words):
        sched.submit(request_)
    assert _state(sched) == before
    with pytest.raises(CourseError, match=words):  # run() checks every request before it queues any
        sched.run([Request([9, 9], 2), request_])
    assert _state(sched) == before


def test_a_request_is_submitted_once_and_bad_settings_are_refused(tiny):
    sched = _scheduler(tiny)
    r = sched.submit(Request([5, 6], 2))
    with pytest.raises(CourseError, match="submitted already"):
        sched.submit(r)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(CourseError):
            _scheduler(tiny, max_batch=bad)
        with pytest.raises(CourseError):
            _scheduler(tiny, max_batched_tokens=bad)
    for name in ("flatten", "prefill_first"):
        with pytest.raises(CourseError, match=f"{name} must be True or False"):
            _scheduler(tiny, **{name: 1})
    assert not _scheduler(tiny).step()  # nothing to do


# --------------------------------------------------------------------------- the real model, against transformers


PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
           "Explain what a KV cache is in one sentence.", "List three colours:", "2 + 2 ="]


def test_real_model_continuous_batching_equals_generate_and_generate_batch(real, real_scratch, greedy_reference):
    ids = [real.tokenizer(p).input_ids for p in PROMPTS]
    new = [10, 3, 7, 10, 5, 2]
    reqs = [Request(p, n, arrival_s=0.002 * i) for i, (p, n) in enumerate(zip(ids, new))]
    sched = ContinuousScheduler(real_scratch, PagedKVPool.for_model(real_scratch, 24, 8), max_batch=4,
                                max_batched_tokens=8)  # chunks of 8: longer prompts take two iterations
    ours = sched.run(reqs)
    static = run_static(real_scratch, reqs, max_batch=3)
    theirs = [greedy_reference(p, n, eos_token_id=None) for p, n in zip(ids, new)]  # each prompt alone
    assert [r.output for r in ours] == theirs
    assert [r.output for r in static] == theirs
    # a padded batch through transformers' own generate, left padding: the same tokens again
    real.tokenizer.padding_side = "left"
    batch = real.tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with torch.inference_mode():
        padded = real.model.generate(**batch, max_new_tokens=max(new), do_sample=False, pad_token_id=0,
                                     eos_token_id=None)[:, batch.input_ids.shape[1]:]
    assert [row[:n] for row, n in zip(padded.tolist(), new)] == theirs
    _, engine = transformers_generate_batch(real.model, ids, max(new), block_size=16)
    assert [row[:n] for row, n in zip(engine, new)] == theirs
    assert math.isfinite(sched.now) and sched.now > 0


def test_bad_input_gets_one_sentence_and_leaves_a_running_engine_as_it_was(tiny):
    sched = _scheduler(tiny, 16, 4, max_batch=2, cost=COST)
    sched.submit(Request([5, 6, 7], 3))
    sched.step()
    before = _state(sched)
    cases = [(lambda: sched.submit(Request([5] * 60, 10)), "more than the whole KV pool"),  # longer than the pool
             (lambda: sched.submit(Request([5, 6], 0)), "max_new_tokens"),  # zero max tokens
             (lambda: sched.submit(Request([5, 6], 2, arrival_s=-0.5)), "arrival_s"),  # a negative arrival
             (lambda: PagedKVPool.for_model(tiny, 0, 4), "at least 1 block")]  # a pool too small for one block
    for make, words in cases:
        with pytest.raises(CourseError, match=words) as refused:
            make()
        assert "\n" not in str(refused.value) and str(refused.value).endswith(".")  # one sentence
        assert _state(sched) == before
    assert sched.run([Request([8, 9], 2)])[0].output  # and it still serves


# --------------------------------------------------------------------------- the split: plan() decides, and only that


def test_plan_is_a_pure_choice_of_rows_from_the_running_admissions():
    from llm_anatomy.serve.scheduler import Admission, plan

    decoding = Admission(Request([1, 2, 3], 4), 0, 0.0, [0], 3)
    decoding.request.output.append(9)  # 4 tokens, 3 cached: one new token
    prompts = [Admission(Request(list(range(1, 8)), 2), 1, 0.0, [], 0), Admission(Request([4, 5, 6], 2), 2, 0.0, [], 1)]
    running = [decoding, *prompts]
    before = [(a.computed, list(a.blocks), list(a.request.output)) for a in running]
    assert plan(running, None, False) == ([decoding], [(prompts[0], 7), (prompts[1], 2)])
    assert plan(running, 5, False) == ([decoding], [(prompts[0], 4)])  # the budget: 1 decode + 4 prompt tokens
    assert plan(running, 9, False) == ([decoding], [(prompts[0], 7), (prompts[1], 1)])
    assert plan(running, None, True) == ([], [(prompts[0], 7), (prompts[1], 2)])  # prefill first: decodes wait
    assert plan([decoding], None, True) == ([decoding], [])
    assert [(a.computed, list(a.blocks), list(a.request.output)) for a in running] == before  # nothing changed


def test_schedule_books_blocks_but_runs_no_model(tiny):
    class NoModel:  # a model's configuration and place only: calling it would raise
        cfg, device, dtype = tiny.cfg, tiny.device, tiny.dtype

    sched = ContinuousScheduler(NoModel(), PagedKVPool.for_model(tiny, 16, 4), max_batch=2, max_batched_tokens=6)
    a, b = sched.submit(Request([5, 6, 7, 8, 9], 3)), sched.submit(Request([7, 8], 3))
    step = sched.schedule()
    assert step.admitted == [a, b] and step.preempted == [] and step.decoders == []
    assert [(x.request, n) for x, n in step.chunks] == [(a, 5), (b, 1)] and list(sched.calls) == []
    assert [len(x.blocks) for x in sched.running] == [2, 1] and sched.pool.allocator.num_free == 13


def test_plan_iteration_decides_as_schedule_does_on_random_queues(tiny_model):
    """The pure plan_iteration (exercise 8.5's reference) against the engine's own schedule(): at every iteration of
    random traces through pools small enough to preempt, the same decoders, chunks and preempted requests."""
    import random

    from llm_anatomy.model.scratch import ScratchLlama
    from llm_anatomy.serve.iteration import RowState, plan_iteration
    from llm_anatomy.serve.metrics import poisson_trace

    model = ScratchLlama.from_hf(tiny_model)
    counts = {"compared": 0, "preempting": 0}

    class Watched(ContinuousScheduler):
        def _admit(self):
            admitted = super()._admit()
            self.seen = ([RowState(a.computed, a.pending, len(a.blocks)) for a in self.running],
                         [a.request for a in self.running], self.pool.allocator.num_free)
            return admitted

        def schedule(self):
            step = super().schedule()
            rows, requests, free = self.seen
            decoders, chunks, preempted = plan_iteration(rows, self.max_batched_tokens, free, self.pool.block_size)
            assert [requests[i] for i in preempted] == step.preempted
            assert [requests[i] for i in decoders] == [a.request for a in step.decoders]
            assert [(requests[i], n) for i, n in chunks] == [(a.request, n) for a, n in step.chunks]
            counts["compared"] += 1
            counts["preempting"] += bool(preempted)
            return step

    rng = random.Random(3)
    for seed in range(6):
        engine = Watched(model, PagedKVPool.for_model(model, num_blocks=rng.choice([6, 8, 12]), block_size=4),
                         max_batch=rng.choice([2, 3, 4]), max_batched_tokens=rng.choice([None, 4, 8]))
        engine.run(poisson_trace(10, 50.0, [3, 6, 9], [2, 5, 9], seed=seed, vocab_size=64))
    assert counts["compared"] > 50 and counts["preempting"] > 0, counts
