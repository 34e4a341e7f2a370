"""The block manager: one pool sizing that holds what it promises, admission counted past the cached prefix, room
made by evicting only blocks the cache alone holds, and blocks handed back on release."""

from __future__ import annotations

import pytest

from llm_anatomy.serve.batching import Request
from llm_anatomy.serve.block_manager import BlockManager, pool_blocks
from llm_anatomy.serve.paged_kv import PagedKVPool
from llm_anatomy.serve.scheduler import ContinuousScheduler


def _manager(blocks=8, size=4, prefix_cache=True):
    return BlockManager(PagedKVPool(1, blocks, size, kv_heads=1, head_dim=2), prefix_cache)


def test_pool_blocks_is_each_length_in_whole_blocks_plus_the_spare():
    assert pool_blocks([17, 17, 17], 16) == 3 * 2 + 4
    assert pool_blocks([1, 16, 33], 16, spare=0) == 1 + 1 + 3
    assert pool_blocks([], 16, spare=2) == 2


@pytest.mark.parametrize("missing", [0, 1])
def test_a_pool_sized_by_pool_blocks_runs_its_requests_together_and_one_block_less_does_not(tiny, missing):
    requests = [Request(list(range(3, 3 + n)), 5) for n in (6, 11, 3)]  # 11, 16 and 8 positions
    blocks = pool_blocks([len(r.prompt) + r.max_new_tokens for r in requests], 4, spare=0) - missing
    sched = ContinuousScheduler(tiny, PagedKVPool.for_model(tiny, blocks, 4), max_batch=3)
    out = sched.run(requests)
    assert all(r.done for r in out)
    assert (sum(r.preempted for r in out) > 0) == bool(missing)  # the sizing is tight: one block less preempts


def test_admission_needs_count_only_the_blocks_past_the_cached_prefix():
    bm = _manager(blocks=8, size=4)
    prompt = list(range(10, 20))  # 10 tokens: 3 blocks, 2 of them full
    assert bm.admission_needs([prompt]) == ([3], 8)
    table = bm.pool.allocate(3)
    bm.keep(prompt, table)  # the two full blocks are cached (held by the table and the cache)
    bm.release(table)  # the table lets go: the partial block is free, the two cached blocks stay held by the cache
    assert bm.pool.allocator.num_free == 6 and bm.cached() == sorted(table[:2])
    needs, free = bm.admission_needs([prompt + [99], list(range(50, 55))])
    assert needs == [1, 2]  # 11 tokens: 3 blocks, 2 cached; another prompt finds none
    assert free == 6  # the cached blocks a prompt here reuses are not counted as room
    assert bm.admission_needs([list(range(50, 55))])[1] == 8  # with no prompt reusing them, both could be evicted
    taken = bm.take_prefix(prompt + [99])
    assert taken == table[:2] and all(bm.pool.allocator.refcount(b) == 2 for b in taken)


def test_make_room_evicts_only_blocks_the_cache_alone_holds_and_books_nothing():
    bm = _manager(blocks=4, size=4)
    table = bm.pool.allocate(2)
    bm.keep(list(range(8)), table)  # both blocks cached, still held by the table too
    rows = [([], 8)]  # a new row needs 2 blocks; 2 are free
    assert bm.make_room(rows) and bm.pool.allocator.num_free == 2  # enough: nothing evicted, nothing booked
    assert bm.cached() == sorted(table)
    assert not bm.make_room([([], 16)])  # 4 blocks: the cached ones are still held by their table
    bm.release(table)
    assert bm.make_room([([], 16)]) and bm.cached() == [] and bm.pool.allocator.num_free == 4  # evicted for room
    bm.grow([(r := [], 9)])
    assert len(r) == 3 and bm.pool.allocator.num_free == 1


def test_without_a_prefix_cache_nothing_is_kept():
    bm = _manager(prefix_cache=False)
    table = bm.pool.allocate(2)
    bm.keep(list(range(8)), table)
    bm.release(table)
    assert bm.cached() == [] and bm.pool.allocator.num_free == 8 and bm.take_prefix(list(range(9))) == []
