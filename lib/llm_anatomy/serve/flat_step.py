"""One iteration as one flattened call over the paged pool, the way vLLM and SGLang lay out a step.

The padded engine (scheduler.py with flatten=False) makes two calls per iteration, a decode call and a prompt-chunk
call, and each pads its rows to the longest and gathers every row's K and V into a contiguous copy. `flat_step` puts
the two pieces of this folder together instead: selective batching (selective.py) and paged attention that reads
the blocks in place (paged_attention.py). An iteration's rows, each with its block table, its cached length and its
new tokens (1 for a decode, a chunk for a prompt), become ONE pass:

    ids: every row's new tokens end to end             [total]           no padding anywhere
    positions: each token's own (cached + i)           [total]           RoPE at that position
    slots: where each token's K and V go in the pool   [total]           paged_kv.slot_mapping
    per layer: norms, q/k/v/o projections, MLP on the whole stream; K and V written by slot; attention per row:
        a row with one new token: paged_decode_attention (the blocks read in place, no copy)
        a prompt chunk: its own cached + new positions, causal within the chunk (its blocks, its length only)
    LM head on each row's last new token only           [rows, vocab]     what the scheduler picks from

The logits equal the padded view's to float rounding (tests/serve/test_flat_step.py).
"""

from __future__ import annotations

import torch

from ..errors import CourseError
from ..model.attention import attention, sdpa_attention
from ..model.config import check_context
from ..model.rope import apply_rope
from .paged_attention import paged_decode_attention
from .paged_kv import PagedKVPool, blocks_for, slot_mapping


def _check(pool: PagedKVPool, tables, cached, new_tokens, vocab: int) -> None:
    if not tables or not (len(tables) == len(cached) == len(new_tokens)):
        raise CourseError(f"Give at least one row, and one block table, cached length and token list per row: "
                          f"{len(tables)} tables, {len(cached)} lengths, {len(new_tokens)} token lists.")
    for table, past, new in zip(tables, cached, new_tokens):
        if not new or past < 0:
            raise CourseError(f"Every row needs at least 1 new token and a cached length >= 0, not {len(new)} "
                              f"new after {past}.")
        if not all(0 <= t < vocab for t in new):
            raise CourseError(f"New tokens must be token ids from 0 to {vocab - 1}.")
        if blocks_for(past + len(new), pool.block_size) > len(table):
            need = blocks_for(past + len(new), pool.block_size)
            raise CourseError(f"A row of {past + len(new)} positions needs {need} blocks of {pool.block_size}; its "
                              f"table has {len(table)}: extend it first.")


@torch.inference_mode()
def flat_step(model, pool: PagedKVPool, tables: list[list[int]], cached: list[int],
              new_tokens: list[list[int]]) -> torch.Tensor:
    """Logits `[rows, vocab]` of each row's last new token, all rows in one flattened pass over `pool`.

    tables[i]: row i's block table, with room for its new positions; cached[i]: its positions already in the pool;
    new_tokens[i]: its new token ids (1 for a decode, a chunk for a prompt). Their K and V are written into the pool.
    """
    _check(pool, tables, cached, new_tokens, model.cfg.vocab_size)
    cfg, device, size, d = model.cfg, model.device, pool.block_size, model.cfg.head_dim
    lengths = [past + len(new) for past, new in zip(cached, new_tokens)]
    for n in lengths:
        check_context(n, cfg.max_position_embeddings)
    ends = torch.tensor([len(new) for new in new_tokens]).cumsum(0).tolist()
    spans = list(zip([0] + ends[:-1], ends))  # each row's stretch of the stream
    ids = torch.tensor([t for new in new_tokens for t in new], device=device)  # [total]
    positions = torch.cat([torch.arange(past, n, device=device) for past, n in zip(cached, lengths)])  # [total]
    row_of = torch.cat([torch.full((b - a,), i, device=device) for i, (a, b) in enumerate(spans)])  # [total]
    width = max(len(t) for t in tables)
    table = torch.tensor([t + t[:1] * (width - len(t)) for t in tables], device=device)  # [rows, blocks]
    flat = slot_mapping(table[row_of], positions[:, None], size)[:, 0]  # [total] each token's slot in the pool
    write_blocks, write_slots = flat // size, flat % size  # [total] each
    decoders = [i for i, new in enumerate(new_tokens) if len(new) == 1]
    at = torch.tensor([spans[i][0] for i in decoders], device=device)  # [decoders] their token in the stream
    cos, sin = model.rope(positions)  # [total, head_dim] each
    total = len(ids)
    x = model.embed_tokens(ids)  # [total, hidden]
    for layer, block in enumerate(model.layers):
        attn, keys, values = block.self_attn, pool.keys[layer], pool.values[layer]
        h = block.input_layernorm(x)
        q = attn.q_proj(h).view(total, cfg.num_heads, d).transpose(0, 1)[None]  # [1, heads, total, d]
        k = attn.k_proj(h).view(total, cfg.num_kv_heads, d).transpose(0, 1)[None]  # [1, kv_heads, total, d]
        v = attn.v_proj(h).view(total, cfg.num_kv_heads, d)  # [total, kv_heads, d]
        q, k = apply_rope(q, cos, sin)[0].transpose(0, 1), apply_rope(k, cos, sin)[0].transpose(0, 1)  # [total, ., d]
        keys[write_blocks, :, write_slots], values[write_blocks, :, write_slots] = k, v  # by slot mapping
        out = torch.empty_like(q)  # [total, heads, d]
        if decoders:  # one query each, the blocks read where they lie
            out[at] = paged_decode_attention(q[at][:, :, None], keys, values, [tables[i] for i in decoders],
                                             [lengths[i] for i in decoders])[:, :, 0]
        for i, (a, b) in enumerate(spans):
            if b - a == 1:
                continue
            flat_row = slot_mapping(table[i:i + 1], torch.arange(lengths[i], device=device)[None], size)[0]
            k_row = keys[flat_row // size, :, flat_row % size].transpose(0, 1)[None]  # [1, kv_heads, length, d]
            v_row = values[flat_row // size, :, flat_row % size].transpose(0, 1)[None]
            attend = sdpa_attention if attn.path == "sdpa" else attention
            out[a:b] = attend(q[a:b].transpose(0, 1)[None], k_row, v_row, causal=True)[0].transpose(0, 1)
        x = x + attn.o_proj(out.reshape(total, cfg.num_heads * d))
        x = x + block.mlp(block.post_attention_layernorm(x))
    last = torch.tensor([b - 1 for _, b in spans], device=device)  # [rows] each row's last new token
    return model.lm_head(model.norm(x[last]))  # [rows, vocab]
