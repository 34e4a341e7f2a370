"""C14's first check (notebook 08, section 2): the paged cache is the same cache as the contiguous one, logits equal
to the last bit, and it fails when the paged reader takes a position from the wrong slot."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.claims import ClaimFailed
from llm_anatomy.generate.decode import decode_step, prefill
from llm_anatomy.serve.paged_kv import PagedKVPool, RaggedPagedView, claim_paged_equals_contiguous


def _greedy_with(model, prompts, caches, n=8):
    """Each prompt's greedy tokens [rows, n] and every step's logits [n, rows, vocab], the prompts taking turns step by
    step on their own caches, as notebook 08's greedy_with."""
    with torch.inference_mode():
        logits = [[prefill(model, ids, cache).logits[:, -1]] for ids, cache in zip(prompts, caches)]
        tokens = [[] for _ in prompts]
        for step in range(n):
            for i, cache in enumerate(caches):
                tokens[i].append(logits[i][-1].argmax(-1, keepdim=True))
                if step < n - 1:
                    logits[i].append(decode_step(model, tokens[i][-1], cache).logits[:, -1])
    return torch.cat([torch.cat(t, dim=1) for t in tokens]), torch.cat([torch.stack(step) for step in logits], dim=1)


PROMPTS = [torch.tensor([[5, 17, 3, 99, 42, 8, 8, 61, 23, 4, 77]]), torch.tensor([[9, 12, 40, 3, 3, 88, 21]])]


def _both(model, sequences=2):
    """tokens and logits paged and contiguous, and the paged block tables, for `sequences` prompts in one pool of
    blocks of 4 (11 and 7 positions + 8 new: blocks fill and spill over, the two sequences' blocks interleave)."""
    prompts = PROMPTS[:sequences]
    pool = PagedKVPool.for_model(model, num_blocks=12, block_size=4)
    paged_caches = [pool.new_cache(1) for _ in prompts]
    paged = _greedy_with(model, prompts, paged_caches)
    flat = _greedy_with(model, prompts, [model.new_cache(1, ids.shape[1] + 8) for ids in prompts])
    return paged[0], flat[0], paged[1], flat[1], [cache.block_tables[0] for cache in paged_caches]


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


@pytest.mark.counterfactual("C14", "a paged cache that ignores its block table (slot = position)")
def test_c14_paged_equals_contiguous_fails_when_the_block_table_is_ignored(tiny, monkeypatch):
    import llm_anatomy.serve.paged_kv as paged_kv
    monkeypatch.setattr(paged_kv, "slot_mapping", lambda tables, positions, size: positions + 0 * tables[:, :1])
    with pytest.raises(ClaimFailed, match="C14 FAILED"):
        claim_paged_equals_contiguous(*_both(tiny))


@pytest.mark.counterfactual("C14", "one sequence in a fresh pool: its table 0, 1, 2, ... cannot show the table used")
def test_c14_paged_equals_contiguous_fails_on_one_identity_table(tiny):
    evidence = _both(tiny, sequences=1)
    assert evidence[4] == [[0, 1, 2, 3, 4]]  # a fresh pool hands out 0, 1, 2, ...: slot = position would give the same
    with pytest.raises(ClaimFailed, match="C14 FAILED"):
        claim_paged_equals_contiguous(*evidence)
