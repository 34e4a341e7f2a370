"""Paged attention that reads the blocks in place (serve/paged_attention.py): equal to SDPA over the contiguous cache
of the tiny random model, and to the gather-then-attend path; bad shapes refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.decode import prefill
from llm_anatomy.model.attention import repeat_kv
from llm_anatomy.serve.paged_attention import gather_then_attend, gathered_bytes, paged_decode_attention
from llm_anatomy.serve.paged_kv import PagedKVPool


def test_reading_the_blocks_in_place_equals_sdpa_over_the_contiguous_cache(tiny):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 128, (1, n), generator=g) for n in (5, 13, 1)]  # [1, seq] each
    pool = PagedKVPool.for_model(tiny, num_blocks=16, block_size=4)
    pool.allocate(3)  # the rows' blocks start elsewhere than block 0
    tables, contiguous = [], []
    with torch.no_grad():
        for ids in prompts:
            paged, flat = pool.new_cache(1), tiny.new_cache(1, ids.shape[1])
            prefill(tiny, ids, paged)
            prefill(tiny, ids, flat)
            tables.append(paged.block_tables[0])
            contiguous.append(flat)
    cfg = tiny.cfg
    q = torch.randn(3, cfg.num_heads, 1, cfg.head_dim, generator=g)  # [rows, heads, 1, head_dim]
    lengths = [ids.shape[1] for ids in prompts]
    for layer in range(cfg.num_layers):
        ours = paged_decode_attention(q, pool.keys[layer], pool.values[layer], tables, lengths)
        gathered = gather_then_attend(q, pool.keys[layer], pool.values[layer], tables, lengths)
        for row, cache in enumerate(contiguous):
            k, v = cache.keys[layer][:, :, :lengths[row]], cache.values[layer][:, :, :lengths[row]]  # [1, kv, n, d]
            group = cfg.num_heads // cfg.num_kv_heads
            want = F.scaled_dot_product_attention(q[row:row + 1], repeat_kv(k, group), repeat_kv(v, group))
            torch.testing.assert_close(ours[row:row + 1], want, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(gathered[row:row + 1], want, atol=1e-6, rtol=1e-5)
    assert gathered_bytes(pool.keys[0], lengths) == 2 * 3 * 13 * cfg.num_kv_heads * cfg.head_dim * 4


def test_a_block_read_in_place_is_a_view_of_the_pool_and_bad_input_is_refused():
    keys = torch.randn(4, 2, 4, 8)  # [blocks, kv_heads, block_size, head_dim]
    assert keys[2, :, :3].data_ptr() == keys[2].data_ptr()  # what the loop reads: the pool's own memory
    q = torch.randn(1, 4, 1, 8)
    with pytest.raises(CourseError, match="needs 2 blocks"):
        paged_decode_attention(q, keys, keys, [[1]], [5])
    with pytest.raises(CourseError, match="one new query"):
        paged_decode_attention(torch.randn(1, 4, 2, 8), keys, keys, [[1]], [2])
    with pytest.raises(CourseError, match="one length per row"):
        paged_decode_attention(q, keys, keys, [[1], [2]], [2])
