"""Scaled dot-product attention, written out: scores, causal mask, softmax, weighted sum.

Each query is compared with every key by a dot product, scaled by 1/sqrt(head_dim) so the scores
do not grow with the head size; softmax turns one query's scores into weights that sum to 1, and
the output is the weighted sum of the values (claim C4).

Grouped-query attention (GQA) lets several query heads share one key/value head: with 9 query
heads and 3 KV heads, query heads 0-2 read KV head 0, heads 3-5 read KV head 1, and so on.
Multi-head attention (MHA) is the case kv_heads == heads; multi-query (MQA) is kv_heads == 1 (C5).
The causal mask lets query i see keys 0..i only, never later tokens (C9).

`attention` is the plain path a learner reads: it writes the whole score matrix out, softmaxes it and reads it back.
`sdpa_attention` gives the same numbers (to float rounding) through torch's fused scaled_dot_product_attention, which
never keeps the scores (notebook 07 measures what that saves; `ScratchLlama(..., attention="sdpa")` selects it).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import CourseError


ATTENTION_PATHS = ("naive", "sdpa")  # the plain written-out attention, and torch's fused kernel


def check_attention_path(path: str) -> str:
    """`path` if it is one of ATTENTION_PATHS, else one clear CourseError."""
    if path not in ATTENTION_PATHS:
        raise CourseError(f"attention must be one of {', '.join(map(repr, ATTENTION_PATHS))}, not {path!r}.")
    return path


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat each KV head for its group of query heads: `[b, kv, s, d]` -> `[b, kv * n_rep, s, d]`."""
    if n_rep == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def kv_head_of(query_head: int, heads: int, kv_heads: int) -> int:
    """Which KV head a query head reads under GQA (heads are grouped in order)."""
    if heads % kv_heads:
        raise CourseError(f"{heads} query heads cannot be shared evenly by {kv_heads} key/value heads.")
    if not 0 <= query_head < heads:
        raise CourseError(f"query_head must be from 0 to {heads - 1}, not {query_head}.")
    return query_head // (heads // kv_heads)


def causal_mask(q_len: int, k_len: int, device=None) -> torch.Tensor:
    """True where query i may look at key j: `[q_len, k_len]` bool.

    The queries are the last q_len positions of k_len (as in decoding with a cache), so query i
    sits at position k_len - q_len + i and sees keys 0 .. that position.
    """
    if q_len > k_len:
        raise CourseError(f"There are more queries ({q_len}) than keys ({k_len}): "
                          "the keys must include the queries' own positions.")
    offset = k_len - q_len
    rows = torch.arange(q_len, device=device)[:, None] + offset
    cols = torch.arange(k_len, device=device)[None, :]
    return cols <= rows


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t is not None and t.dim() != 4:
            raise CourseError(f"{name} must be [batch, heads, seq, head_dim], not of shape {tuple(t.shape)}.")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise CourseError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on batch and head_dim.")
    if v is not None and v.shape[:3] != k.shape[:3]:
        raise CourseError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree on batch, heads and length.")
    if q.shape[1] % k.shape[1]:
        raise CourseError(f"{q.shape[1]} query heads cannot be shared evenly by {k.shape[1]} key/value heads.")


def attention_probabilities(q: torch.Tensor, k: torch.Tensor, *, causal: bool = True,
                            key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The attention weights alone: softmax(q k^T / sqrt(head_dim)) with the masks applied.

    q: `[batch, heads, q_len, head_dim]`; k: `[batch, kv_heads, k_len, head_dim]`.
    Returns `[batch, heads, q_len, k_len]` in fp32; each row sums to 1, or is all zeros for a
    query that may see no key at all (a padding position).
    """
    _check_shapes(q, k)
    b, heads, q_len, d = q.shape
    kv_heads, k_len = k.shape[1], k.shape[-2]
    # Grouped-query attention without copying K: the n_rep query heads of one group are stacked
    # as extra rows against their shared KV head. The numbers are those of repeat_kv(k) @ q.
    q_grouped = q.reshape(b, kv_heads, (heads // kv_heads) * q_len, d)  # [b, kv_heads, n_rep * q_len, d]
    scores = (q_grouped @ k.transpose(-2, -1)) / math.sqrt(d)  # [b, kv_heads, n_rep * q_len, k_len]
    scores = scores.view(b, heads, q_len, k_len)
    allowed = None
    if causal and q_len > 1:  # a single query (a decode step) is the newest position: it may see every key
        allowed = causal_mask(q_len, k_len, device=q.device)
    if key_mask is not None:
        if key_mask.shape != (b, k_len):
            raise CourseError(f"key_mask must be [batch, k_len] = {(b, k_len)}, "
                              f"not {tuple(key_mask.shape)}.")
        keys_ok = key_mask[:, None, None, :].bool()
        allowed = keys_ok if allowed is None else (allowed & keys_ok)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1)
    if key_mask is not None:
        weights = torch.nan_to_num(weights)  # a padding query that sees no key at all gets zeros, not NaN
    return weights


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
              key_mask: torch.Tensor | None = None, return_weights: bool = False):
    """Attention of queries over keys and values.

    q: `[batch, heads, q_len, head_dim]`; k, v: `[batch, kv_heads, k_len, head_dim]` (GQA when fewer).
    key_mask: optional `[batch, k_len]` bool, False for padding positions that nobody may attend to.
    Returns the output `[batch, heads, q_len, head_dim]`, and with return_weights also the
    attention weights `[batch, heads, q_len, k_len]` (each row sums to 1).
    """
    _check_shapes(q, k, v)
    weights = attention_probabilities(q, k, causal=causal, key_mask=key_mask)
    b, heads, q_len, _ = q.shape
    kv_heads = v.shape[1]
    grouped = weights.to(v.dtype).view(b, kv_heads, (heads // kv_heads) * q_len, -1)  # rows of one KV group
    out = (grouped @ v).view(b, heads, q_len, v.shape[-1])  # [b, heads, q_len, head_dim]
    return (out, weights) if return_weights else out


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                   key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The same attention as `attention` (same shapes, same masks), through torch's scaled_dot_product_attention.

    Its kernels never write the `[q_len, k_len]` scores out. GQA is passed as `enable_gqa` (no copy of K and V); the
    causal mask as `is_causal` when queries and keys are the same positions and nothing is padded, else as a boolean
    mask. A padding query that may see no key gets zeros, as in `attention`. Returns `[batch, heads, q_len, head_dim]`.
    """
    _check_shapes(q, k, v)
    b, heads, q_len, _ = q.shape
    k_len = k.shape[-2]
    gqa = heads != k.shape[1]
    if key_mask is None and (not causal or q_len == 1):  # a single query is the newest position: it sees every key
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    if key_mask is None and q_len == k_len:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    allowed = causal_mask(q_len, k_len, device=q.device)[None, None] if causal else None  # [1, 1, q_len, k_len]
    if key_mask is not None:
        if key_mask.shape != (b, k_len):
            raise CourseError(f"key_mask must be [batch, k_len] = {(b, k_len)}, not {tuple(key_mask.shape)}.")
        keys_ok = key_mask[:, None, None, :].bool()  # [b, 1, 1, k_len]
        allowed = keys_ok if allowed is None else (allowed & keys_ok)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=gqa)  # [b, heads, q_len, head_dim]
    sees_a_key = allowed.any(-1, keepdim=True)  # [b or 1, 1, q_len, 1]
    return torch.where(sees_a_key, out, torch.zeros((), dtype=out.dtype, device=out.device))  # NaN rows -> zeros
