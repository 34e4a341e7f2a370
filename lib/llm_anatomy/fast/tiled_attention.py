"""Attention in tiles, with an online softmax: the scores are never all in memory at once (claim C19).

The plain attention (attention.py) writes the whole score matrix, `[heads, q_len, k_len]` numbers, reads
it back for the softmax and again for the weighted sum: its memory and its traffic grow with the square
of the prompt. The softmax of one row needs only two running numbers, though. Reading the keys a block
at a time, keep for each query row

    m = the largest score so far,  l = sum of exp(score - m) so far,  o = sum of exp(score - m) * value so far

and when a new block raises the maximum from m to m', rescale what was summed: l * exp(m - m'), o * exp(m - m').
After the last block, o / l is exactly softmax(scores) @ V. This is the online softmax (Milakov and
Gimelshein 2018) that FlashAttention (Dao et al. 2022) computes tile by tile in a GPU's on-chip memory.
Here it is in plain PyTorch: the same numbers as the plain attention (to float rounding), with memory
that grows linearly with the prompt. Sizes in bytes.
"""

from __future__ import annotations

import math

import torch

from ..model.attention import _check_shapes
from ..errors import CourseError


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, o: torch.Tensor, scores: torch.Tensor,
                          v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one block of keys into the running state of each query row.

    m, l: `[..., q, 1]` running max and running sum of exp(score - m); o: `[..., q, d]` running weighted sum
    of values (not yet divided by l). scores: `[..., q, block]` this block's scores (-inf where masked);
    v: `[..., block, d]` its values. Returns the new (m, l, o). Start from m = -inf, l = 0, o = 0.
    """
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))  # [..., q, 1]
    shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # a row that saw only masked keys
    p = torch.exp(scores - shift)  # [..., q, block]
    rescale = torch.exp(m - shift)  # how much the old maximum overstated the new one: exp(m - m') <= 1
    return m_new, l * rescale + p.sum(dim=-1, keepdim=True), o * rescale + p @ v


def online_softmax(x: torch.Tensor, block: int) -> torch.Tensor:
    """softmax(x) over the last dimension, reading `block` entries at a time (only m and l are kept)."""
    _check_block("block", block)
    m = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=x.dtype, device=x.device)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], block):
        chunk = x[..., start:start + block]
        m_new = torch.maximum(m, chunk.amax(dim=-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(chunk - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l  # a second pass over x, with the final m and l


def _check_block(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CourseError(f"{name} must be a whole number of positions, at least 1, not {value!r}.")


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                    key_mask: torch.Tensor | None = None, block_q: int = 128, block_k: int = 128,
                    return_weights: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v, one [block_q x block_k] tile of scores at a time.

    The same arguments and result as attention.attention: q `[batch, heads, q_len, d]`, k and v
    `[batch, kv_heads, k_len, d]` (grouped-query when fewer heads), key_mask `[batch, k_len]` (False =
    padding), causal with the queries as the last q_len positions. Returns `[batch, heads, q_len, d]`.
    A tile size that does not divide the length is fine: the last tile is shorter. Under a causal mask,
    tiles wholly above the diagonal are skipped: they would be all -inf.
    """
    _check_shapes(q, k, v)
    _check_block("block_q", block_q)
    _check_block("block_k", block_k)
    if return_weights:
        raise CourseError("Tiled attention never holds the whole weight matrix: use attention() to see the weights.")
    b, heads, q_len, d = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    if causal and q_len > k_len:
        raise CourseError(f"There are more queries ({q_len}) than keys ({k_len}): "
                          "the keys must include the queries' own positions.")
    if key_mask is not None and key_mask.shape != (b, k_len):
        raise CourseError(f"key_mask must be [batch, k_len] = {(b, k_len)}, not {tuple(key_mask.shape)}.")
    n_rep, offset = heads // kv_heads, k_len - q_len  # query i sits at position offset + i
    acc = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype  # sums in at least fp32
    q5 = q.view(b, kv_heads, n_rep, q_len, d)  # [b, kv, n_rep, q_len, d]: the query heads of a group share K and V
    k5, v5 = k[:, :, None].to(acc), v[:, :, None].to(acc)  # [b, kv, 1, k_len, d]
    out = torch.empty(b, kv_heads, n_rep, q_len, d, dtype=acc, device=q.device)
    for qs in range(0, q_len, block_q):
        qe = min(qs + block_q, q_len)
        m = torch.full((b, kv_heads, n_rep, qe - qs, 1), float("-inf"), dtype=acc, device=q.device)
        l = torch.zeros_like(m)
        o = torch.zeros(b, kv_heads, n_rep, qe - qs, d, dtype=acc, device=q.device)
        k_end = min(k_len, offset + qe) if causal else k_len  # the last key any query of this tile may see
        rows = torch.arange(offset + qs, offset + qe, device=q.device)[:, None]  # [tile_q, 1] query positions
        q_tile = q5[..., qs:qe, :].to(acc) / math.sqrt(d)  # [b, kv, n_rep, tile_q, d], scaled once per tile
        for ks in range(0, k_end, block_k):
            ke = min(ks + block_k, k_end)
            scores = q_tile @ k5[..., ks:ke, :].transpose(-2, -1)  # [b, kv, n_rep, tile_q, tile_k]
            if causal and ke - 1 > offset + qs:  # this tile crosses the diagonal: mask the future
                allowed = torch.arange(ks, ke, device=q.device)[None, :] <= rows  # [tile_q, tile_k]
                scores = scores.masked_fill(~allowed, float("-inf"))
            if key_mask is not None:
                scores = scores.masked_fill(~key_mask[:, None, None, None, ks:ke].bool(), float("-inf"))
            m, l, o = online_softmax_update(m, l, o, scores, v5[..., ks:ke, :])
        out[..., qs:qe, :] = torch.where(l > 0, o / l.clamp(min=1e-30), torch.zeros_like(o))  # no key: zeros
    return out.view(b, heads, q_len, d).to(q.dtype)


def attention_bytes(q_len: int, k_len: int, heads: int, kv_heads: int, head_dim: int, bytes_per_element: int = 4,
                    *, tiled: bool = False, block_q: int = 128, causal: bool = True) -> int:
    """Bytes one attention call moves to and from main memory (DRAM, or a GPU's HBM), by count.

    Both read Q and write the output once. The plain one reads K and V once and writes the fp32 score
    matrix, reads it for the softmax and reads it again for weights @ V (3 passes over heads x q x k x 4
    bytes). The tiled one keeps each tile on chip (a GPU's shared memory, a CPU's cache) and instead
    reads the keys and values a query tile may see once per query tile.
    """
    _check_block("block_q", block_q)
    q_and_out = 2 * heads * q_len * head_dim * bytes_per_element
    kv_row = 2 * kv_heads * head_dim * bytes_per_element  # one position's K and V
    if not tiled:
        return q_and_out + kv_row * k_len + 3 * 4 * heads * q_len * k_len
    offset, keys_read = k_len - q_len, 0
    for qs in range(0, q_len, block_q):
        keys_read += min(k_len, offset + min(qs + block_q, q_len)) if causal else k_len
    return q_and_out + kv_row * keys_read


def tiled_score_bytes(q_len: int, k_len: int, heads: int, *, block_q: int = 128, block_k: int = 128,
                      causal: bool = True) -> int:
    """Bytes our `tiled_attention`, launched op by op from Python, moves for its tiles of scores (one call).

    A fused kernel keeps each tile on chip and moves none (attention_bytes(tiled=True) counts that kernel). Ours
    writes every tile it visits to memory: q.k writes it, amax reads it, the shift (scores - m) and exp each read and
    write it, the sum and p @ v read it: 32 bytes per score, the tiles being fp32 whatever the inputs, and 8 more in a
    tile the causal diagonal crosses (masked_fill reads and writes it). Tiles wholly above the diagonal are skipped,
    as tiled_attention skips them, so a prefill moves less than the plain attention's score bytes (a little over
    half at 4,096 tokens in tiles of 128; more at short prompts, where the diagonal's tiles weigh more), not none.
    """
    _check_block("block_q", block_q)
    _check_block("block_k", block_k)
    offset, total = k_len - q_len, 0
    for qs in range(0, q_len, block_q):
        qe = min(qs + block_q, q_len)
        k_end = min(k_len, offset + qe) if causal else k_len
        for ks in range(0, k_end, block_k):
            ke = min(ks + block_k, k_end)
            crossed = causal and ke - 1 > offset + qs  # the same test as tiled_attention's mask
            total += (qe - qs) * (ke - ks) * (40 if crossed else 32)
    return heads * total


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """max |out - reference| over the largest |reference|: how far two attention outputs are, in the output's size."""
    return ((out - reference).abs().max() / reference.abs().max()).item()


def equality_evidence(relative: dict, bound: float = 1e-6) -> tuple[bool, str]:
    """C19's exactness: (every tiling within `bound` of the plain attention, relative to the output's size, the
    evidence). relative: {(block_q, block_k): relative_error}. float32 sums in another order part by about 1e-7; an
    online softmax that forgets to rescale what it summed, or skips a tile, parts by far more."""
    worst = max(relative.values())
    tiles = ", ".join(f"{bq}x{bk}: {r:.1e}" for (bq, bk), r in relative.items())
    return worst < bound, (f"tiled attention equals the plain one within {worst:.1e} of the output's size "
                           f"(bar {bound:.0e}), "
                           f"for tiles that divide the length and tiles that do not ({tiles})")


def per_token_growth(lengths: list[int], peaks: list[float]) -> list[float]:
    """Bytes per extra token, from one length to the next: (peak[i + 1] - peak[i]) / (n[i + 1] - n[i])."""
    return [(b - a) / (m - n) for a, b, n, m in zip(peaks, peaks[1:], lengths, lengths[1:])]


# The tiled call's bytes per extra token may be at most this many times what it must hold per token (its output and
# the keys and values it reads). Measured on the CPU (fp32, 9 query heads, 3 KV heads, head_dim 64: 3.8 kB a token
# held): tiled with 256-key tiles 2.3 kB a token; a "tiled" call that ignores block_k and keeps a tile of queries'
# scores against every key (no online softmax) 30.2 kB, 8x what it holds.
TILED_PER_TOKEN_BOUND = 2.0


def memory_growth_evidence(lengths: list[int], plain_peak: list[float], tiled_peak: list[float], *,
                           held_per_token: float) -> tuple[bool, str]:
    """C19's memory: (whether it holds, the evidence). Peak bytes of one attention call at each prompt length (at
    least three lengths, each about twice the one before). Holds when the tiled call's cost per extra token is flat
    (positive, every step within 1.5x of the smallest: linear), the plain call's grows by at least 1.5x from step to
    step (quadratic: it doubles when the length doubles), and at the longest prompt the tiled call needs at most a
    tenth of the plain peak. A "tiled" attention that builds the whole score matrix grows like the plain one and fails.
    held_per_token: the bytes a token's output and its keys and values take (num_heads * head_dim + 2 * num_kv_heads *
    head_dim elements): the tiled call's cost per extra token must also stay within TILED_PER_TOKEN_BOUND times it, or
    a call that keeps a slab of scores against every key (linear too, at a long enough length) would pass.
    """
    if len(lengths) < 3 or len(lengths) != len(plain_peak) or len(lengths) != len(tiled_peak):
        raise CourseError("Give at least three lengths, with one plain and one tiled peak for each.")
    plain, tiled = per_token_growth(lengths, plain_peak), per_token_growth(lengths, tiled_peak)
    linear = 0 < min(tiled) and max(tiled) <= 1.5 * min(tiled)  # a flat cost per token
    quadratic = all(b >= 1.5 * a > 0 for a, b in zip(plain, plain[1:]))  # the cost per token grows with n
    share = tiled_peak[-1] / plain_peak[-1]
    spread = max(tiled) / min(tiled) if min(tiled) > 0 else float("inf")
    small = max(tiled) <= TILED_PER_TOKEN_BOUND * held_per_token
    return (linear and quadratic and share <= 0.1 and small,
            f"from {lengths[0]} to {lengths[-1]} tokens, each extra token cost the tiled call "
            f"{', '.join(f'{s / 1e3:.1f}' for s in tiled)} kB (within {spread:.2f}x "
            f"from one length to the next; linear means within 1.5x; at most {max(tiled) / held_per_token:.2f}x the "
            f"{held_per_token / 1e3:.1f} kB a token's output, keys and values take, bar {TILED_PER_TOKEN_BOUND:.0f}x), "
            f"and the plain call "
            f"{', '.join(f'{s / 1e3:.0f}' for s in plain)} kB (quadratic: growing 1.5x or more a step); "
            f"at {lengths[-1]} "
            f"tokens tiled needs {share:.3f} of the plain peak (bar 0.1)")
