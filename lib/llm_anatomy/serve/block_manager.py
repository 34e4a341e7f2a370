"""The block manager: which blocks of the paged pool each running request holds, and the prefix cache beside them.

The scheduler decides who runs; this decides whether the pool can hold it, as nano-vllm's BlockManager does. It
answers two questions and keeps the books that follow from the answers:
    can these prompts join?     `admission_needs`: the new blocks each needs past its cached prefix, and the room;
                                `take_prefix` then hands a joiner its cached blocks
    can this iteration run?     `make_room`: the blocks its rows lack against the free ones (evicting cached blocks
                                that nobody else holds, least recently used first); `grow` then books them
and when a request leaves, `keep` puts a finished one's full blocks in the prefix cache and `release` lets go of its
table. Block tables are plain lists of block ids (paged_kv.py), kept on the scheduler's Admission.
"""

from __future__ import annotations

from .paged_kv import PagedKVPool, blocks_for
from .prefix_cache import PrefixCache


def pool_blocks(lengths: list[int], block_size: int, spare: int = 4) -> int:
    """How many blocks a pool needs to hold requests of `lengths` positions all at once, with `spare` blocks more
    (room for a row that allocates before an earlier one lets go). The course's one pool sizing: benchmarks,
    notebooks and load sweeps size their pools with it; `max_batch` requests of max_len: [max_len] * max_batch."""
    return sum(blocks_for(n, block_size) for n in lengths) + spare


class BlockManager:
    """The pool's blocks as the scheduler books them; prefix_cache keeps and shares full prompt blocks."""

    def __init__(self, pool: PagedKVPool, prefix_cache: bool = False):
        self.pool, self.block_size = pool, pool.block_size
        self.prefix_cache = PrefixCache(pool.allocator, pool.block_size) if prefix_cache else None

    def admission_needs(self, prompts: list[list[int]]) -> tuple[list[int], int]:
        """For each of `prompts` (in queue order), the blocks it needs past its cached prefix; and the blocks free
        for them (free now, plus cached blocks that only the cache holds and no prompt here would reuse)."""
        pc = self.prefix_cache
        matched = [pc.match(p) if pc is not None else [] for p in prompts]
        free = self.pool.allocator.num_free + (pc.evictable({b for m in matched for b in m}) if pc is not None else 0)
        return [blocks_for(len(p), self.block_size) - len(m) for p, m in zip(prompts, matched)], free

    def take_prefix(self, tokens: list[int]) -> list[int]:
        """The start of a new block table: the blocks of the longest cached prefix of `tokens`, now held once more."""
        return self.prefix_cache.acquire(tokens) if self.prefix_cache is not None else []

    def make_room(self, rows: list[tuple[list[int], int]]) -> bool:
        """Whether every (block table, positions) of `rows` can grow to hold its positions now, evicting cached
        blocks as needed; books nothing (grow() does)."""
        short = sum(self.pool.missing(table, positions) for table, positions in rows) - self.pool.allocator.num_free
        if short > 0 and self.prefix_cache is not None:
            short -= self.prefix_cache.evict(short)
        return short <= 0

    def grow(self, rows: list[tuple[list[int], int]]) -> None:
        """Give each block table of `rows` the blocks for its positions (all or none)."""
        self.pool.extend([table for table, _ in rows], [positions for _, positions in rows])

    def keep(self, tokens: list[int], table: list[int]) -> None:
        """Keep the full blocks of `tokens` (held by `table`) in the prefix cache, when there is one."""
        if self.prefix_cache is not None:
            self.prefix_cache.insert(tokens, table)

    def release(self, table: list[int]) -> None:
        """Let go of a block table: each block is free again, unless the prefix cache or another table holds it."""
        for block in table:
            self.pool.allocator.decref(block)

    def cached(self) -> list[int]:
        """The block ids the prefix cache keeps, in order (none without one)."""
        return sorted(self.prefix_cache.blocks()) if self.prefix_cache is not None else []
