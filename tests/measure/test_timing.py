"""The one repeat-timer (time_it, time_interleaved), the spread of its repeats, and the latencies named once."""

from __future__ import annotations

import math

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.decode import generate_greedy, greedy_calls
from llm_anatomy.measure.timing import (NOISY_SPREAD, Timing, decode_step_times, decode_tokens_per_s, end_to_end_s,
                                        inter_token_gaps_s, mean_token_gap_s, median_decode_step_s, time_generation,
                                        time_generations, time_generations_interleaved, time_interleaved, time_it,
                                        time_to_first_token_s)
from llm_anatomy.model.scratch import ScratchLlama


def test_time_it_warms_up_then_repeats():
    calls = []
    timing = time_it(lambda: calls.append(1), "cpu", warmup=2, repeats=5)
    assert len(calls) == 7 and len(timing.times_s) == 5 and timing.warmup == 2
    assert all(t >= 0 for t in timing.times_s)
    assert timing.min_s <= timing.median_s <= timing.max_s
    assert timing.median_ms == pytest.approx(timing.median_s * 1e3)
    assert "median" in repr(timing) and "spread" in repr(timing)
    with pytest.raises(CourseError):
        time_it(lambda: None, "cpu", repeats=0)


def test_candidates_take_turns_so_a_busy_moment_hits_them_all():
    order = []
    timings = time_interleaved({name: (lambda name=name: order.append(name)) for name in "abc"}, warmup=1, repeats=3)
    assert order == list("abc") * 4  # one warm-up round, then three timed rounds, A B C each time
    assert list(timings) == ["a", "b", "c"] and all(len(t.times_s) == 3 for t in timings.values())
    # A stall during one round lands in every candidate's times, not in one candidate's figure.
    clock = {"round": 0}

    def slow_in_round_two(name):
        if name == "a":
            clock["round"] += 1
        if clock["round"] == 2:
            torch.ones(200_000).cumsum(0)  # busy work, in every candidate's turn of round two
    stalled = time_interleaved({n: (lambda n=n: slow_in_round_two(n)) for n in "ab"}, warmup=0, repeats=3)
    slowest = {name: t.times_s.index(t.max_s) for name, t in stalled.items()}
    assert slowest == {"a": 1, "b": 1}


@pytest.mark.parametrize("bad", [{}, {"a": 3}])
def test_bad_candidates_are_refused(bad):
    with pytest.raises(CourseError, match="name: function"):
        time_interleaved(bad)


def test_the_spread_says_when_repeats_disagree():
    steady = Timing([1.0, 1.01, 0.99, 1.0, 1.02], 1)
    assert steady.spread < 0.05 and not steady.noisy and steady.noise_warning() == ""
    busy = Timing([1.0, 1.0, 2.0, 2.0], 1)  # half the repeats twice as slow
    assert busy.spread == pytest.approx(1.0 / 1.5) and busy.spread > NOISY_SPREAD and busy.noisy
    assert "67%" in busy.noise_warning() and "rough" in busy.noise_warning()
    one_stall = Timing([1.0] * 9 + [10.0], 1)  # one page fault among ten: the median and the spread stay put
    assert one_stall.median_s == 1.0 and one_stall.spread == 0.0 and not one_stall.noisy
    single = Timing([1.0], 0)
    assert math.isnan(single.spread) and not single.noisy and single.noise_warning() == ""
    assert Timing([3.0, 1.0, 2.0], 0).median_s == 2.0


def test_the_two_tpots_are_named_apart():
    # one request: first token at 0.5 s after arriving at 0, then gaps of 0.1, 0.1 and a stall of 1.0 s
    times = [0.5, 0.6, 0.7, 1.7]
    assert time_to_first_token_s(0.0, times) == 0.5 and end_to_end_s(0.0, times) == 1.7
    assert inter_token_gaps_s(times) == pytest.approx([0.1, 0.1, 1.0])  # ITL
    assert mean_token_gap_s(times) == pytest.approx(0.4)  # a served request's TPOT: the stall counts
    assert median_decode_step_s(inter_token_gaps_s(times)) == pytest.approx(0.1)  # a generation's: it does not
    assert mean_token_gap_s([0.25]) == 0.0 and inter_token_gaps_s([0.25]) == []
    with pytest.raises(CourseError, match="no token"):
        mean_token_gap_s([])
    with pytest.raises(CourseError, match="at least one decode step"):
        median_decode_step_s([])


def test_time_generation_gives_ttft_and_tpot(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    t = time_generation(model, ids, new_tokens=5, repeats=3)
    assert t.prompt_tokens == 12 and t.batch == 2 and len(t.step_seconds) == 5
    assert t.ttft_s > 0 and t.tpot_s > 0
    assert t.decode_tokens_per_s == pytest.approx(2 / t.tpot_s)
    assert t.prefill_tokens_per_s == pytest.approx(24 / t.ttft_s)
    assert len(t.prefill_seconds) == 3 and t.ttft_s == sorted(t.prefill_seconds)[1]  # the median of the runs
    single = time_generation(model, ids, new_tokens=4, warmup=False)
    assert single.tpot_s == median_decode_step_s(single.step_seconds[1:])  # the last run's steps, one run
    with pytest.raises(CourseError, match="at least 2 new tokens"):
        time_generation(model, ids, new_tokens=1)


def test_decode_speed_is_a_positive_rate(tiny_model):
    speed = decode_tokens_per_s(ScratchLlama.from_hf(tiny_model), batch=3, context=40, repeats=2)
    assert math.isfinite(speed) and speed > 0


def test_generations_take_turns_call_by_call(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(1))
    order = []

    def watched(name, calls):  # greedy_calls, noting whose call runs
        while True:
            try:
                call = next(calls)
            except StopIteration as done:
                return done.value
            yield lambda call=call: (order.append(name), call())

    runs = time_generations_interleaved({"with": watched("with", greedy_calls(model, ids, 4)),
                                         "without": watched("without", greedy_calls(model, ids, 3, use_cache=False))})
    assert order == ["with", "without"] * 3 + ["with"]  # in turns; the longer one finishes alone
    assert [len(r.step_seconds) for r in runs.values()] == [4, 3]
    assert torch.equal(runs["with"].tokens, generate_greedy(model, ids, 4).tokens)
    assert torch.equal(runs["without"].tokens, generate_greedy(model, ids, 3).tokens)  # the same tokens either way


def test_time_generations_times_every_prompt_in_rounds(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    prompts = {n: torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(n)) for n in (4, 30)}
    timings = time_generations(model, prompts, new_tokens=3, warmup=False, repeats=3)
    assert list(timings) == [4, 30]
    for n, t in timings.items():
        assert t.prompt_tokens == n and len(t.prefill_seconds) == 3 and len(t.step_seconds) == 3
        assert t.ttft_s == sorted(t.prefill_seconds)[1]
    with pytest.raises(CourseError, match="repeats must be at least 1"):
        time_generations(model, prompts, repeats=0)


def test_decode_step_times_share_one_cache_per_batch(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    shapes = [(1, 8), (1, 40), (3, 8), (1, 8)]  # a repeated shape is timed once
    steps = decode_step_times(model, shapes, repeats=2)
    assert list(steps) == [(1, 8), (1, 40), (3, 8)]
    assert all(len(t.times_s) == 2 and t.min_s > 0 for t in steps.values())
    assert steps[(1, 8)].threads == torch.get_num_threads()  # a CPU timing says its threads


def test_met_objectives_is_the_one_test_behind_both_goodputs(monkeypatch):
    import math

    from llm_anatomy.measure import timing
    from llm_anatomy.serve import load, metrics
    from llm_anatomy.serve.batching import Request
    from llm_anatomy.server import client

    assert timing.met_objectives(0.5, 0.1, 1.0, 0.2) and not timing.met_objectives(1.5, 0.1, 1.0, 0.2)
    assert not timing.met_objectives(0.5, 0.3, 1.0, 0.2) and timing.met_objectives(1.0, 0.2, 1.0, 0.2)  # at the limit
    assert timing.met_objectives(9.0, 9.0) and timing.met_objectives(0.5, math.nan, 1.0, 0.2)  # no TPOT: one token
    # one request meets both, one misses TTFT, one misses TPOT; the server-side and the client-side goodput agree
    served = []
    for arrival, times in ((0.0, [0.5, 0.6, 0.7]), (0.0, [2.0, 2.1]), (1.0, [1.2, 2.2, 3.2])):
        r = Request([1, 2], len(times), arrival)
        r.output, r.token_times = [3] * len(times), times
        served.append(r)
    from_engine = metrics.serving_metrics(served, ttft_target_s=1.0, tpot_target_s=0.2)
    results = [client.Result(r.arrival_s, 200, r.token_times, len(r.output), "x", r.token_times[-1]) for r in served]
    from_client = client.summarize(results, duration_s=from_engine["seconds"], ttft_slo_s=1.0, tpot_slo_s=0.2)
    assert from_engine["met_targets"] == 1 and from_engine["request_goodput_req_s"] == from_client["request_goodput"]
    assert load.slo_attainment(served, 1.0, 0.2) == 1 / 3
    # every goodput goes through it: a stricter rule moves all three at once
    monkeypatch.setattr(timing, "met_objectives", lambda *args: False)
    for module in (metrics, load, client):
        monkeypatch.setattr(module, "met_objectives", timing.met_objectives)
    assert metrics.serving_metrics(served, 1.0, 0.2)["met_targets"] == 0 and load.slo_attainment(served, 1.0, 0.2) == 0
    assert client.summarize(results, 4.0, 1.0, 0.2)["request_goodput"] == 0
