"""The paged KV cache (claim C14): its allocator, where blocks are handed out, exactness against the contiguous cache,
the ragged view the scheduler reads it through, and sharing."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.serve.block_manager import pool_blocks
from llm_anatomy.serve.paged_kv import BlockAllocator, PagedKVPool, RaggedPagedView, blocks_for, slot_mapping
from llm_anatomy.generate.decode import decode_step, prefill


def _state(alloc: BlockAllocator):
    return list(alloc._free), list(alloc._refs)


def _decode(model, ids, cache, new_tokens, forced=None):
    """Prefill `ids` [batch, seq], then one token a step; returns (tokens [batch, new], logits of every step).

    forced: optional [batch, n] ids fed before decoding greedily (to give forked sequences different paths).
    """
    logits = [model(ids, cache)]  # prefill: every prompt position, [batch, seq, vocab]
    for i in range(0 if forced is None else forced.shape[1]):
        logits.append(model(forced[:, i:i + 1], cache))
    tokens = []
    for _ in range(new_tokens):
        nxt = logits[-1][:, -1:].argmax(-1)  # [batch, 1]
        tokens.append(nxt)
        logits.append(model(nxt, cache))
    return torch.cat(tokens, 1), logits


# --------------------------------------------------------------------------- the allocator


def test_allocator_hands_out_every_block_once_then_refuses_without_changing_anything():
    alloc = BlockAllocator(3)
    got = [alloc.allocate() for _ in range(3)]
    assert sorted(got) == [0, 1, 2] and alloc.num_free == 0
    before = _state(alloc)
    with pytest.raises(CourseError, match="the KV pool is out of blocks"):
        alloc.allocate()
    assert _state(alloc) == before
    alloc.free(got[1])
    assert alloc.num_free == 1 and alloc.refcount(got[1]) == 0
    assert alloc.allocate() == got[1]  # the freed block is the one handed out next


def test_reference_counts_free_a_block_only_when_nobody_holds_it():
    alloc = BlockAllocator(2)
    b = alloc.allocate()
    alloc.incref(b)
    alloc.incref(b)
    assert alloc.refcount(b) == 3
    alloc.decref(b)
    alloc.free(b)
    assert alloc.refcount(b) == 1 and alloc.num_free == 1  # still held once: not free
    alloc.decref(b)
    assert alloc.refcount(b) == 0 and alloc.num_free == 2


@pytest.mark.parametrize("call, block", [("free", 0), ("decref", 1), ("incref", 0), ("free", 5), ("free", -1),
                                         ("incref", True)])
def test_releasing_or_sharing_a_free_or_unknown_block_is_refused_and_changes_nothing(call, block):
    alloc = BlockAllocator(2)
    alloc.allocate()
    alloc.free(0)  # block 0 is free again; block 1 was never handed out
    before = _state(alloc)
    with pytest.raises(CourseError):
        getattr(alloc, call)(block)
    assert _state(alloc) == before


def test_blocks_for_is_the_fewest_blocks_that_hold_the_positions():
    for size in (1, 4, 16):
        for n in range(0, 40):
            b = blocks_for(n, size)
            assert b * size >= n and (b == 0 or (b - 1) * size < n), (n, size, b)


def test_the_slot_mapping_by_hand_and_where_the_view_writes():
    tables = torch.tensor([[3, 1], [0, 2]])  # [rows, blocks] two requests' block tables, blocks of 4
    slots = slot_mapping(tables, torch.tensor([[0, 5], [3, 4]]), 4)
    assert slots.tolist() == [[12, 5], [3, 8]]  # 0 -> block 3, offset 0; 5 -> block 1, offset 1; 3 -> 0.3; 4 -> 2.0
    pool = PagedKVPool(1, 4, 4, kv_heads=1, head_dim=1)
    view = RaggedPagedView(pool, [[3, 1], [0, 2]], lengths=[5, 3], news=[1, 2])  # writes 5; and 3, 4
    assert (view.write_blocks * 4 + view.write_slots).tolist() == [5, 3, 8]


def test_the_pool_hands_out_blocks_all_or_none(tiny):
    pool = PagedKVPool.for_model(tiny, num_blocks=5, block_size=4)
    tables = [[], [pool.allocate(1)[0]]]  # the second holds one block already: 4 positions
    pool.extend(tables, [9, 5])  # 9 positions need 3 blocks, 5 need 2: one more
    assert [len(t) for t in tables] == [3, 2] and pool.allocator.num_free == 0
    assert len({b for t in tables for b in t}) == 5  # every block handed out once
    before = [list(t) for t in tables], _state(pool.allocator)
    with pytest.raises(CourseError, match="needs 1 more and 0 of 5 are free"):
        pool.extend(tables, [9, 9])  # the first has room already; the second would need one more
    assert ([list(t) for t in tables], _state(pool.allocator)) == before
    assert pool.missing(tables[0], 12) == 0 and pool.missing(tables[0], 13) == 1


# --------------------------------------------------------------------------- exactness against the contiguous cache


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_tiny_model_paged_equals_contiguous_bit_for_bit(tiny, block_size):
    ids = torch.randint(3, 128, (2, 21), generator=torch.Generator().manual_seed(block_size))  # 21: mid-block for 4, 16
    new = 20
    pool = PagedKVPool.for_model(tiny, num_blocks=pool_blocks([21 + new] * 2, block_size, spare=3),
                                block_size=block_size)
    paged = pool.new_cache(2)
    tok_p, log_p = _decode(tiny, ids, paged, new)
    tok_c, log_c = _decode(tiny, ids, tiny.new_cache(2, 21 + new), new)
    assert torch.equal(tok_p, tok_c)
    diffs = [float((a - b).abs().max()) for a, b in zip(log_p, log_c)]
    assert max(diffs) == 0.0, f"max |paged - contiguous| per step: {diffs}"
    assert paged.length == 21 + new  # the prompt, then one position per step
    blocks = blocks_for(paged.length, block_size)
    assert [len(t) for t in paged.block_tables] == [blocks, blocks]  # one block per block_size positions, no more
    assert pool.allocator.num_free == pool.num_blocks - 2 * blocks
    assert len({b for t in paged.block_tables for b in t}) == 2 * blocks  # no block holds two sequences
    # the bytes: real positions as the contiguous cache counts them, reserved only up to the last block
    assert paged.used_bytes() == tiny.new_cache(2, paged.length).allocated_bytes()
    assert paged.allocated_bytes() == 2 * blocks * pool.bytes_per_block()
    per_slot = pool.bytes_per_block() // block_size  # the only waste: the empty slots of each last block
    assert paged.allocated_bytes() - paged.used_bytes() == 2 * (blocks * block_size - paged.length) * per_slot
    paged.free()
    assert pool.allocator.num_free == pool.num_blocks and paged.block_tables == [[], []]


def test_real_model_paged_equals_contiguous(real, real_scratch):
    # 19 prompt tokens: block boundaries fall mid-prompt for block sizes 4 and 16
    ids = real.tokenizer("The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is",
                         return_tensors="pt").input_ids
    prompt, new = ids.shape[1], 14  # 19 + 14 = 33 positions: with block_size 16 the decode also opens a third block
    assert prompt % 16 and prompt % 4 and prompt > 16 and prompt + new > 32
    tok_c, log_c = _decode(real_scratch, ids, real_scratch.new_cache(1, prompt + new), new)
    for block_size in (1, 4, 16):
        pool = PagedKVPool.for_model(real_scratch, num_blocks=blocks_for(prompt + new, block_size),
                                     block_size=block_size)  # exactly enough blocks
        tok_p, log_p = _decode(real_scratch, ids, pool.new_cache(1), new)
        diffs = [float((a - b).abs().max()) for a, b in zip(log_p, log_c)]
        print(f"block_size {block_size}: max |paged - contiguous| logit difference {max(diffs)}")
        assert torch.equal(tok_p, tok_c), f"block_size {block_size}: {tok_p.tolist()} != {tok_c.tolist()}"
        assert max(diffs) == 0.0, f"block_size {block_size}: max |paged - contiguous| per step: {diffs}"
        assert pool.allocator.num_free == 0
    assert real.tokenizer.decode(tok_c[0]).strip() != ""  # the model did say something


def test_running_out_of_blocks_mid_decode_is_refused_and_changes_nothing(tiny):
    pool = PagedKVPool.for_model(tiny, num_blocks=2, block_size=4)
    cache = pool.new_cache(1)
    tiny(torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]]), cache)  # 8 positions fill both blocks exactly
    assert pool.allocator.num_free == 0
    tables, k0 = [list(t) for t in cache.block_tables], [t.clone() for t in pool.keys]
    with pytest.raises(CourseError, match="the KV pool is out of blocks"):
        tiny(torch.tensor([[13]]), cache)
    assert cache.length == 8 and cache.block_tables == tables
    assert all(torch.equal(a, b) for a, b in zip(k0, pool.keys))  # nothing was written
    other = pool.new_cache(1)  # a second request in the same pool is refused too
    with pytest.raises(CourseError, match="out of blocks"):
        tiny(torch.tensor([[13]]), other)
    assert other.block_tables == [[]] and other.length == 0
    cache.free()
    tiny(torch.tensor([[13]]), other)  # freeing the first request makes room
    assert other.length == 1 and len(other.block_tables[0]) == 1


def test_a_padded_batch_is_served_as_the_contiguous_cache_serves_it(tiny):
    """The caller's mask hides the padding, at the prefill and (extended) at each decode step: the paged cache stores
    no padding of its own, and gives the contiguous cache's logits, bit for bit."""
    from llm_anatomy.generate.decode import extend_mask

    pool = PagedKVPool.for_model(tiny, num_blocks=8, block_size=4)
    ids, mask = torch.tensor([[2, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    logits = []
    for cache in (pool.new_cache(2), tiny.new_cache(2, 8)):
        steps = [prefill(tiny, ids, cache, attention_mask=mask).logits]
        step_mask = mask
        for token in (11, 12):
            step_mask = extend_mask(step_mask)  # [2, 4], then [2, 5]
            steps.append(decode_step(tiny, torch.tensor([[token], [token]]), cache, attention_mask=step_mask).logits)
        assert cache.length == 5
        logits.append(torch.cat(steps, 1))
    assert torch.equal(*logits)
    alone = prefill(tiny, torch.tensor([[5, 6, 11, 12]]), tiny.new_cache(1, 8), logits_to_keep=0).logits
    assert torch.allclose(logits[0][0], alone[0, 1:], atol=1e-5)  # the padded row reads as if alone


# --------------------------------------------------------------------------- sharing a prefix: fork and copy-on-write


@pytest.mark.parametrize("block_size", [4, 16])
def test_forked_sequences_match_each_run_alone_and_share_their_prefix_blocks(tiny, block_size):
    prompt = torch.randint(3, 128, (1, 18), generator=torch.Generator().manual_seed(1))  # 18: mid-block
    suffixes = torch.tensor([[40, 41, 42], [90, 91, 92]])  # two different continuations of the same prompt
    new = 10
    pool = PagedKVPool.for_model(tiny, num_blocks=20, block_size=block_size)
    cache = pool.new_cache(1)
    tiny(prompt, cache)  # the prompt is prefilled once
    prompt_blocks = list(cache.block_tables[0])
    assert cache.fork(0) == 1
    assert cache.block_tables == [prompt_blocks, prompt_blocks]
    assert all(pool.allocator.refcount(b) == 2 for b in prompt_blocks)
    assert cache.allocated_bytes() == len(prompt_blocks) * pool.bytes_per_block()  # shared blocks count once
    assert cache.used_bytes() == tiny.new_cache(1, 18).allocated_bytes()

    logits = [tiny(suffixes[:, i:i + 1], cache) for i in range(3)]
    tokens = []
    for _ in range(new):
        tokens.append(logits[-1][:, -1:].argmax(-1))
        logits.append(tiny(tokens[-1], cache))
    tokens = torch.cat(tokens, 1)

    for seq in range(2):
        alone_ids = torch.cat([prompt, suffixes[seq:seq + 1, :1]], 1)
        alone, _ = _decode(tiny, alone_ids, tiny.new_cache(1, 40), new, forced=suffixes[seq:seq + 1, 1:])
        assert torch.equal(tokens[seq], alone[0]), f"sequence {seq}: {tokens[seq].tolist()} != {alone[0].tolist()}"
    assert not torch.equal(tokens[0], tokens[1])  # the continuations really differ

    full = 18 // block_size  # full prompt blocks stay shared; the partly filled one was copied once
    t0, t1 = cache.block_tables
    assert t0[:full] == t1[:full] == prompt_blocks[:full]
    assert t0[full] != t1[full] and prompt_blocks[full] in (t0[full], t1[full])
    assert all(pool.allocator.refcount(b) == 2 for b in prompt_blocks[:full])
    distinct = len(set(t0) | set(t1))
    assert distinct == len(t0) + len(t1) - full
    assert cache.allocated_bytes() == pool.allocated_bytes() == distinct * pool.bytes_per_block()
    cache.free()
    assert pool.allocator.num_free == pool.num_blocks


def test_a_step_needing_more_blocks_than_are_free_takes_none_of_them(tiny):
    pool = PagedKVPool.for_model(tiny, num_blocks=3, block_size=4)
    cache = pool.new_cache(2)
    tiny(torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]), cache)  # one full block each, one block left
    before = [list(t) for t in cache.block_tables], _state(pool.allocator)
    with pytest.raises(CourseError, match="needs 2 more and 1 of 3 are free"):  # both sequences need a new block
        tiny(torch.tensor([[13], [14]]), cache)
    assert ([list(t) for t in cache.block_tables], _state(pool.allocator)) == before and cache.length == 4


def test_copy_on_write_needs_a_free_block_and_is_refused_cleanly_without_one(tiny):
    pool = PagedKVPool.for_model(tiny, num_blocks=2, block_size=4)
    cache = pool.new_cache(1)
    tiny(torch.tensor([[5, 6, 7, 8, 9]]), cache)  # blocks: one full, one with 1 of 4 slots filled
    cache.fork(0)
    assert pool.allocator.num_free == 0
    before = [list(t) for t in cache.block_tables], _state(pool.allocator)
    with pytest.raises(CourseError, match="out of blocks"):  # one of the two must copy the shared last block
        tiny(torch.tensor([[10], [11]]), cache)
    assert ([list(t) for t in cache.block_tables], _state(pool.allocator)) == before and cache.length == 5


# --------------------------------------------------------------------------- the scheduler's reader: ragged rows


def test_ragged_rows_in_one_call_equal_each_row_alone(tiny):
    """Rows of different cached lengths, adding different numbers of tokens, in one paged call: the same logits as
    each row alone; a single row without padding gives exactly the contiguous cache's logits."""
    pool = PagedKVPool.for_model(tiny, 24, 4)
    _through = lambda step, ids, view: step(tiny, ids, view, positions=view.positions,  # noqa: E731 as the runner
                                            attention_mask=view.mask)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33, 34]]
    chunks = [[40, 41, 42], [50], [60, 61, 62, 63, 64, 65]]  # then a chunk of 3, a decode, a chunk of 6
    tables = [[pool.allocator.allocate() for _ in range(blocks_for(len(p) + len(c), 4))]
              for p, c in zip(prompts, chunks)]
    first = RaggedPagedView(pool, tables, [0, 0, 0], [len(p) for p in prompts])  # all prompts in one call
    ids = torch.tensor([[0] * (7 - len(p)) + p for p in prompts])
    out = _through(prefill, ids, first).logits[:, -1]
    second = RaggedPagedView(pool, tables, [len(p) for p in prompts], [len(c) for c in chunks])
    ids = torch.tensor([[0] * (6 - len(c)) + c for c in chunks])
    out2 = _through(prefill, ids, second).logits[:, -1]
    for i, (p, c) in enumerate(zip(prompts, chunks)):
        for got, seq in ((out[i], p), (out2[i], p + c)):
            alone = prefill(tiny, torch.tensor([seq]), tiny.new_cache(1, 16)).logits[0, -1]
            assert torch.allclose(got, alone, atol=1e-5), (i, float((got - alone).abs().max()))
            assert int(got.argmax()) == int(alone.argmax())
    assert first.mask is not None and second.mask is not None
    contiguous = tiny.new_cache(1, 16)
    a = prefill(tiny, torch.tensor([prompts[0]]), contiguous).logits
    b = _through(prefill, torch.tensor([prompts[0]]), RaggedPagedView(pool, [tables[0]], [0], [len(prompts[0])])).logits
    assert torch.equal(a, b)  # one row, no padding: bit for bit
    c = decode_step(tiny, torch.tensor([[3]]), contiguous).logits
    d = _through(decode_step, torch.tensor([[3]]), RaggedPagedView(pool, [tables[0]], [7], [1])).logits
    assert torch.equal(c, d)
