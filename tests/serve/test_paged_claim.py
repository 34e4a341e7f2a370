"""C14's first check (notebook 08, section 2): the paged cache is the same cache as the contiguous one, logits equal
to the last bit, and it fails when the paged reader takes a position from the wrong slot."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.claims import ClaimFailed
from llm_anatomy.generate.decode import decode_step, prefill
from llm_anatomy.serve.paged_kv import PagedKVPool, RaggedPagedView, claim_paged_equals_contiguous


def _greedy_with(model, ids, cache, n=8):
    """Greedy tokens [1, n] and every step's logits [n, 1, vocab], as notebook 08's greedy_with."""
    with torch.inference_mode():
        logits, tokens = [prefill(model, ids, cache).logits[:, -1]], []
        for _ in range(n):
            tokens.append(logits[-1].argmax(-1, keepdim=True))
            if len(tokens) < n:
                logits.append(decode_step(model, tokens[-1], cache).logits[:, -1])
    return torch.cat(tokens, dim=1), torch.stack(logits)


def _both(model):
    ids = torch.tensor([[5, 17, 3, 99, 42, 8, 8, 61, 23, 4, 77]])  # 11 positions: blocks of 4 fill and spill over
    paged = _greedy_with(model, ids, PagedKVPool.for_model(model, num_blocks=8, block_size=4).new_cache(1))
    flat = _greedy_with(model, ids, model.new_cache(1, ids.shape[1] + 8))
    return paged[0], flat[0], paged[1], flat[1]


def test_c14_paged_equals_contiguous_holds(tiny):
    assert "C14 holds" in str(claim_paged_equals_contiguous(*_both(tiny)))


@pytest.mark.counterfactual("C14", "a paged reader that takes each position from the slot before it (off by one)")
def test_c14_paged_equals_contiguous_fails_on_an_off_by_one_reader(tiny, monkeypatch):
    real_init = RaggedPagedView.__init__

    def off_by_one(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.read_slots = (self.slots - 1).clamp(min=0)  # written in the right slot, read from the one before

    def read(self, layer, row=None):
        blocks, slots = self.block_ids, self.read_slots
        return (self.pool.keys[layer][blocks, :, slots].transpose(1, 2).contiguous(),
                self.pool.values[layer][blocks, :, slots].transpose(1, 2).contiguous())

    monkeypatch.setattr(RaggedPagedView, "__init__", off_by_one)
    monkeypatch.setattr(RaggedPagedView, "read", read)
    with pytest.raises(ClaimFailed, match="C14 FAILED"):
        claim_paged_equals_contiguous(*_both(tiny))
