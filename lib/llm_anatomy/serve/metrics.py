"""Serving traces and their figures: Poisson arrivals, throughput, TTFT and TPOT percentiles, goodput (C15), and the
KV memory utilisation of paged blocks against reserving the longest length (C14): simulated on a length
distribution (a reading), and read off an engine's own pool over a run (the claim).

TTFT here is what a user waits for the first token: from the request's arrival, queueing included (notebook 07's
TTFT is the prefill alone). TPOT is the mean gap between a request's later tokens (measure.timing.mean_token_gap_s;
notebook 07's TPOT is the median decode step). Percentiles are over requests:
p50 is the typical user, p99 the unluckiest one in a hundred. Goodput counts only requests that met the latency
targets: a server that is fast on average but keeps some users waiting scores low.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..claims import claim, reading
from ..device import timed
from ..errors import CourseError
from ..measure.timing import met_objectives
from .batching import Request
from .block_manager import pool_blocks
from .paged_kv import blocks_for


def poisson_trace(n: int, rate_per_s: float, prompt_lengths, output_lengths, *, seed: int = 0,
                  vocab_size: int = 49152, tokens=None) -> list[Request]:
    """`n` requests arriving as a Poisson process (exponential gaps, mean 1 / rate_per_s seconds; the first at 0).

    Each request's prompt and output lengths are drawn from the lists given (repeat a value to weight it). Prompts
    are windows of `tokens` (a long list of real token ids) when given, else random ids in 3 .. vocab_size - 1.
    """
    if n < 1 or rate_per_s <= 0:
        raise CourseError(f"A trace needs n >= 1 requests and a rate > 0, not {n} and {rate_per_s}.")
    rng = np.random.default_rng(seed)
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate_per_s, n - 1))])
    p_len, o_len = rng.choice(list(prompt_lengths), n), rng.choice(list(output_lengths), n)
    if tokens is not None and len(tokens) <= max(p_len):
        raise CourseError(f"`tokens` holds {len(tokens)} ids: too few for prompts of {max(p_len)}.")
    out = []
    for i in range(n):
        if tokens is not None:
            start = int(rng.integers(0, len(tokens) - p_len[i]))
            prompt = [int(t) for t in tokens[start:start + p_len[i]]]
        else:
            prompt = rng.integers(3, vocab_size, int(p_len[i])).tolist()
        out.append(Request(prompt, int(o_len[i]), float(arrivals[i]), id=i))
    return out


def serving_metrics(requests, ttft_target_s: float | None = None, tpot_target_s: float | None = None) -> dict:
    """Throughput (output tokens/s from the first arrival to the last token), TTFT and TPOT at p50 and p99 (s),
    and the request goodput (vLLM's `bench serve`): requests per second that met both latency targets
    (measure.timing.met_objectives; a None target is always met). Also ITL (every gap between two tokens of a request,
    all requests together) and end-to-end latency at p50 and p99 (s). DistServe's goodput, the highest rate at which
    90% meet them, is serve/load.goodput_rate."""
    served = [r for r in requests if r.token_times]
    if not served:
        raise CourseError("No request has produced a token yet: run the scheduler first.")
    seconds = max(r.token_times[-1] for r in served) - min(r.arrival_s for r in served)
    tokens = sum(len(r.output) for r in served)
    ttft = [r.ttft_s for r in served]
    tpot = [r.mean_token_gap_s for r in served if len(r.output) > 1] or [0.0]  # a one-token answer has no TPOT
    itl = [gap for r in served for gap in r.inter_token_gaps_s] or [0.0]
    e2e = [r.end_to_end_s for r in served]
    good = [r for r in served if met_objectives(r.ttft_s, r.mean_token_gap_s, ttft_target_s, tpot_target_s)]
    out = {"requests": len(served), "output_tokens": tokens, "seconds": seconds,
           "throughput_tok_s": tokens / seconds if seconds > 0 else math.inf,
           "request_goodput_req_s": len(good) / seconds if seconds > 0 else math.inf, "met_targets": len(good)}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        out[f"{name}_p50_s"], out[f"{name}_p99_s"] = map(float, np.percentile(values, [50, 99]))
    return out


def rows_held_when_done_s(requests) -> float:
    """Seconds that finished requests kept a row of a batch after their last token (released_s - finished_s),
    all requests together: the row computed for nobody meanwhile."""
    return sum(r.released_s - r.finished_s for r in requests
               if r.finished_s is not None and r.released_s is not None)


def joined_running_batch(requests) -> int:
    """How many admissions of `requests` (one per span, Request.spans) joined a batch that was already running: they
    began while another request's span was strictly under way. Static batching starts every request of a batch at
    once, after the batch before it has ended (0); an engine that admits only when its batch has drained, too."""
    spans = [(start, end, r) for r in requests for _, start, end in r.spans]
    return sum(any(s < start < e for s, e, other in spans if other is not r) for start, _, r in spans)


def claim_continuous_frees_rows(static, continuous):
    """C15 on one trace served both ways, both halves of "admits and retires requests every step": the same tokens;
    some requests joined a batch already running under continuous batching (none can under static batching, nor
    under an engine that admits only when its batch has drained); every finished request gave its row back at once
    (0 s held) while static batching kept some rows for nobody; and continuous batching served more output tokens
    per second. Every figure of the evidence is read from the two runs. Raises ClaimFailed otherwise."""
    same = [r.output for r in static] == [r.output for r in continuous]
    held_static, held_continuous = rows_held_when_done_s(static), rows_held_when_done_s(continuous)
    joined = joined_running_batch(continuous)
    speedup = serving_metrics(continuous)["throughput_tok_s"] / serving_metrics(static)["throughput_tok_s"]
    return claim("C15", same and joined > 0 and held_continuous == 0 < held_static and speedup > 1,
                 f"the same greedy tokens for all {len(static)} requests: {same}; {joined} admissions joined a batch "
                 f"already running under continuous batching ({joined_running_batch(static)} under static); finished "
                 f"requests held a row for {held_static:.2f} s in all under static batching, {held_continuous:.2f} s "
                 f"under continuous batching; continuous batching served {speedup:.2f}x the tokens/s of static "
                 "batching")


def claim_same_tokens(runs: dict, what: str):
    """C15: every way of serving the same requests gave the same greedy tokens. runs: {name: outputs, one list of
    token ids per request, in the same order}; what: the requests, in words. Raises ClaimFailed otherwise (a chunk
    that reads the wrong tokens or positions, a scheduler that mixes up its rows)."""
    outputs = list(runs.values())
    same = len(outputs) > 1 and all(o == outputs[0] for o in outputs[1:])
    names = list(runs)
    return claim("C15", same, f"{what}: {', '.join(names[:-1])} and {names[-1]} give the same greedy tokens: {same}")


def simulate_utilisation(lengths_final: list[int], max_len: int, block_size: int) -> dict:
    """KV memory utilisation (positions holding a token / positions reserved) of two ways to hold requests.

    lengths_final: each request's length (prompt + output tokens) when it finishes.
    reserve_max: every request reserves max_len positions up front (a contiguous cache per request).
    paged: every request holds blocks_for(length, block_size) blocks of block_size positions.
    Returns tokens, reserve_max_slots, paged_slots, paged_blocks, and the two utilisations (0 to 1).
    """
    if not lengths_final:
        raise CourseError("lengths_final is empty: give the final length of at least one request.")
    if max_len < 1 or block_size < 1:
        raise CourseError(f"max_len and block_size must be at least 1, not {max_len} and {block_size}.")
    if min(lengths_final) < 0 or max(lengths_final) > max_len:
        raise CourseError(f"Every length must be from 0 to max_len = {max_len}; got {min(lengths_final)} "
                          f"to {max(lengths_final)}.")
    tokens = sum(lengths_final)
    blocks = sum(blocks_for(n, block_size) for n in lengths_final)
    reserved, paged = len(lengths_final) * max_len, blocks * block_size
    return {"tokens": tokens, "reserve_max_slots": reserved, "paged_slots": paged, "paged_blocks": blocks,
            "reserve_max_utilisation": tokens / reserved, "paged_utilisation": tokens / paged if paged else 1.0}


# ShareGPT, as the vLLM paper (Kwon et al., SOSP 2023, section 6.1) reports it: mean 161 prompt and 338 output tokens
SHAREGPT_MEAN_PROMPT, SHAREGPT_MEAN_OUTPUT = 161.31, 337.99


def sharegpt_like_lengths(n: int, seed: int, max_len: int = 2048, sigma: float = 1.0) -> list[int]:
    """`n` final lengths (prompt + output tokens), each part log-normal with ShareGPT's published mean and shape
    parameter `sigma` (a heavy tail: a few long ones among many short), at least 1 token each, capped at max_len."""
    if n < 1 or max_len < 2 or sigma <= 0:
        raise CourseError(f"Use n >= 1, max_len >= 2 and sigma > 0, not {n}, {max_len} and {sigma}.")
    rng = np.random.default_rng(seed)
    mu = lambda mean: math.log(mean) - sigma ** 2 / 2  # noqa: E731  a log-normal's mean is exp(mu + sigma^2 / 2)
    prompt = rng.lognormal(mu(SHAREGPT_MEAN_PROMPT), sigma, n)
    output = rng.lognormal(mu(SHAREGPT_MEAN_OUTPUT), sigma, n)
    return np.clip(np.round(prompt + output), 1, max_len).astype(int).tolist()


def utilisation_reading(lengths_final: list[int], max_len: int, block_size: int = 16):
    """A reading (never asserted) of simulate_utilisation on a length distribution: the share of KV memory that holds
    real tokens when every request reserves max_len, and in paged blocks of `block_size`. It counts blocks_for() over
    lengths drawn from an assumed shape, so it shows what paging would buy on such traffic, not what an engine did:
    claim_pool_holds_real_tokens reads the engine's own pool."""
    u = simulate_utilisation(lengths_final, max_len, block_size)
    return reading("C14", f"{len(lengths_final):,} requests, {u['tokens']:,} real tokens: reserving {max_len:,} "
                          f"positions each would use {u['reserve_max_utilisation']:.1%} of the KV memory, paged blocks "
                          f"of {block_size} {u['paged_utilisation']:.1%} (the vLLM paper: 20-38% before, over 90% "
                          "paged)")


@dataclass
class PoolUse:
    """What a paged engine's pool held after each of its iterations (one entry per iteration): the blocks in use
    (the allocator's count, each block once however many hold it), the positions whose K and V its running requests
    have cached, and how many requests were running (a contiguous cache would have reserved max_len for each)."""

    block_size: int
    held_blocks: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)

    def figures(self, max_len: int) -> dict:
        """Over the run (every iteration counted once): tokens, held and reserved positions summed over iterations,
        the pool's and reserving's utilisation (tokens / positions), held / reserved, the peaks, and the most
        positions the pool held beyond its tokens per running request at any iteration (the waste per request)."""
        tokens, held = sum(self.tokens), sum(self.held_blocks) * self.block_size
        reserved = sum(self.rows) * max_len
        waste = [(h * self.block_size - t) / r for h, t, r in zip(self.held_blocks, self.tokens, self.rows) if r]
        return {"iterations": len(self.rows), "tokens": tokens, "held": held, "reserved": reserved,
                "paged_utilisation": tokens / held if held else 1.0,
                "reserve_utilisation": tokens / reserved if reserved else 1.0,
                "held_over_reserved": held / reserved if reserved else 0.0,
                "peak_held": max(self.held_blocks, default=0) * self.block_size,
                "peak_reserved": max(self.rows, default=0) * max_len, "worst_waste_per_request": max(waste, default=0)}


def run_reading_pool(scheduler, requests) -> tuple[list[Request], PoolUse]:
    """Serve fresh copies of `requests` on `scheduler` (a ContinuousScheduler) as its run() does, and read its pool
    after every iteration: the blocks in use (its allocator) and the positions its running requests have cached
    (each Admission's `computed`). Returns (the served requests, in the order given; the PoolUse)."""
    capacity = scheduler.pool.num_blocks * scheduler.pool.block_size
    for r in requests:  # every request is checked before any is queued, as run() does
        scheduler.check(r, capacity)
    fresh = [r.fresh() for r in requests]
    for r in fresh:
        scheduler.submit(r)
    pool, use = scheduler.pool, PoolUse(scheduler.pool.block_size)
    while scheduler.has_unfinished():
        scheduler.step()
        use.held_blocks.append(pool.num_blocks - pool.allocator.num_free)
        use.tokens.append(sum(a.computed for a in scheduler.running))
        use.rows.append(len(scheduler.running))
    return fresh, use


HELD_OVER_RESERVED = 0.85  # the most of the reserved memory a paged pool may hold (see claim_pool_holds_real_tokens)


def claim_pool_holds_real_tokens(use: PoolUse, max_len: int):
    """C14 on an engine's own pool over a run (run_reading_pool), against a contiguous engine that reserves max_len
    positions for every request it runs (the same requests at the same iterations):

    at every iteration the pool held less than one block per running request beyond the tokens cached (only each
    request's last block is partly empty), and over the run it held at most 0.85 of the positions reserving max_len
    would have held. A pool that reserves max_len per request, or blocks as large as max_len, holds 1.0 of it (and a
    pool that books a request's whole answer at admission holds many empty blocks per request); notebook 08's CPU
    trace measured 0.73, its GPU trace 0.44, under cost models of an idle and of busy machines alike (the schedule,
    not the speed, sets what is held). Raises ClaimFailed otherwise."""
    f = use.figures(max_len)
    if not f["reserved"]:
        raise CourseError("The pool was read at no iteration with a request running: serve some requests first.")
    per_block = f["worst_waste_per_request"] < use.block_size
    held_less = f["held_over_reserved"] <= HELD_OVER_RESERVED
    return claim("C14", per_block and held_less,
                 f"over {f['iterations']} iterations the engine's pool held {f['held']:,} block positions for "
                 f"{f['tokens']:,} cached tokens ({f['paged_utilisation']:.0%} real), where reserving {max_len:,} "
                 f"per running request would have held {f['reserved']:,} ({f['reserve_utilisation']:.0%} real): "
                 f"{f['held_over_reserved']:.2f} of it (at most {HELD_OVER_RESERVED}: {held_less}); at worst "
                 f"{f['worst_waste_per_request']:.1f} empty positions per running request, under one block of "
                 f"{use.block_size}: {per_block}; peak {f['peak_held']:,} positions held against "
                 f"{f['peak_reserved']:,}")


def transformers_generate_batch(hf_model, prompts: list[list[int]], max_new_tokens: int, block_size: int = 16):
    """(seconds, greedy outputs) of transformers' own continuous-batching engine, `model.generate_batch`.

    Every prompt is submitted at once; EOS is ignored so that each writes max_new_tokens, as our requests do. Its paged
    cache is sized for these requests (page_size = block_size) and it skips the warm-up that captures CUDA graphs.
    """
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    if not hasattr(hf_model, "generate_batch"):
        raise CourseError("This transformers has no generate_batch (continuous batching): transformers >= 5 has it.")
    size = max(4, block_size)  # transformers wants pages of at least 4 tokens
    blocks = pool_blocks([len(p) + max_new_tokens for p in prompts], size)
    config = ContinuousBatchingConfig(page_size=size, num_blocks=blocks, max_batch_tokens=256, use_cuda_graph=False)
    generation = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    inputs = [list(p) for p in prompts]
    seconds, out = timed(lambda: hf_model.generate_batch(inputs=inputs, generation_config=generation,
                                                         continuous_batching_config=config, warmup=False),
                         hf_model.device)
    results = list(out.values())
    if len(results) != len(prompts) or any(r.error for r in results):
        raise CourseError(f"transformers' generate_batch returned {len(results)} of {len(prompts)} results "
                          f"({[r.error for r in results if r.error]}).")
    return seconds, [list(r.generated_tokens) for r in results]
