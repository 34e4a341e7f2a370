"""Continuous batching (claim C15): the same greedy tokens as one request at a time, transformers' `generate` and its
`generate_batch`; admission, chunked prefill, preemption by recompute, and bad input refused without a change."""

from __future__ import annotations

import math

import pytest
import torch
from llm_anatomy.weights.random import random_llama

from llm_anatomy.serve.batching import Request, run_static
from llm_anatomy.generate.decode import decode_step, generate_greedy, prefill
from llm_anatomy.errors import CourseError
from llm_anatomy.serve.metrics import poisson_trace, transformers_generate_batch
from llm_anatomy.serve.paged_kv import PagedKVPool
from llm_anatomy.serve.scheduler import ContinuousScheduler, RaggedPagedView, admit, blocks_for
from llm_anatomy.model.scratch import ScratchLlama

COST = lambda tokens, rows: 0.01 + 0.001 * tokens  # noqa: E731  a clock that does not depend on the machine


@pytest.fixture(scope="module")
def tiny():
    return ScratchLlama.from_hf(random_llama())


@pytest.fixture(scope="module")
def trace():
    return poisson_trace(12, 40.0, [1, 3, 5, 9, 17], [1, 2, 4, 12], seed=3, vocab_size=128)


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


def test_ragged_rows_in_one_call_equal_each_row_alone(tiny):
    """Rows of different cached lengths, adding different numbers of tokens, in one paged call: the same logits as
    each row alone; a single row without padding gives exactly the contiguous cache's logits."""
    pool = PagedKVPool.for_model(tiny, 24, 4)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33, 34]]
    chunks = [[40, 41, 42], [50], [60, 61, 62, 63, 64, 65]]  # then a chunk of 3, a decode, a chunk of 6
    tables = [[pool.allocator.allocate() for _ in range(blocks_for(len(p) + len(c), 4))]
              for p, c in zip(prompts, chunks)]
    first = RaggedPagedView(pool, tables, [0, 0, 0], [len(p) for p in prompts])  # all prompts in one call
    ids = torch.tensor([[0] * (7 - len(p)) + p for p in prompts])
    out = prefill(tiny, ids, first).logits[:, -1]
    second = RaggedPagedView(pool, tables, [len(p) for p in prompts], [len(c) for c in chunks])
    ids = torch.tensor([[0] * (6 - len(c)) + c for c in chunks])
    out2 = prefill(tiny, ids, second).logits[:, -1]
    for i, (p, c) in enumerate(zip(prompts, chunks)):
        for got, seq in ((out[i], p), (out2[i], p + c)):
            alone = prefill(tiny, torch.tensor([seq]), tiny.new_cache(1, 16)).logits[0, -1]
            assert torch.allclose(got, alone, atol=1e-5), (i, float((got - alone).abs().max()))
            assert int(got.argmax()) == int(alone.argmax())
    assert first.mask is not None and second.mask is not None
    contiguous = tiny.new_cache(1, 16)
    a = prefill(tiny, torch.tensor([prompts[0]]), contiguous).logits
    b = prefill(tiny, torch.tensor([prompts[0]]), RaggedPagedView(pool, [tables[0]], [0], [len(prompts[0])])).logits
    assert torch.equal(a, b)  # one row, no padding: bit for bit
    c = decode_step(tiny, torch.tensor([[3]]), contiguous).logits
    d = decode_step(tiny, torch.tensor([[3]]), RaggedPagedView(pool, [tables[0]], [7], [1])).logits
    assert torch.equal(c, d)


# --------------------------------------------------------------------------- the schedule itself


def test_admit_is_first_come_first_served_within_slots_and_blocks():
    assert admit([0.0, 0.0, 0.0], [1, 1, 1], running=0, free_blocks=9, max_batch=8, now=0.0) == 3
    assert admit([0.0, 0.5, 3.0], [1, 1, 1], 0, 9, 8, now=1.0) == 2  # the third has not arrived
    assert admit([0.0, 0.0, 0.0], [1, 1, 1], 3, 9, 4, 0.0) == 1  # one slot left
    assert admit([0.0, 0.0, 0.0], [3, 3, 3], 0, 7, 8, 0.0) == 2  # blocks for two prompts
    assert admit([0.0, 0.0, 0.0], [2, 9, 1], 0, 5, 8, 0.0) == 1  # the big one waits, and nobody overtakes it
    assert admit([], [], 0, 5, 8, 0.0) == 0
    assert blocks_for(0, 4) == 0 and blocks_for(1, 4) == 1 and blocks_for(8, 4) == 2 and blocks_for(9, 4) == 3


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
            assert max(tokens for _, _, _, _, tokens in sched.calls) <= budget
        gaps[budget] = max(b - a for r in out[:3] for a, b in zip(r.token_times, r.token_times[1:]))
        ttft[budget] = out[3].ttft_s
    assert gaps[16] < gaps[None] / 3  # the long prefill no longer stalls the decoders for one long iteration
    assert ttft[16] > ttft[None]  # the price: the long prompt's own first token comes later


def test_preemption_by_recompute_never_loses_a_produced_token(tiny, trace):
    sched = _scheduler(tiny, 8, 4, max_batch=6, cost=COST)  # 8 blocks of 4: too few for everyone at once
    reqs = [sched.submit(r.fresh()) for r in trace]
    seen = {r.id: [] for r in reqs}
    while sched.step():
        for r in reqs:
            assert r.output[:len(seen[r.id])] == seen[r.id], "a produced token was lost"
            seen[r.id] = list(r.output)
        held = [b for r in sched.running for b in r.blocks]
        assert len(held) == len(set(held)) <= 8  # no block in two tables (no prefix cache here)
    assert sum(r.preempted for r in reqs) > 0
    assert [r.output for r in reqs] == _alone(tiny, trace)


# --------------------------------------------------------------------------- bad input: a clear message, no change


def _state(sched):
    return ([r.id for r in sched.waiting], [r.id for r in sched.running], sched.pool.allocator.num_free, sched.now,
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
    assert not _scheduler(tiny).step()  # nothing to do


# --------------------------------------------------------------------------- the real model, against transformers


@pytest.fixture(scope="module")
def real_scratch(real):
    return ScratchLlama.from_hf(real.model)


PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
           "Explain what a KV cache is in one sentence.", "List three colours:", "2 + 2 ="]


def test_real_model_continuous_batching_equals_generate_and_generate_batch(real, real_scratch):
    ids = [real.tokenizer(p).input_ids for p in PROMPTS]
    new = [10, 3, 7, 10, 5, 2]
    reqs = [Request(p, n, arrival_s=0.002 * i) for i, (p, n) in enumerate(zip(ids, new))]
    sched = ContinuousScheduler(real_scratch, PagedKVPool.for_model(real_scratch, 24, 8), max_batch=4,
                                max_batched_tokens=8)  # chunks of 8: longer prompts take two iterations
    ours = sched.run(reqs)
    static = run_static(real_scratch, reqs, max_batch=3)
    with torch.inference_mode():
        theirs = [real.model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                                      eos_token_id=None)[0, len(p):].tolist() for p, n in zip(ids, new)]
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
