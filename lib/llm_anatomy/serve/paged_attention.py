"""Paged attention that reads the blocks in place: decode attention walked through each row's block table.

RaggedPagedView (paged_kv.py) gathers every row's blocks into one contiguous `[rows, kv_heads, width, head_dim]`
tensor padded to the longest row, and ordinary attention reads that copy. A paged-attention kernel copies nothing:
for each row it walks the block table and reads each block's keys and values where they lie in the pool. Here
`paged_decode_attention` does the same in plain PyTorch, one new query per row (a decode step), the way vLLM's
first kernel orders it:

    for each block of the row's table:  scores of the block = q . K[block]        (K[block] a view: no copy)
    softmax over all of the row's scores (only the scores are put together: heads x positions numbers)
    for each block of the row's table:  out += weights of the block . V[block]    (V[block] a view: no copy)

The numbers equal attention over the contiguous cache (to float rounding; the tests compare with torch's SDPA).
`gather_then_attend` is the other way, what the engine's view plus SDPA do, kept to measure one against the other;
`gathered_bytes` is the K and V that the gather copies.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from ..errors import CourseError
from ..model.attention import sdpa_attention
from .paged_kv import RaggedPagedView, blocks_for


def _check(q, keys, tables, lengths) -> None:
    if q.dim() != 4 or q.shape[2] != 1:
        raise CourseError(f"q must be [rows, heads, 1, head_dim] (one new query per row), not {tuple(q.shape)}.")
    if len(tables) != q.shape[0] or len(lengths) != q.shape[0]:
        raise CourseError(f"Give one block table and one length per row: {q.shape[0]} rows, {len(tables)} tables, "
                          f"{len(lengths)} lengths.")
    if q.shape[1] % keys.shape[1]:
        raise CourseError(f"{q.shape[1]} query heads cannot be shared evenly by {keys.shape[1]} key/value heads.")
    for table, n in zip(tables, lengths):
        if n < 1 or blocks_for(n, keys.shape[2]) > len(table):
            raise CourseError(f"A row of {n} positions needs {blocks_for(max(n, 1), keys.shape[2])} blocks of "
                              f"{keys.shape[2]} (and at least 1 position); its table has {len(table)}.")


def paged_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tables: list[list[int]],
                           lengths: list[int]) -> torch.Tensor:
    """Attention of one new query per row over that row's cached positions, read block by block from the pool.

    q: [rows, heads, 1, head_dim]; keys, values: one layer of the pool, [blocks, kv_heads, block_size, head_dim];
    tables[i]: row i's block table; lengths[i]: its cached positions, the new token's own included (written
    already). Grouped-query heads share their KV head. Returns [rows, heads, 1, head_dim].
    """
    _check(q, keys, tables, lengths)
    rows, heads, _, dim = q.shape
    kv_heads, size = keys.shape[1], keys.shape[2]
    out = torch.empty_like(q)
    for row, (table, n) in enumerate(zip(tables, lengths)):
        query = q[row, :, 0].reshape(kv_heads, heads // kv_heads, dim) / math.sqrt(dim)  # [kv_heads, group, d]
        spans = [(table[j], min(size, n - j * size)) for j in range(blocks_for(n, size))]  # (block, filled)
        scores = torch.cat([query @ keys[block, :, :fill].transpose(-1, -2)  # the block read where it lies
                            for block, fill in spans], dim=-1)  # [kv_heads, group, n]: scores only
        weights = scores.softmax(dim=-1)
        total, start = 0, 0
        for block, fill in spans:
            total = total + weights[..., start:start + fill] @ values[block, :, :fill]  # [kv_heads, group, d]
            start += fill
        out[row, :, 0] = total.reshape(heads, dim)
    return out


def gather_then_attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tables: list[list[int]],
                       lengths: list[int]) -> torch.Tensor:
    """The same attention the engine's way: every row's K and V gathered through its block table into one
    rectangle padded to the longest row (RaggedPagedView's own gather), then SDPA with the padding mask.
    Returns [rows, heads, 1, head_dim]."""
    _check(q, keys, tables, lengths)
    layer = SimpleNamespace(keys=[keys], values=[values], block_size=keys.shape[2])  # the one layer the view reads
    view = RaggedPagedView(layer, tables, [n - 1 for n in lengths], [1] * len(lengths))  # the newest just written
    k, v = view.read(0)  # [rows, kv_heads, width, d] each: the copy
    return sdpa_attention(q, k, v, causal=False, key_mask=view.mask)  # each row's one query is its newest position


def gathered_bytes(keys: torch.Tensor, lengths: list[int]) -> int:
    """Bytes of K and V that gather_then_attend copies for one layer: every row padded to the longest."""
    _, kv_heads, _, dim = keys.shape
    return 2 * len(lengths) * max(lengths) * kv_heads * dim * keys.element_size()
