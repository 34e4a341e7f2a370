"""One scheduler iteration decided from numbers alone (exercise 8.5's reference).

plan_iteration takes what schedule() knows about the running requests as plain numbers (positions cached, tokens not
yet cached, blocks held), the token budget and the free blocks, and returns the same decision schedule() makes when
there is no prefix cache to evict from: who decodes, which prompt chunks run, who is preempted. It books nothing;
tests/serve/test_scheduler.py holds it equal to the engine's own schedule() at every iteration of random traces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import CourseError
from .scheduler import plan


class RowState(NamedTuple):
    """A running request as plan_iteration sees it: positions cached, tokens not yet cached, blocks held."""

    computed: int
    pending: int
    blocks: int


@dataclass(eq=False)
class _Row:  # plan() reads .computed and .pending
    index: int
    computed: int
    pending: int


def plan_iteration(rows: list[RowState], max_batched_tokens: int | None, free_blocks: int, block_size: int,
                   prefill_first: bool = False) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    """One iteration decided from numbers alone, as schedule() decides it (without a prefix cache to evict from):
    the rows of `plan` (decodes first, then prompt chunks in admission order under what is left of the token budget),
    and, while the rows need more new blocks than are free, the youngest running request preempted, its blocks
    free again, and the rows planned anew without it. A row that grows to p positions needs ceil(p / block_size)
    blocks in all. rows: the running requests in admission order (oldest first).

    Returns (decoders, chunks, preempted): row indices that decode one token, (row index, tokens) prompt chunks, and
    the row indices preempted, youngest first. Pure: it books nothing (exercise 8.5 builds it)."""
    if block_size < 1 or free_blocks < 0:
        raise CourseError(f"block_size must be at least 1 and free_blocks at least 0, not {block_size} and {free_blocks}.")
    live, preempted = list(range(len(rows))), []
    while True:
        views = [_Row(i, rows[i].computed, rows[i].pending) for i in live]  # one object per row, even for equal rows
        decoders, chunks = plan(views, max_batched_tokens, prefill_first)
        decoders, chunks = [r.index for r in decoders], [(r.index, n) for r, n in chunks]
        need = sum(max(0, math.ceil((rows[i].computed + n) / block_size) - rows[i].blocks)
                   for i, n in [(i, 1) for i in decoders] + chunks)
        if need <= free_blocks or len(live) <= 1:
            return decoders, chunks, preempted
        youngest = live.pop()
        preempted.append(youngest)
        free_blocks += rows[youngest].blocks
