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
    LM head on each row's last new token only           [rows, vocab]     what the sampler picks from

None of this is a second forward pass: `FlatPagedBatch` is one more cache (a KVCacheInterface), and the model's own
trace runs the step. flat_step builds the batch, so it computes the positions (selective.flat_positions) and passes
them with the ids, as vLLM's model runner does; the model checks each one against the context. The cache lays the
rows end to end (selective.FlatBatch), writes K and V through the pool's one writer and reads a prompt chunk's keys
through its one reader (paged_kv.RaggedPagedView); a decode row's blocks are read in place. The logits equal the
padded view's to float rounding (tests/serve/test_flat_step.py).
"""

from __future__ import annotations

import torch

from ..errors import CourseError
from ..model.config import check_context
from .paged_attention import paged_decode_attention
from .paged_kv import PagedKVPool, RaggedPagedView, blocks_for
from .selective import FlatBatch, flat_positions


class FlatPagedBatch(FlatBatch):
    """One iteration's rows end to end (FlatBatch), their K and V kept in the paged pool.

    tables[i]: row i's block table, with room for its new positions; cached[i]: its positions already in the pool;
    news[i]: its new tokens (1 for a decode, a chunk for a prompt).
    """

    def __init__(self, pool: PagedKVPool, tables: list[list[int]], cached: list[int], news: list[int]):
        device = pool.keys[0].device
        super().__init__(news, device)
        self.pool, self.tables = pool, tables
        self.view = RaggedPagedView(pool, tables, cached, news)  # its writes are the stream's tokens, in order
        self.decoders = [i for i, n in enumerate(news) if n == 1]
        self.at = torch.tensor([self.spans[i][0] for i in self.decoders], device=device)  # their token in the stream

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel):
        """q `[1, heads, total, d]`, k and v `[1, kv_heads, total, d]`: written by slot, then each row attends."""
        self.view.write(layer, k[0].transpose(0, 1), v[0].transpose(0, 1))  # [total, kv_heads, d] into the pool
        q_tokens = q[0].transpose(0, 1)  # [total, heads, d]
        out = torch.empty_like(q_tokens)  # [total, heads, d]: each token's heads side by side, as o_proj reads them
        if self.decoders:  # one query each, the blocks read where they lie
            ends = [self.view.ends[i] for i in self.decoders]
            out[self.at] = paged_decode_attention(q_tokens[self.at][:, :, None], self.pool.keys[layer],
                                                  self.pool.values[layer], [self.tables[i] for i in self.decoders],
                                                  ends)[:, :, 0]  # [decoders, heads, d]
        for i, (a, b) in enumerate(self.spans):
            if b - a > 1:  # a prompt chunk: its cached and new keys, gathered from its blocks
                out[a:b] = kernel(q[:, :, a:b], *self.view.read(layer, row=i))[0][0].transpose(0, 1)
        out = out.transpose(0, 1)[None]  # [1, heads, total, d]
        return out, None


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
    # the ids and positions are checked here, on the host, before anything is written: the model need not read them back
    check_context(max(past + len(new) for past, new in zip(cached, new_tokens)), model.cfg.max_position_embeddings)
    news = [len(new) for new in new_tokens]
    batch = FlatPagedBatch(pool, tables, cached, news)
    ids = torch.tensor([[t for new in new_tokens for t in new]], device=model.device)  # [1, total]
    positions = flat_positions(cached, news, model.device)  # [total] each token at its own row's position
    out = model.trace(ids, batch, positions=positions, keep_hidden=False, logits_at=batch.last, check_range=False)
    return out.logits[0]  # [rows, vocab]
