"""Serving traces and their figures: Poisson arrivals, percentiles, goodput, ITL and end-to-end latency; the KV memory
utilisation of paged blocks against reserving the longest length."""

from __future__ import annotations

import numpy as np
import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.serve.batching import Request
from llm_anatomy.claims import ClaimFailed
from llm_anatomy.device import torch_threads
from llm_anatomy.serve.block_manager import BlockManager, pool_blocks
from llm_anatomy.serve.cost import StepCost
from llm_anatomy.serve.metrics import (SHAREGPT_MEAN_OUTPUT, SHAREGPT_MEAN_PROMPT, PoolUse, claim_continuous_frees_rows,
                                      claim_pool_holds_real_tokens, joined_running_batch, poisson_trace,
                                      rows_held_when_done_s, run_reading_pool, serving_metrics, sharegpt_like_lengths,
                                      simulate_utilisation, utilisation_reading)
from llm_anatomy.serve.metrics import claim_same_tokens
from llm_anatomy.serve.paged_kv import PagedKVPool, blocks_for
from llm_anatomy.serve.scheduler import ContinuousScheduler


def test_poisson_trace_is_seeded_and_draws_from_the_lengths_given():
    a = poisson_trace(200, 10.0, [4, 8], [1, 1, 1, 16], seed=5, vocab_size=100)
    b = poisson_trace(200, 10.0, [4, 8], [1, 1, 1, 16], seed=5, vocab_size=100)
    assert [(r.prompt, r.max_new_tokens, r.arrival_s) for r in a] == [(r.prompt, r.max_new_tokens, r.arrival_s)
                                                                      for r in b]
    assert a[0].arrival_s == 0.0 and all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:]))
    gaps = np.diff([r.arrival_s for r in a])
    assert 0.07 < gaps.mean() < 0.13  # mean gap 1 / rate
    assert {len(r.prompt) for r in a} == {4, 8} and {r.max_new_tokens for r in a} == {1, 16}
    assert 0.6 < np.mean([r.max_new_tokens == 1 for r in a]) < 0.9  # weighted 3 to 1
    assert all(3 <= t < 100 for r in a for t in r.prompt) and [r.id for r in a] == list(range(200))
    text = list(range(1000, 1050))
    c = poisson_trace(5, 1.0, [10], [2], tokens=text)
    assert all(r.prompt == text[text.index(r.prompt[0]):text.index(r.prompt[0]) + 10] for r in c)
    with pytest.raises(CourseError):
        poisson_trace(0, 1.0, [4], [4])
    with pytest.raises(CourseError):
        poisson_trace(3, 1.0, [60], [4], tokens=text)


def test_metrics_by_hand():
    reqs = []
    for arrival, times in [(0.0, [1.0, 1.5, 2.0]), (0.5, [1.5]), (1.0, [4.0, 6.0])]:
        r = Request([5], len(times), arrival_s=arrival)
        r.output, r.token_times = [1] * len(times), times
        reqs.append(r)
    m = serving_metrics(reqs, ttft_target_s=1.5, tpot_target_s=1.0)
    assert m["output_tokens"] == 6 and m["seconds"] == 6.0 and m["throughput_tok_s"] == 1.0
    assert m["ttft_p50_s"] == 1.0 and m["ttft_p99_s"] == pytest.approx(np.percentile([1.0, 1.0, 3.0], 99))
    assert m["tpot_p50_s"] == pytest.approx(1.25)  # (0.5 + 2.0) / 2: the one-token request has no TPOT
    assert m["met_targets"] == 2 and m["request_goodput_req_s"] == pytest.approx(2 / 6)
    assert m["itl_p50_s"] == pytest.approx(np.percentile([0.5, 0.5, 2.0], 50))  # every gap of every request
    assert m["itl_p99_s"] == pytest.approx(np.percentile([0.5, 0.5, 2.0], 99))
    assert m["e2e_p50_s"] == pytest.approx(2.0) and m["e2e_p99_s"] == pytest.approx(np.percentile([2, 1, 5], 99))
    assert serving_metrics(reqs)["met_targets"] == 3
    with pytest.raises(CourseError):
        serving_metrics([Request([5], 2)])


# --------------------------------------------------------------------------- KV memory utilisation (C14)


def test_simulated_utilisation_on_hand_computed_cases():
    # lengths 1, 4, 5, 10 with blocks of 4: 1 + 1 + 2 + 3 = 7 blocks = 28 slots for 20 tokens
    out = simulate_utilisation([1, 4, 5, 10], max_len=16, block_size=4)
    assert out["tokens"] == 20 and out["paged_blocks"] == 7 and out["paged_slots"] == 28
    assert out["reserve_max_slots"] == 64
    assert out["reserve_max_utilisation"] == pytest.approx(20 / 64)
    assert out["paged_utilisation"] == pytest.approx(20 / 28)
    one = simulate_utilisation([7, 16], max_len=16, block_size=1)  # block size 1: no waste at all
    assert one["paged_utilisation"] == 1.0 and one["reserve_max_utilisation"] == pytest.approx(23 / 32)
    full = simulate_utilisation([16, 16], max_len=16, block_size=16)
    assert full["paged_utilisation"] == full["reserve_max_utilisation"] == 1.0
    with pytest.raises(CourseError):
        simulate_utilisation([17], max_len=16, block_size=4)
    with pytest.raises(CourseError):
        simulate_utilisation([], max_len=16, block_size=4)


def test_paged_uses_most_of_its_memory_on_a_realistic_spread_of_lengths():
    rng = np.random.default_rng(0)
    prompts = rng.integers(20, 200, size=500)
    outputs = np.round(rng.lognormal(mean=5.0, sigma=1.0, size=500))  # median ~150 tokens, long tail
    lengths = np.minimum(prompts + outputs, 2048).astype(int).tolist()
    out = simulate_utilisation(lengths, max_len=2048, block_size=16)
    summary = (f"paged {out['paged_utilisation']:.3f}, reserve-max {out['reserve_max_utilisation']:.3f}, "
               f"mean length {np.mean(lengths):.0f}, {out['tokens']} tokens")
    print(summary)
    assert out["paged_utilisation"] >= 0.9, summary
    assert out["reserve_max_utilisation"] <= 0.3, summary
    # the waste of paging is at most block_size - 1 slots per request
    assert out["paged_slots"] - out["tokens"] <= len(lengths) * 15, summary


# --------------------------------------------------------------------------- C14 on a published length shape


def test_sharegpt_like_lengths_have_the_published_means_and_a_heavy_tail():
    lengths = np.array(sharegpt_like_lengths(20000, seed=1, max_len=100000))
    assert abs(lengths.mean() - (SHAREGPT_MEAN_PROMPT + SHAREGPT_MEAN_OUTPUT)) < 15
    assert np.percentile(lengths, 99) > 4 * np.median(lengths)  # a few long ones among many short
    assert max(sharegpt_like_lengths(500, seed=2, max_len=2048)) <= 2048
    with pytest.raises(CourseError):
        sharegpt_like_lengths(0, seed=1)


def test_the_simulated_utilisation_is_a_reading_never_a_claim():
    verdict = utilisation_reading(sharegpt_like_lengths(1000, 0), 2048)
    assert "C14 on this machine" in str(verdict) and "holds" not in str(verdict)


# --------------------------------------------------------------------------- C14 on the engine's own pool

C14_COST = StepCost(decode_call_s=0.05, decode_row_s=0.004, prefill_call_s=0.06, prefill_token_s=0.0015, context_s=2e-6)
# notebook 08's CPU trace: prompts of 8-24 tokens, answers of 2-24, 4 rows; MAX_LEN = 24 + 24
PROMPTS, OUTPUTS, MAX_BATCH, MAX_LEN = [8, 16, 24], [2, 2, 3, 3, 4, 24], 4, 48
C14_TRACE = poisson_trace(12, 3.0, PROMPTS, OUTPUTS, seed=3, vocab_size=128)


def _pool_run(tiny, scheduler_class=ContinuousScheduler, block_size=16, cost=C14_COST, **kwargs):
    pool = PagedKVPool.for_model(tiny, pool_blocks([MAX_LEN] * MAX_BATCH, block_size), block_size)
    with torch_threads(1):
        return run_reading_pool(scheduler_class(tiny, pool, MAX_BATCH, cost=cost, **kwargs), C14_TRACE)


def test_run_reading_pool_serves_as_run_does_and_reads_the_pool_every_iteration(tiny):
    served, use = _pool_run(tiny)
    pool = PagedKVPool.for_model(tiny, pool_blocks([MAX_LEN] * MAX_BATCH, 16), 16)
    plain = ContinuousScheduler(tiny, pool, MAX_BATCH, cost=C14_COST)
    assert [r.output for r in plain.run(C14_TRACE)] == [r.output for r in served]
    assert len(use.rows) == plain.steps and use.rows[-1] == use.tokens[-1] == use.held_blocks[-1] == 0
    f = use.figures(MAX_LEN)
    assert f["held"] == 16 * sum(use.held_blocks) and f["reserved"] == MAX_LEN * sum(use.rows)
    # between iterations every running request holds exactly the blocks of the positions it has cached
    assert all(h == t for h, t in zip(use.held_blocks, _blocks_of_tokens(tiny)))


def _blocks_of_tokens(tiny):
    """Blocks per iteration recomputed from each running request's cached positions."""
    pool = PagedKVPool.for_model(tiny, pool_blocks([MAX_LEN] * MAX_BATCH, 16), 16)
    sched = ContinuousScheduler(tiny, pool, MAX_BATCH, cost=C14_COST)
    for r in C14_TRACE:
        sched.submit(r.fresh())
    out = []
    while sched.step():
        out.append(sum(-(-a.computed // 16) for a in sched.running))
    return out


BUSY_COSTS = {"idle": C14_COST, "busy: every call 4x": StepCost(*(4 * v for v in vars(C14_COST).values())),
              "busy: fixed costs 8x, the rest 2x": StepCost(0.4, 0.008, 0.48, 0.003, 4e-6)}


@pytest.mark.parametrize("machine", list(BUSY_COSTS))
def test_c14_holds_on_the_engines_pool(tiny, machine):
    _, use = _pool_run(tiny, cost=BUSY_COSTS[machine])
    verdict = str(claim_pool_holds_real_tokens(use, MAX_LEN))
    assert "C14 holds" in verdict and use.figures(MAX_LEN)["held_over_reserved"] < 0.75, verdict


class ReservingBlocks(BlockManager):
    """A contiguous engine's books: every request gets blocks for max_len positions when it is admitted."""

    def admission_needs(self, prompts):
        needs, free = super().admission_needs(prompts)
        return [blocks_for(MAX_LEN, self.block_size)] * len(needs), free

    def make_room(self, rows):
        return super().make_room([(table, MAX_LEN) for table, _ in rows])

    def grow(self, rows):
        super().grow([(table, MAX_LEN) for table, _ in rows])


class ReservingScheduler(ContinuousScheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.blocks = ReservingBlocks(self.pool)


@pytest.mark.counterfactual("C14", "an engine whose pool reserves max_len for every request it admits")
def test_c14_fails_on_a_pool_that_reserves_the_maximum_length(tiny):
    served, use = _pool_run(tiny, ReservingScheduler)
    assert use.figures(MAX_LEN)["held_over_reserved"] == 1.0  # it held what reserving holds
    assert [r.output for r in served] == [r.output for r in _pool_run(tiny)[0]]  # the same tokens all the same
    with pytest.raises(ClaimFailed, match="C14 FAILED.*1.00 of it"):
        claim_pool_holds_real_tokens(use, MAX_LEN)


@pytest.mark.counterfactual("C14", "a paged pool whose blocks are as large as the maximum length")
def test_c14_fails_with_blocks_as_large_as_the_maximum_length(tiny):
    _, use = _pool_run(tiny, block_size=MAX_LEN)
    with pytest.raises(ClaimFailed, match="C14 FAILED.*1.00 of it"):
        claim_pool_holds_real_tokens(use, MAX_LEN)


class WholeAnswerBlocks(BlockManager):
    """Books a request's prompt and its whole answer (max_new_tokens) at admission, as some servers reserve."""

    def __init__(self, pool, finals):
        super().__init__(pool)
        self.finals = finals  # block table id -> positions to book

    def make_room(self, rows):
        return super().make_room([(t, max(p, self.finals.get(id(t), p))) for t, p in rows])

    def grow(self, rows):
        super().grow([(t, max(p, self.finals.get(id(t), p))) for t, p in rows])


class WholeAnswerScheduler(ContinuousScheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.blocks = WholeAnswerBlocks(self.pool, {})

    def _admit(self):
        joined = super()._admit()
        for a in self.running:
            self.blocks.finals[id(a.blocks)] = len(a.request.prompt) + a.request.max_new_tokens
        return joined


@pytest.mark.counterfactual("C14", "a pool that books each request's whole answer (prompt + max_new_tokens) up front")
def test_c14_fails_on_a_pool_that_books_the_whole_answer_up_front(tiny):
    _, use = _pool_run(tiny, WholeAnswerScheduler)
    with pytest.raises(ClaimFailed, match="C14 FAILED.*per running request, under one block of 16: False"):
        claim_pool_holds_real_tokens(use, MAX_LEN)


def test_c14_needs_a_run_to_read():
    with pytest.raises(CourseError, match="no iteration"):
        claim_pool_holds_real_tokens(PoolUse(16, [0], [0], [0]), MAX_LEN)


# --------------------------------------------------------------------------- C15 on one trace, static vs continuous


def _served(rows):
    """Requests with (output, token times, released, admitted) as given; each arrived at 0, held slot i of the batch
    from its admission to its release, and finished at its last token."""
    out = []
    for slot, (output, times, released, admitted) in enumerate(rows):
        r = Request([5], len(output))
        r.output, r.token_times, r.finished_s, r.released_s = list(output), list(times), times[-1], released
        r.admitted_s, r.spans = admitted, [(slot, admitted, released)]
        out.append(r)
    return out


STATIC = [([1, 2], [1.0, 2.0], 4.0, 0.0), ([3, 4, 5, 6], [1.0, 2.0, 3.0, 4.0], 4.0, 0.0)]  # the short one waits 2 s
CONTINUOUS = [([1, 2], [1.0, 2.0], 2.0, 0.0), ([3, 4, 5, 6], [1.0, 1.5, 2.0, 2.5], 2.5, 0.5)]  # joins at 0.5 s


def test_c15_on_one_trace_reads_every_figure_from_the_runs():
    verdict = str(claim_continuous_frees_rows(_served(STATIC), _served(CONTINUOUS)))
    assert "C15 holds" in verdict and "2.00 s in all under static batching, 0.00 s under continuous" in verdict
    assert "1 admissions joined a batch already running under continuous batching (0 under static)" in verdict
    assert "1.60x the tokens/s" in verdict  # 6 tokens in 2.5 s against 6 in 4 s
    assert rows_held_when_done_s(_served(STATIC)) == 2.0


@pytest.mark.counterfactual("C15", "continuous batching that retires a finished request only later (its row held)")
def test_c15_on_one_trace_fails_when_a_finished_request_keeps_its_continuous_row():
    kept = [CONTINUOUS[0][:2] + (2.5, 0.0), CONTINUOUS[1]]  # done at 2.0 s, its row given back at 2.5 s
    with pytest.raises(ClaimFailed, match="0.50 s under continuous"):
        claim_continuous_frees_rows(_served(STATIC), _served(kept))


@pytest.mark.counterfactual("C15", "continuous batching that admits only when its whole batch has finished")
def test_c15_on_one_trace_fails_when_nobody_joins_a_running_batch():
    drained = [CONTINUOUS[0], CONTINUOUS[1][:3] + (0.0,)]  # both start together: nobody joined a running batch
    with pytest.raises(ClaimFailed, match="0 admissions joined a batch already running"):
        claim_continuous_frees_rows(_served(STATIC), _served(drained))


def test_joined_running_batch_counts_admissions_strictly_inside_another_span():
    assert joined_running_batch(_served(CONTINUOUS)) == 1 and joined_running_batch(_served(STATIC)) == 0
    after = [CONTINUOUS[0], CONTINUOUS[1][:3] + (2.0,)]  # admitted the moment the first left: no batch running
    assert joined_running_batch(_served(after)) == 0


def test_c15_on_one_trace_fails_on_other_tokens_no_held_static_row_or_no_gain():
    with pytest.raises(ClaimFailed, match="all 2 requests: False"):
        claim_continuous_frees_rows(_served(STATIC), _served([([1, 9], *CONTINUOUS[0][1:]), CONTINUOUS[1]]))
    with pytest.raises(ClaimFailed, match="0.00 s in all under static"):  # static batching held nothing: no evidence
        claim_continuous_frees_rows(_served([STATIC[0][:2] + (2.0, 0.0), STATIC[1]]), _served(CONTINUOUS))
    slow = [([1, 2], [1.0, 5.0], 5.0, 0.0), ([3, 4, 5, 6], [1.0, 2.0, 3.0, 6.0], 6.0, 0.5)]  # 6 tokens in 6 s, not 4
    with pytest.raises(ClaimFailed, match="0.67x the tokens/s"):
        claim_continuous_frees_rows(_served(STATIC), _served(slow))


# --------------------------------------------------------------------------- C15: the same tokens every way


def test_c15_same_tokens_holds_and_names_every_way():
    verdict = str(claim_same_tokens({"ours": [[1, 2]], "theirs": [[1, 2]], "generate": [[1, 2]]}, "1 request"))
    assert "C15 holds: 1 request: ours, theirs and generate give the same greedy tokens: True" in verdict


class FromTheStart(ContinuousScheduler):
    """Chunked prefill with an offset bug: every chunk feeds the prompt's first tokens again, at the right positions."""

    def step(self):
        if not self.running and not self.waiting:
            return False
        if not self.running and self.waiting[0].arrival_s > self.now:
            self.now = self.waiting[0].arrival_s
        step = self.schedule()
        rows = step.rows
        logits = self.runner.run([a.request.tokens[:n] if n > 1 else a.request.tokens[a.computed:a.computed + n]
                                  for a, n in rows], [a.blocks for a, _ in rows], [a.computed for a, _ in rows],
                                 len(step.decoders)) if rows else None
        self.postprocess(step, logits)
        return True


@pytest.mark.counterfactual("C15", "chunked prefill whose every chunk feeds the prompt's first tokens again")
def test_c15_same_tokens_fails_when_a_chunk_reads_the_wrong_tokens(real):
    from llm_anatomy.model.scratch import ScratchLlama

    model, tok = ScratchLlama.from_hf(real.model), real.tokenizer
    prompt = tok("The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is").input_ids
    outputs = {}
    with torch_threads(1):
        for name, engine, budget in (("whole", ContinuousScheduler, None), ("chunked", ContinuousScheduler, 8),
                                     ("buggy chunks", FromTheStart, 8)):
            pool = PagedKVPool.for_model(model, pool_blocks([len(prompt) + 3], 4), 4)
            outputs[name] = [r.output for r in engine(model, pool, 1, budget).run([Request(prompt, 3)])]
    assert "C15 holds" in str(claim_same_tokens({k: outputs[k] for k in ("whole", "chunked")}, "one prompt"))
    with pytest.raises(ClaimFailed, match="C15 FAILED"):
        claim_same_tokens({k: outputs[k] for k in ("whole", "buggy chunks")}, "one prompt")
