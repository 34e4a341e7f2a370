"""Serving traces and their figures: Poisson arrivals, throughput, TTFT and TPOT percentiles, goodput (C15), and the
KV memory utilisation of paged blocks against reserving the longest length (C14).

TTFT here is what a user waits for the first token: from the request's arrival, queueing included (notebook 07's
TTFT is the prefill alone). TPOT is the mean gap between a request's later tokens (measure.timing.mean_token_gap_s;
notebook 07's TPOT is the median decode step). Percentiles are over requests:
p50 is the typical user, p99 the unluckiest one in a hundred. Goodput counts only requests that met the latency
targets: a server that is fast on average but keeps some users waiting scores low.
"""

from __future__ import annotations

import math

import numpy as np

from ..claims import claim
from ..device import timed
from ..errors import CourseError
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
    and goodput: requests per second that met both latency targets (a None target is always met). Also ITL (every
    gap between two tokens of a request, all requests together) and end-to-end latency at p50 and p99 (s)."""
    served = [r for r in requests if r.token_times]
    if not served:
        raise CourseError("No request has produced a token yet: run the scheduler first.")
    seconds = max(r.token_times[-1] for r in served) - min(r.arrival_s for r in served)
    tokens = sum(len(r.output) for r in served)
    ttft = [r.ttft_s for r in served]
    tpot = [r.mean_token_gap_s for r in served if len(r.output) > 1] or [0.0]  # a one-token answer has no TPOT
    itl = [gap for r in served for gap in r.inter_token_gaps_s] or [0.0]
    e2e = [r.end_to_end_s for r in served]
    good = [r for r in served if (ttft_target_s is None or r.ttft_s <= ttft_target_s)
            and (tpot_target_s is None or r.mean_token_gap_s <= tpot_target_s)]
    out = {"requests": len(served), "output_tokens": tokens, "seconds": seconds,
           "throughput_tok_s": tokens / seconds if seconds > 0 else math.inf,
           "goodput_req_s": len(good) / seconds if seconds > 0 else math.inf, "met_targets": len(good)}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        out[f"{name}_p50_s"], out[f"{name}_p99_s"] = map(float, np.percentile(values, [50, 99]))
    return out


def rows_held_when_done_s(requests) -> float:
    """Seconds that finished requests kept a row of a batch after their last token (released_s - finished_s),
    all requests together: the row computed for nobody meanwhile."""
    return sum(r.released_s - r.finished_s for r in requests
               if r.finished_s is not None and r.released_s is not None)


def claim_continuous_frees_rows(static, continuous):
    """C15 on one trace served both ways: the same tokens, every finished request gave its row back at once under
    continuous batching (0 s held) while static batching kept some rows for nobody, and continuous batching served
    more output tokens per second. Every figure of the evidence is read from the two runs. Raises ClaimFailed
    otherwise."""
    same = [r.output for r in static] == [r.output for r in continuous]
    held_static, held_continuous = rows_held_when_done_s(static), rows_held_when_done_s(continuous)
    speedup = serving_metrics(continuous)["throughput_tok_s"] / serving_metrics(static)["throughput_tok_s"]
    return claim("C15", same and held_continuous == 0 < held_static and speedup > 1,
                 f"the same greedy tokens for all {len(static)} requests: {same}; finished requests held a row for "
                 f"{held_static:.2f} s in all under static batching, {held_continuous:.2f} s under continuous "
                 f"batching; continuous batching served {speedup:.2f}x the tokens/s of static batching")


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


def claim_paged_holds_real_tokens(lengths_final: list[int], max_len: int, block_size: int = 16):
    """C14 on a length distribution: paged blocks of `block_size` hold real tokens in >= 90% of their positions,
    reserving max_len per request in <= 38% (the vLLM paper's figures). Raises ClaimFailed otherwise."""
    u = simulate_utilisation(lengths_final, max_len, block_size)
    return claim("C14", u["paged_utilisation"] >= 0.9 and u["reserve_max_utilisation"] <= 0.38,
                 f"{len(lengths_final):,} requests, {u['tokens']:,} real tokens: reserving {max_len:,} positions each "
                 f"uses {u['reserve_max_utilisation']:.1%} of the KV memory, paged blocks of {block_size} use "
                 f"{u['paged_utilisation']:.1%} (the vLLM paper: 20-38% before, over 90% paged)")


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
