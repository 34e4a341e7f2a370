"""Notebook 08's claim cells, run as the notebook holds them on the tiny random model under a cost model's clock:
each holds, and each fails (ClaimFailed) when its evidence is broken on purpose (tests/test_claim_cells.py does the
same for 02-04, tests/test_claim_cells_05_07.py for 05-07)."""

from __future__ import annotations

import types

import pytest

from llm_anatomy.claims import ClaimFailed, claim, reading
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.serve.batching import run_static
from llm_anatomy.serve.cost import StepCost
from llm_anatomy.serve.metrics import poisson_trace, serving_metrics
from llm_anatomy.serve.paged_kv import PagedKVPool
from llm_anatomy.serve.scheduler import ContinuousScheduler
from llm_anatomy.weights.random import random_llama

from test_claim_cells_05_07 import cell_source, run_cells

COST = StepCost(decode_call_s=0.05, decode_row_s=0.004, prefill_call_s=0.06, prefill_token_s=0.0015, context_s=2e-6)
C15_ONE_TRACE = ("08_serving.ipynb", "claim_continuous_frees_rows(static, continuous)")


@pytest.fixture(scope="module")
def served():
    """One trace served by static and by continuous batching (the names cell C15's cell reads)."""
    model = ScratchLlama.from_hf(random_llama())
    trace = poisson_trace(8, 20.0, [4, 8], [2, 2, 3, 12], seed=3, vocab_size=128)  # faster than it is served
    static_calls = []
    static = run_static(model, trace, max_batch=3, cost=COST, calls=static_calls)
    scheduler = ContinuousScheduler(model, PagedKVPool.for_model(model, 16, 4), max_batch=3, cost=COST)
    return dict(COST=COST, static=static, continuous=scheduler.run(trace), static_calls=static_calls,
                scheduler=scheduler, calibration=types.SimpleNamespace(noise_warning=lambda: ""),
                serving_metrics=serving_metrics, claim=claim, reading=reading, display=lambda *a: None,
                print=lambda *a: None, DTYPES="")


def test_08_c15_on_one_trace_holds(served):
    shown = []
    namespace = run_cells(cell_source(*C15_ONE_TRACE), namespace=dict(served, display=shown.append))
    assert len(shown) == 1 and "C15" in str(shown[0]) and "0.00 s under continuous" in str(shown[0])
    assert namespace["figures"]["continuous"]["throughput_tok_s"] > namespace["figures"]["static"]["throughput_tok_s"]


@pytest.mark.counterfactual("C15", "continuous batching that retires a finished request only later (08's cell)")
def test_08_c15_fails_when_a_finished_request_keeps_its_continuous_row(served):
    continuous = [r.fresh() for r in served["continuous"]]
    for mine, theirs in zip(continuous, served["continuous"]):
        mine.output, mine.token_times = theirs.output, theirs.token_times
        mine.finished_s, mine.released_s = theirs.finished_s, theirs.released_s
    continuous[0].released_s += 0.25  # done, but its row given back a quarter of a second later
    with pytest.raises(ClaimFailed, match="0.25 s under continuous"):
        run_cells(cell_source(*C15_ONE_TRACE), namespace=dict(served, continuous=continuous))


class DrainFirst(ContinuousScheduler):
    """Continuous batching that admits only when its whole batch has finished (each request still retires at once)."""

    def _admit(self):
        return super()._admit() if not self.running else []


@pytest.mark.counterfactual("C15", "continuous batching that admits only when its whole batch has finished (08's cell)")
def test_08_c15_fails_when_the_engine_admits_only_into_an_empty_batch(served):
    model = ScratchLlama.from_hf(random_llama())
    trace = poisson_trace(8, 20.0, [4, 8], [2, 2, 3, 12], seed=3, vocab_size=128)
    drained = DrainFirst(model, PagedKVPool.for_model(model, 16, 4), max_batch=3, cost=COST).run(trace)
    assert all(r.released_s == r.finished_s for r in drained)  # it frees every row at once, as continuous batching does
    with pytest.raises(ClaimFailed, match="C15 FAILED.*0 admissions joined a batch already running"):
        run_cells(cell_source(*C15_ONE_TRACE), namespace=dict(served, continuous=drained))
