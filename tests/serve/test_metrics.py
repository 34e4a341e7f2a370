"""Serving traces and their figures: Poisson arrivals, percentiles, goodput; decode speed over batch x context."""

from __future__ import annotations

import math

import numpy as np
import pytest
from llm_anatomy.weights.random import random_llama

from llm_anatomy.serve.batching import Request
from llm_anatomy.errors import CourseError
from llm_anatomy.measure.timing import decode_tokens_per_s
from llm_anatomy.serve.metrics import poisson_trace, serving_metrics
from llm_anatomy.model.scratch import ScratchLlama


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
    assert serving_metrics(reqs)["met_targets"] == 3
    with pytest.raises(CourseError):
        serving_metrics([Request([5], 2)])


def test_decode_speed_is_a_positive_rate():
    model = ScratchLlama.from_hf(random_llama())
    speed = decode_tokens_per_s(model, batch=3, context=40, repeats=2)
    assert math.isfinite(speed) and speed > 0
