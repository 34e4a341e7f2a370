"""Serving traces and their figures: Poisson arrivals, percentiles, goodput, ITL and end-to-end latency; the KV memory
utilisation of paged blocks against reserving the longest length."""

from __future__ import annotations

import numpy as np
import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.serve.batching import Request
from llm_anatomy.claims import ClaimFailed
from llm_anatomy.serve.metrics import (SHAREGPT_MEAN_OUTPUT, SHAREGPT_MEAN_PROMPT, claim_continuous_frees_rows,
                                      claim_paged_holds_real_tokens, rows_held_when_done_s,
                                      poisson_trace, serving_metrics, sharegpt_like_lengths, simulate_utilisation)


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
    assert m["met_targets"] == 2 and m["goodput_req_s"] == pytest.approx(2 / 6)
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


@pytest.mark.parametrize("seed", [0, 1, 7, 12345, 2**31 - 1, 987654321987])
def test_c14_holds_whatever_the_seed(seed):
    assert "C14 holds" in str(claim_paged_holds_real_tokens(sharegpt_like_lengths(1000, seed), 2048))


def test_c14_fails_when_the_requests_are_too_short_to_fill_a_block_or_as_long_as_the_limit():
    with pytest.raises(ClaimFailed, match="C14 FAILED"):  # 1-token requests fill 1 of each block's 16 slots
        claim_paged_holds_real_tokens([1] * 1000, 2048)
    with pytest.raises(ClaimFailed, match="C14 FAILED"):  # every request at the limit: reserving wastes nothing
        claim_paged_holds_real_tokens([2048] * 1000, 2048)


# --------------------------------------------------------------------------- C15 on one trace, static vs continuous


def _served(rows):
    """Requests with (output, token times, released) as given; each arrived at 0 and finished at its last token."""
    out = []
    for output, times, released in rows:
        r = Request([5], len(output))
        r.output, r.token_times, r.finished_s, r.released_s = list(output), list(times), times[-1], released
        out.append(r)
    return out


STATIC = [([1, 2], [1.0, 2.0], 4.0), ([3, 4, 5, 6], [1.0, 2.0, 3.0, 4.0], 4.0)]  # the short one keeps its row 2 s
CONTINUOUS = [([1, 2], [1.0, 2.0], 2.0), ([3, 4, 5, 6], [1.0, 1.5, 2.0, 2.5], 2.5)]


def test_c15_on_one_trace_reads_every_figure_from_the_runs():
    verdict = str(claim_continuous_frees_rows(_served(STATIC), _served(CONTINUOUS)))
    assert "C15 holds" in verdict and "2.00 s in all under static batching, 0.00 s under continuous" in verdict
    assert "1.60x the tokens/s" in verdict  # 6 tokens in 2.5 s against 6 in 4 s
    assert rows_held_when_done_s(_served(STATIC)) == 2.0


def test_c15_on_one_trace_fails_when_a_finished_request_keeps_its_continuous_row():
    kept = [CONTINUOUS[0][:2] + (2.5,), CONTINUOUS[1]]  # done at 2.0 s, its row given back at 2.5 s
    with pytest.raises(ClaimFailed, match="0.50 s under continuous"):
        claim_continuous_frees_rows(_served(STATIC), _served(kept))


def test_c15_on_one_trace_fails_on_other_tokens_no_held_static_row_or_no_gain():
    with pytest.raises(ClaimFailed, match="all 2 requests: False"):
        claim_continuous_frees_rows(_served(STATIC), _served([([1, 9], *CONTINUOUS[0][1:]), CONTINUOUS[1]]))
    with pytest.raises(ClaimFailed, match="0.00 s in all under static"):  # static batching held nothing: no evidence
        claim_continuous_frees_rows(_served([STATIC[0][:2] + (2.0,), STATIC[1]]), _served(CONTINUOUS))
    slow = [([1, 2], [1.0, 5.0], 5.0), ([3, 4, 5, 6], [1.0, 2.0, 3.0, 6.0], 6.0)]  # 6 tokens in 6 s, not in 4 s
    with pytest.raises(ClaimFailed, match="0.67x the tokens/s"):
        claim_continuous_frees_rows(_served(STATIC), _served(slow))
