"""Load from measured capacity: an engine's service rate first, then arrival rates as stated fractions of it (C15).

A latency figure means nothing without the load it was taken at. Below capacity a server keeps up and a request
waits only for its own work; past it the queue grows without bound and every latency with it, whatever the
scheduler. So we measure the service rate first (`service_rate`: every request of a long trace waiting at time 0,
how many requests per second the engine finishes at steady state, leaving out the ramp-up and the drain tail), then
send Poisson traces of a few hundred requests at fractions of it (`load_sweep`, 0.3x to 2x in notebook 08) and read
TTFT, TPOT, ITL and end-to-end latency at p50 and p99 against the rate, static against continuous. Goodput cannot
exceed the capacity (`goodput_within_capacity`): a sweep that says otherwise measured one or the other wrong.

Goodput, as DistServe (Zhong et al., OSDI 2024) defines it: the highest request rate at which a target share of
requests (90% here) meet both latency objectives (TTFT and TPOT); `goodput_rate` reads it off a sweep, to the
resolution of the rates swept.
"""

from __future__ import annotations

import numpy as np

from ..claims import Verdict, claim
from ..device import torch_threads
from ..errors import CourseError
from ..measure.timing import met_objectives
from .batching import Request, run_static
from .metrics import joined_running_batch, poisson_trace, serving_metrics
from .block_manager import pool_blocks
from .paged_kv import PagedKVPool
from .scheduler import ContinuousScheduler

SWEEP = (0.3, 0.5, 0.7, 0.9, 1.0, 1.2)  # arrival rate / service rate (bench serving; notebook 08 goes to 2x)
ATTAINMENT = 0.9  # DistServe's goal: 90% of requests meet both objectives
TRIM = 0.1  # service_rate: the share of completions left out at each end of a burst (ramp-up, drain)


def engines(model, max_batch: int, max_len: int, cost=None, max_batched_tokens: int | None = None,
            block_size: int = 16) -> dict:
    """{"static": serve, "continuous": serve}: functions from a list of requests to the served copies, both with
    `max_batch` rows, the continuous one over a pool that holds max_batch requests of max_len positions."""
    blocks = pool_blocks([max_len] * max_batch, block_size)

    def continuous(requests):
        pool = PagedKVPool.for_model(model, blocks, block_size)
        return ContinuousScheduler(model, pool, max_batch, max_batched_tokens, cost=cost).run(requests)

    return {"static": lambda requests: run_static(model, requests, max_batch, cost=cost), "continuous": continuous}


def service_rate(serve, requests, trim: float = 0.0) -> float:
    """Requests per second `serve` finishes when every request of `requests` waits from time 0 (the engine's capacity
    on this mix of lengths). trim=0: all of them over the time to the last completion, which counts the ramp-up and
    the drain tail, where the batch runs part empty. trim > 0: at steady state, the completions between the first and
    the last `trim` of them over the time between those two (notebook 08 cuts 10% at each end of a burst of 240 and
    prints both figures: a short burst reads well below the steady rate). A burst of fewer than 1 / trim requests
    has nothing to cut, and reads as trim=0."""
    if not requests:
        raise CourseError("Give at least one request to measure a service rate with.")
    if not 0 <= trim < 0.5:
        raise CourseError(f"trim must be at least 0 and below 0.5 (a share cut from each end), not {trim}.")
    waiting = [Request(r.prompt, r.max_new_tokens, 0.0, r.eos_token_id) for r in requests]
    finished = sorted(r.token_times[-1] for r in serve(waiting))
    first = int(len(finished) * trim)
    if first == 0:
        return len(finished) / finished[-1]
    last = len(finished) - 1 - first
    return (last - first) / (finished[last] - finished[first])


def slo_attainment(requests, ttft_slo_s: float, tpot_slo_s: float) -> float:
    """The share of requests (0 to 1) that met both objectives: TTFT <= ttft_slo_s and TPOT <= tpot_slo_s."""
    met = [met_objectives(r.ttft_s, r.mean_token_gap_s, ttft_slo_s, tpot_slo_s) for r in requests]
    return sum(met) / len(met)


def load_sweep(servers: dict, capacity_req_s: float, n: int, prompt_lengths, output_lengths, *,
               fractions=SWEEP, ttft_slo_s: float, tpot_slo_s: float, short_tokens: int, seed: int = 0,
               vocab_size: int = 49152, tokens=None, threads: int | None = None) -> list[dict]:
    """Serve one Poisson trace per fraction of `capacity_req_s` with every server; a row per (fraction, server).

    Each row: fraction, rate_req_s, server, serving_metrics' figures (p50/p99 of TTFT, TPOT, ITL, end-to-end),
    attainment (share meeting both objectives), short_ttft_p50_s (requests with max_new_tokens <= short_tokens),
    joined_running (admissions that joined a batch already running: metrics.joined_running_batch), and the
    outputs (to check that both servers gave the same tokens). The same seed at every rate: only the gaps
    between arrivals change with the rate, never the requests. threads: torch threads while it serves (torch_threads).
    """
    if capacity_req_s <= 0 or not fractions or min(fractions) <= 0:
        raise CourseError(f"Give a capacity > 0 and fractions > 0, not {capacity_req_s} and {list(fractions)}.")
    rows = []
    with torch_threads(threads):
        for fraction in fractions:
            rows += _serve_at(servers, fraction, capacity_req_s, n, prompt_lengths, output_lengths, ttft_slo_s,
                              tpot_slo_s, short_tokens, seed, vocab_size, tokens)
    return rows


def _serve_at(servers, fraction, capacity_req_s, n, prompt_lengths, output_lengths, ttft_slo_s, tpot_slo_s,
              short_tokens, seed, vocab_size, tokens) -> list[dict]:
    """One trace at fraction x capacity, served by every server: its rows of the sweep."""
    rows = []
    trace = poisson_trace(n, fraction * capacity_req_s, prompt_lengths, output_lengths, seed=seed,
                          vocab_size=vocab_size, tokens=tokens)
    shorts = [i for i, r in enumerate(trace) if r.max_new_tokens <= short_tokens]
    if not shorts:
        raise CourseError(f"No request of the trace has max_new_tokens <= short_tokens = {short_tokens}.")
    for name, serve in servers.items():
        served = serve(trace)
        rows.append({"fraction": fraction, "rate_req_s": fraction * capacity_req_s, "server": name,
                     **serving_metrics(served, ttft_slo_s, tpot_slo_s),
                     "attainment": slo_attainment(served, ttft_slo_s, tpot_slo_s),
                     "short_ttft_p50_s": float(np.median([served[i].ttft_s for i in shorts])),
                     "joined_running": joined_running_batch(served),
                     "outputs": [r.output for r in served]})
    return rows


def goodput_rate(rows, server: str, attainment: float = ATTAINMENT) -> float:
    """DistServe's goodput of `server` from a sweep: the highest swept rate (req/s) at which, and at every lower
    swept rate, at least `attainment` of requests met both objectives; 0.0 when even the lowest rate missed."""
    best = 0.0
    for row in sorted((r for r in rows if r["server"] == server), key=lambda r: r["rate_req_s"]):
        if row["attainment"] < attainment:
            break
        best = row["rate_req_s"]
    return best


def goodput_within_capacity(goodput: dict, capacity: dict) -> str:
    """Each engine's goodput (req/s, goodput_rate) against its capacity (req/s, service_rate): no engine meets its
    objectives, for long, at a rate it cannot serve, so a goodput above the capacity means one of the two was measured
    wrong (a capacity read off a short burst's drain tail; a trace too short for a queue to build). Raises CourseError
    then; else returns the sentence that says so."""
    over = [name for name in goodput if goodput[name] > capacity[name]]
    text = ", ".join(f"{name} {goodput[name]:.2f} of {capacity[name]:.2f} req/s" for name in goodput)
    if over:
        raise CourseError(f"Goodput above capacity ({text}): {', '.join(over)} met its objectives faster than it can "
                          "serve, so the capacity or the sweep is measured wrong.")
    return f"goodput within capacity: {text}"


def claim_short_requests_wait_less(rows, up_to: float = 1.0, strictly_from: float = 0.7) -> Verdict:
    """C15 on a sweep: at every load up to `up_to` x capacity, short requests' TTFT p50 is no higher under continuous
    batching than under static batching at the same rate (the same trace), and lower from `strictly_from` x on,
    where arrivals meet a running batch (at light load both engines are idle when a request comes, and both give it
    its prefill at once); and from `strictly_from` x on, some requests joined a batch already running under continuous
    batching (the mechanism: an engine that admits only into an empty batch also serves short requests a little
    sooner than static batching, since it retires rows early and pads nothing, but nobody ever joins its running
    batch). Raises ClaimFailed otherwise."""
    pairs, joined = {}, {}
    for row in rows:
        if row["fraction"] <= up_to:
            pairs.setdefault(row["fraction"], {})[row["server"]] = row["short_ttft_p50_s"]
            if row["server"] == "continuous":
                joined[row["fraction"]] = row.get("joined_running", 0)
    if not any(f >= strictly_from for f in pairs) or any(set(p) != {"static", "continuous"} for p in pairs.values()):
        raise CourseError(f"The sweep needs a static and a continuous row at each load, one of them at "
                          f"{strictly_from}x or more.")
    sooner = all(p["continuous"] < p["static"] if f >= strictly_from else p["continuous"] <= p["static"]
                 for f, p in pairs.items())
    joins = all(joined[f] > 0 for f in pairs if f >= strictly_from)
    text = ", ".join(f"{f:g}x: {1e3 * p['continuous']:.0f} vs {1e3 * p['static']:.0f} ms"
                     for f, p in sorted(pairs.items()))
    return claim("C15", sooner and joins,
                 f"short requests' TTFT p50, continuous vs static at the same load: {text} (lower from "
                 f"{strictly_from:g}x, never higher: {sooner}); admissions into a batch already running under "
                 "continuous batching: " + ", ".join(f"{joined[f]} at {f:g}x" for f in sorted(joined))
                 + f" (some at every load from {strictly_from:g}x: {joins})")
