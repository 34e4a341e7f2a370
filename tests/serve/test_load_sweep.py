"""Load from measured capacity (serve/load.py): service rate, the sweep, DistServe's goodput and claim C15's check."""

from __future__ import annotations

import pytest

from llm_anatomy.claims import ClaimFailed
from llm_anatomy.errors import CourseError
from llm_anatomy.serve.batching import Request
from llm_anatomy.serve.cost import StepCost
from llm_anatomy.serve.load import (claim_short_requests_wait_less, engines, goodput_rate, load_sweep,
                                    service_rate, slo_attainment)
from llm_anatomy.serve.block_manager import pool_blocks
from llm_anatomy.serve.metrics import poisson_trace
from llm_anatomy.serve.paged_kv import PagedKVPool
from llm_anatomy.serve.scheduler import ContinuousScheduler

COST = StepCost(decode_call_s=0.05, decode_row_s=0.004, prefill_call_s=0.06, prefill_token_s=0.0015, context_s=2e-6)
PROMPTS, OUTPUTS = [4, 8, 12], [2, 2, 3, 16]


@pytest.fixture(scope="module")
def servers(tiny):
    return engines(tiny, 3, max(PROMPTS) + max(OUTPUTS), cost=COST, block_size=4)


@pytest.fixture(scope="module")
def sweep(servers):
    base = poisson_trace(10, 1.0, PROMPTS, OUTPUTS, seed=2, vocab_size=128)
    capacity = service_rate(servers["continuous"], base)
    step = COST.decode_step_s(1, 8)
    rows = load_sweep(servers, capacity, 10, PROMPTS, OUTPUTS, fractions=(0.3, 0.7, 1.2), ttft_slo_s=12 * step,
                      tpot_slo_s=2 * step, short_tokens=3, seed=2, vocab_size=128, threads=1)
    return capacity, rows


def test_the_service_rate_is_requests_over_the_time_to_serve_them_all(servers):
    trace = poisson_trace(6, 5.0, PROMPTS, OUTPUTS, seed=1, vocab_size=128)
    rate = service_rate(servers["continuous"], trace)
    served = servers["continuous"]([r.fresh() for r in trace])
    assert rate > 0 and service_rate(servers["continuous"], trace) == rate  # the cost model: the same every time
    assert rate >= len(served) / max(r.token_times[-1] for r in served)  # all waiting at 0 beats the arrivals
    assert service_rate(servers["continuous"], trace) > service_rate(servers["static"], trace)
    with pytest.raises(CourseError, match="at least one request"):
        service_rate(servers["static"], [])


def test_the_sweep_serves_the_same_requests_at_every_rate_with_the_same_tokens(sweep):
    capacity, rows = sweep
    assert [(r["fraction"], r["server"]) for r in rows] == [(f, s) for f in (0.3, 0.7, 1.2)
                                                           for s in ("static", "continuous")]
    assert all(r["rate_req_s"] == pytest.approx(r["fraction"] * capacity) for r in rows)
    assert len({str(r["outputs"]) for r in rows}) == 1  # both servers, every rate: the same greedy tokens
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s",
                "e2e_p99_s"):
        assert all(r[key] >= 0 for r in rows)
    cont = [r for r in rows if r["server"] == "continuous"]
    assert cont[-1]["ttft_p99_s"] > cont[0]["ttft_p99_s"]  # past capacity the queue grows


def test_goodput_is_the_highest_rate_whose_attainment_and_every_lower_ones_meet_the_goal():
    rows = [{"server": "s", "rate_req_s": r, "attainment": a} for r, a in ((1, 1.0), (2, 0.95), (3, 0.8), (4, 0.95))]
    assert goodput_rate(rows, "s") == 2  # 4 req/s met it again, but 3 did not: the goodput stops at 2
    assert goodput_rate(rows, "s", attainment=0.7) == 4
    assert goodput_rate([{"server": "s", "rate_req_s": 1, "attainment": 0.5}], "s") == 0.0


def test_attainment_counts_the_requests_that_met_both_objectives(servers):
    served = servers["continuous"](poisson_trace(6, 5.0, PROMPTS, OUTPUTS, seed=1, vocab_size=128))
    assert slo_attainment(served, 1e9, 1e9) == 1.0 and slo_attainment(served, 0.0, 1e9) == 0.0


def test_c15_holds_on_the_sweep(sweep):
    assert "C15 holds" in str(claim_short_requests_wait_less(sweep[1]))


@pytest.mark.counterfactual("C15", "the 'continuous' engine batches request by request, as static batching does")
def test_c15_fails_when_continuous_batching_waits_like_static_batching(servers):
    # evidence broken: the "continuous" engine batches request by request, as static batching does
    broken = {"static": servers["static"], "continuous": servers["static"]}
    step = COST.decode_step_s(1, 8)
    rows = load_sweep(broken, 3.0, 10, PROMPTS, OUTPUTS, fractions=(0.5, 0.9), ttft_slo_s=12 * step,
                      tpot_slo_s=2 * step, short_tokens=3, seed=2, vocab_size=128, threads=1)
    with pytest.raises(ClaimFailed, match="C15 FAILED"):
        claim_short_requests_wait_less(rows)
    faster = [dict(r, short_ttft_p50_s=r["short_ttft_p50_s"] * (0.5 if r["server"] == "static" else 1)) for r in rows]
    with pytest.raises(ClaimFailed, match="C15 FAILED"):  # static batching's short requests served sooner
        claim_short_requests_wait_less(faster)
    with pytest.raises(CourseError, match="one of them at 0.7x"):
        claim_short_requests_wait_less([r for r in rows if r["fraction"] < 0.7])


class DrainFirst(ContinuousScheduler):
    """Continuous batching that admits only when its whole batch has finished (it still retires each request at
    once): short requests that arrive meanwhile wait for the longest one."""

    def _admit(self):
        return super()._admit() if not self.running else []


@pytest.mark.counterfactual("C15", "continuous batching that admits only when its whole batch has finished")
def test_c15_fails_when_continuous_batching_admits_only_into_an_empty_batch(tiny, servers):
    blocks = pool_blocks([max(PROMPTS) + max(OUTPUTS)] * 3, 4)

    def drain(requests):
        return DrainFirst(tiny, PagedKVPool.for_model(tiny, blocks, 4), 3, cost=COST).run(requests)

    capacity = service_rate(servers["continuous"], poisson_trace(10, 1.0, PROMPTS, OUTPUTS, seed=2, vocab_size=128))
    step = COST.decode_step_s(1, 8)
    rows = load_sweep({"static": servers["static"], "continuous": drain}, capacity, 10, PROMPTS, OUTPUTS,
                      fractions=(0.3, 0.7, 1.0), ttft_slo_s=12 * step, tpot_slo_s=2 * step, short_tokens=3, seed=2,
                      vocab_size=128, threads=1)
    with pytest.raises(ClaimFailed, match="C15 FAILED"):
        claim_short_requests_wait_less(rows)


def test_a_sweep_without_short_requests_or_a_capacity_is_refused(servers):
    with pytest.raises(CourseError, match="short_tokens"):
        load_sweep(servers, 1.0, 4, PROMPTS, [16], ttft_slo_s=1, tpot_slo_s=1, short_tokens=3, vocab_size=128)
    with pytest.raises(CourseError, match="capacity > 0"):
        load_sweep(servers, 0.0, 4, PROMPTS, OUTPUTS, ttft_slo_s=1, tpot_slo_s=1, short_tokens=3, vocab_size=128)


# The same story on an idle and on a busy machine: a busy machine calibrates a slower cost model, and one whose fixed
# cost per call grows most (every small op waits for its turn on a core). C15's verdict must not turn over.
BUSY = {"idle": COST,
        "busy, 4x slower throughout": StepCost(*(4 * v for v in vars(COST).values())),
        "busy, fixed costs 8x, the rest 2x": StepCost(decode_call_s=8 * COST.decode_call_s,
                                                      decode_row_s=2 * COST.decode_row_s,
                                                      prefill_call_s=8 * COST.prefill_call_s,
                                                      prefill_token_s=2 * COST.prefill_token_s,
                                                      context_s=2 * COST.context_s),
        "busy, a prefill call's fixed cost 80x": StepCost(decode_call_s=8 * COST.decode_call_s,
                                                          decode_row_s=2 * COST.decode_row_s,
                                                          prefill_call_s=80 * COST.prefill_call_s,
                                                          prefill_token_s=2 * COST.prefill_token_s,
                                                          context_s=2 * COST.context_s)}


@pytest.mark.parametrize("machine", list(BUSY))
def test_c15_tells_the_same_story_on_an_idle_and_a_busy_machine(tiny, machine):
    cost = BUSY[machine]
    servers = engines(tiny, 3, max(PROMPTS) + max(OUTPUTS), cost=cost, block_size=4)
    capacity = service_rate(servers["continuous"], poisson_trace(10, 1.0, PROMPTS, OUTPUTS, seed=2, vocab_size=128))
    step = cost.decode_step_s(1, 8)
    rows = load_sweep(servers, capacity, 10, PROMPTS, OUTPUTS, fractions=(0.3, 0.7, 1.2), ttft_slo_s=12 * step,
                      tpot_slo_s=2 * step, short_tokens=3, seed=2, vocab_size=128, threads=1)
    assert "C15 holds" in str(claim_short_requests_wait_less(rows))


def test_the_steady_state_rate_leaves_out_the_ramp_up_and_the_drain(servers):
    """A burst's rate from time 0 counts the drain tail, where the batch runs part empty; cutting the first and last
    10% of completions reads the steady rate, higher for a short burst, close for a long one."""
    trace = poisson_trace(60, 1.0, PROMPTS, OUTPUTS, seed=2, vocab_size=128)
    whole = service_rate(servers["continuous"], trace)
    steady = service_rate(servers["continuous"], trace, trim=0.1)
    served = sorted(r.token_times[-1] for r in servers["continuous"](
        [Request(r.prompt, r.max_new_tokens, 0.0, r.eos_token_id) for r in trace]))
    assert steady == pytest.approx((53 - 6) / (served[53] - served[6]))  # the 7th to the 54th completion of 60
    assert steady > whole
    assert service_rate(servers["continuous"], trace[:9], trim=0.1) == service_rate(servers["continuous"], trace[:9])
    for bad in (-0.1, 0.5):
        with pytest.raises(CourseError, match="trim"):
            service_rate(servers["continuous"], trace, trim=bad)


def test_goodput_above_capacity_is_refused_as_a_measurement_error():
    from llm_anatomy.serve.load import goodput_within_capacity

    # CI's run before steady state: capacity from a 12-request burst, goodput read off 48-request traces
    with pytest.raises(CourseError, match="continuous met its objectives faster than it can serve"):
        goodput_within_capacity({"static": 2.44, "continuous": 5.57}, {"static": 2.49, "continuous": 3.48})
    said = goodput_within_capacity({"static": 1.20, "continuous": 2.40}, {"static": 1.67, "continuous": 2.40})
    assert said == "goodput within capacity: static 1.20 of 1.67 req/s, continuous 2.40 of 2.40 req/s"
