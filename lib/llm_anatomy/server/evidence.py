"""The checks behind notebook 11's claims, each a function of the measured evidence, so that a test can hand it
broken evidence and see it fail (tests/server/test_evidence.py).

C24: the stream is the decode loop: each chunk a client received carries the text of one step of the same prompt
     stepped in the notebook (the first from the prefill), in order, nothing merged or lost; and a client's TTFT holds
     the engine's TTFT (queueing and prefill) plus the server's own work, and TTFT grows with the load: the median at
     the highest offered rate is well above the one at the lowest.
C25: a bounded queue turns overload into fast refusals (some 429s, each answered faster than an admitted request's
     first token, and a lower p99 TTFT than the unbounded queue's), and a cancelled stream's KV blocks are free again.
C16 (notebook 08's claim, seen through the API): every request whose system prompt the prefix cache has seen reports
     cached tokens (`usage.prompt_tokens_details.cached_tokens`), and every request with a new one reports none.
"""

from __future__ import annotations

from ..claims import Verdict, claim

GROWTH = 1.5  # "grows with load": the median TTFT at the highest rate at least 1.5x the one at the lowest


def stream_claim(pieces: list[str], stepped: list[str]) -> Verdict:
    """C24's first part from the text of each streamed chunk (pieces) and the text of each step's token of the same
    prompt stepped greedily (stepped: the prefill's token first, the end of the turn left out)."""
    same = bool(pieces) and pieces == stepped
    first = next((i for i, (a, b) in enumerate(zip(pieces, stepped)) if a != b), min(len(pieces), len(stepped)))
    return claim("C24", same,
                 f"{len(pieces)} chunks with text, {len(stepped)} steps (1 prefill + {max(len(stepped) - 1, 0)} decode "
                 f"steps); " + ("each chunk is one step's token" if same else
                                f"they part at chunk {first}: {pieces[first:first + 1]} against {stepped[first:first + 1]}"))


def ttft_claim(client_ttft_s: list[float], engine_ttft_s: list[float], ttft_by_rate: dict[float, float],
               source: str = "measured") -> Verdict:
    """C24 from pairs of (client, engine) TTFT of the same requests, seconds, and the median TTFT per offered rate
    (requests per second -> seconds), measured or (source="modelled") from a cost model calibrated on measured
    step times, which a busy moment of the machine cannot turn around."""
    nested = bool(client_ttft_s) and len(client_ttft_s) == len(engine_ttft_s) and all(
        c >= e for c, e in zip(client_ttft_s, engine_ttft_s))
    low, high = min(ttft_by_rate), max(ttft_by_rate)
    grows = ttft_by_rate[high] >= GROWTH * ttft_by_rate[low]
    worst = min((c - e for c, e in zip(client_ttft_s, engine_ttft_s)), default=float("nan"))
    return claim("C24", nested and grows and low < high,
                 f"client TTFT >= engine TTFT in {sum(c >= e for c, e in zip(client_ttft_s, engine_ttft_s))} of "
                 f"{len(client_ttft_s)} requests (smallest difference {worst * 1e3:.1f} ms); {source} median TTFT "
                 f"{ttft_by_rate[low] * 1e3:.0f} ms at {low:.2f} req/s and {ttft_by_rate[high] * 1e3:.0f} ms at "
                 f"{high:.2f} req/s ({ttft_by_rate[high] / ttft_by_rate[low]:.1f}x; at least {GROWTH}x needed)")


def admission_claim(bounded: dict, unbounded: dict) -> Verdict:
    """C25's first half from two `client.summarize` results of the same overload, with and without a queue limit."""
    refused = bounded["refused_429"] >= 1 and unbounded["refused_429"] == 0
    fast = bounded["median_refusal_ms"] < bounded["median_ttft_ms"]
    bounded_tail = bounded["p99_ttft_ms"] < unbounded["p99_ttft_ms"]
    return claim("C25", refused and fast and bounded_tail,
                 f"with the limit {bounded['refused_429']} of {bounded['completed'] + bounded['failed']} requests "
                 f"refused, each in {bounded['median_refusal_ms']:.0f} ms (median) against "
                 f"{bounded['median_ttft_ms']:.0f} ms to an admitted request's first token; p99 TTFT of the admitted "
                 f"{bounded['p99_ttft_ms']:.0f} ms against {unbounded['p99_ttft_ms']:.0f} ms without a limit "
                 f"({unbounded['refused_429']} refused there)")


def cancel_claim(blocks_before: float, blocks_during: float, blocks_after: float, cancelled: float) -> Verdict:
    """C25's second half from /metrics: KV blocks used before a stream, while it ran, after its client went away,
    and how many requests the server counted cancelled meanwhile."""
    return claim("C25", blocks_during > blocks_before and blocks_after <= blocks_before and cancelled >= 1,
                 f"KV blocks used: {blocks_before:.0f} before, {blocks_during:.0f} while the stream ran, "
                 f"{blocks_after:.0f} once its client went away; requests cancelled: {cancelled:.0f}")


def prefix_claim(shared_cached: list[int], fresh_cached: list[int]) -> Verdict:
    """C16's must-hold part from the cached tokens the server reported: requests with a system prompt it has seen
    (shared_cached) and requests with a new one (fresh_cached), at least one of each."""
    return claim("C16", bool(shared_cached) and bool(fresh_cached) and all(c > 0 for c in shared_cached)
                 and all(c == 0 for c in fresh_cached),
                 f"cached tokens per request: {shared_cached} with the shared system prompt, {fresh_cached} with "
                 "a new one")
