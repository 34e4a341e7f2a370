"""Scaled dot-product attention, written out: scores, causal mask, softmax, weighted sum.

Grouped-query attention (GQA) lets several query heads share one key/value head: with 9 query
heads and 3 KV heads, query heads 0-2 read KV head 0, heads 3-5 read KV head 1, and so on.
Multi-head attention (MHA) is the case kv_heads == heads; multi-query (MQA) is kv_heads == 1.
"""

from __future__ import annotations

import math

import torch

from .errors import CourseError


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat each KV head for its group of query heads: `[b, kv, s, d]` -> `[b, kv * n_rep, s, d]`."""
    if n_rep == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def causal_mask(q_len: int, k_len: int, device=None) -> torch.Tensor:
    """True where query i may look at key j: `[q_len, k_len]`.

    The queries are the last q_len positions of k_len (as in decoding with a cache), so query i
    sits at position k_len - q_len + i and sees keys 0 .. that position.
    """
    offset = k_len - q_len
    rows = torch.arange(q_len, device=device)[:, None] + offset
    cols = torch.arange(k_len, device=device)[None, :]
    return cols <= rows


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
              key_mask: torch.Tensor | None = None, return_weights: bool = False):
    """Attention of queries over keys and values.

    q: `[batch, heads, q_len, head_dim]`; k, v: `[batch, kv_heads, k_len, head_dim]` (GQA when fewer).
    key_mask: optional `[batch, k_len]` bool, False for padding positions that nobody may attend to.
    Returns the output `[batch, heads, q_len, head_dim]`, and with return_weights also the
    attention weights `[batch, heads, q_len, k_len]` (each row sums to 1).
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise CourseError(f"{heads} query heads cannot be shared evenly by {kv_heads} key/value heads.")
    k = repeat_kv(k, heads // kv_heads)
    v = repeat_kv(v, heads // kv_heads)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # [b, h, q_len, k_len]
    allowed = None
    if causal:
        allowed = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
    if key_mask is not None:
        keys_ok = key_mask[:, None, None, :].bool()
        allowed = keys_ok if allowed is None else (allowed & keys_ok)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1)
    weights = torch.nan_to_num(weights)  # a padding query that sees no key at all gets zeros
    out = weights.to(v.dtype) @ v
    return (out, weights) if return_weights else out
