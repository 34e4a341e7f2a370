"""The model runner: one iteration's rows through the model, over the paged pool, as the scheduler planned them.

A row is a request's new tokens (one for a decode, more for a prompt chunk), its block table and how many of its
positions are cached already. The runner turns the rows into model calls through the course's one forward pass and
gives back each row's logits for its last new token: what the sampler needs. Two ways, the same tokens:
    padded (default): one decode call for the decode rows (the first `decodes`) and one for the prompt chunks, each
        left-padded to its longest row and read through the pool's one reader (paged_kv.RaggedPagedView), which
        also gives the rows' positions and padding mask that the runner passes to the model;
    flattened: every row end to end in one call with no padding (flat_step.py), as vLLM and SGLang run an iteration.
Each call goes through `call` (batching.Engine.call), which times it on the engine's clock.
"""

from __future__ import annotations

import torch

from ..generate.decode import decode_step, left_pad, prefill
from .flat_step import flat_step
from .paged_kv import PagedKVPool, RaggedPagedView


class ModelRunner:
    """Runs planned rows on `model` over `pool`; call(kind, rows, tokens, fn, context=...) times each model call."""

    def __init__(self, model, pool: PagedKVPool, call, flatten: bool = False):
        self.model, self.pool, self.call, self.flatten = model, pool, call, flatten

    def run(self, tokens: list[list[int]], tables: list[list[int]], cached: list[int], decodes: int) -> torch.Tensor:
        """Logits `[rows, vocab]` of each row's last new token. Row i feeds `tokens[i]` after `cached[i]` cached
        positions in the blocks of `tables[i]` (which have room for them); the first `decodes` rows are decodes."""
        if self.flatten:
            return self.call("mixed", len(tokens), sum(map(len, tokens)),
                             lambda: flat_step(self.model, self.pool, tables, cached, tokens), context=sum(cached))
        parts = []
        for kind, rows in (("decode", range(decodes)), ("prefill", range(decodes, len(tokens)))):
            if rows:
                parts.append(self._padded(kind, [tokens[i] for i in rows], [tables[i] for i in rows],
                                          [cached[i] for i in rows]))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _padded(self, kind: str, tokens, tables, cached) -> torch.Tensor:
        ids, _ = left_pad(tokens, device=self.model.device)  # [rows, longest]
        news = [len(t) for t in tokens]
        view = RaggedPagedView(self.pool, tables, cached, news)
        step = decode_step if kind == "decode" else prefill
        out = self.call(kind, len(tokens), sum(news),  # the positions and the mask: the view's layout of the rows
                        lambda: step(self.model, ids, view, positions=view.positions, attention_mask=view.mask),
                        context=sum(cached))
        return out.logits[:, -1]  # [rows, vocab]
