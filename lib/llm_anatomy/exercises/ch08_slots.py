"""Exercise 8.4 of notebook 08: the slot mapping, where each new token's K and V go in the paged pool.

An iteration of the scheduler hands the model each request's block table and the positions of its new tokens (a
prompt chunk, or one decode position). Before attention, every new K and V is written to its slot in the pool,
counted flat over the blocks: position p of a request sits in physical block table[p // block_size], at offset
p % block_size, so in slot block x block_size + offset (vLLM's `slot_mapping`). The check compares the learner's
function with where the engine itself writes (paged_kv.RaggedPagedView, which the engine's model runner makes
every iteration) on iterations the notebook never showed, with the library's slot_mapping and the view refused while the
learner's code runs, and names each typical mistake.
"""

from __future__ import annotations

import random

from ..serve import paged_kv
from ..serve.paged_kv import PagedKVPool, RaggedPagedView, blocks_for
from . import call, exercise, expect, forbidden_all, hints, returned


def _variant(tables, positions, size, *, logical=False, swapped=False, plus_one=False, one_based=False,
             no_multiply=False, list_index=False, first_table=False) -> list[int] | None:
    """The slot mapping with one typical mistake switched on (all off: the right one); None where it cannot run."""
    slots = []
    try:
        for table, wanted in zip(tables, positions):
            table = tables[0] if first_table else table
            for i, p in enumerate(wanted):
                p = i if list_index else p - 1 if one_based else p
                block, offset = (p % size, p // size) if swapped else (p // size, p % size)
                physical = block if logical else table[block]
                slots.append((physical if no_multiply else physical * size) + offset + plus_one)
    except IndexError:
        return None
    return slots


_MISTAKES = [
    (dict(logical=True), "you used the logical block, p // block_size, as if it were the pool's block: the request's "
                         "blocks are anywhere in the pool. Look the physical block up in its block table: "
                         "table[p // block_size]."),
    (dict(swapped=True), "// and % are swapped: the block of the request is p // block_size (which block), the offset "
                         "inside it p % block_size (where in the block)."),
    (dict(plus_one=True), "off by one on the block offset: offsets count from 0, so a block's first position is slot "
                          "block x block_size + 0."),
    (dict(one_based=True), "off by one: positions count from 0 (the prompt's first token is position 0), so use p "
                           "itself, not p - 1."),
    (dict(no_multiply=True), "a block holds block_size slots, so block b starts at slot b x block_size: multiply the "
                             "physical block by block_size before adding the offset."),
    (dict(list_index=True), "use each position's own value, not its index in the list: a decode's one new position is "
                            "the request's length so far, not 0."),
    (dict(first_table=True), "each request has its own block table: use block_tables[i] for request i's positions."),
]


def _iterations(seed: int):
    """Held-back iterations: (block tables, new positions per request, block size, lengths, news). The tables are
    shuffled pool blocks (never the logical order), long enough that a swapped // and % still names a block; a
    request adds a prompt chunk or one decode position."""
    rng = random.Random(seed)
    for size in (2, 3, 4, 2, 3, 4, 16):
        rows = rng.randint(1, 4)
        lengths = [rng.randint(0, 3 * size) for _ in range(rows)]
        news = [rng.choice([1, 1, rng.randint(2, 2 * size)]) for _ in range(rows)]
        ends = [a + b for a, b in zip(lengths, news)]
        need = [max(blocks_for(e, size), size if size < 16 else 1) for e in ends]  # room for a swapped // and %
        pool = list(range(sum(need) + 3))
        rng.shuffle(pool)
        while pool[:1] == [0]:  # block 0 first would hide a logical-block mistake on the first position
            rng.shuffle(pool)
        tables, start = [], 0
        for n in need:
            tables.append(pool[start:start + n])
            start += n
        positions = [list(range(a, e)) for a, e in zip(lengths, ends)]
        yield tables, positions, size, lengths, news, len(pool)


def engine_slots(tables, lengths, news, size: int, num_blocks: int) -> list[int]:
    """Where the engine writes this iteration's new K and V (RaggedPagedView's writes), as flat slots, request by
    request, each request's positions in order."""
    pool = PagedKVPool(1, num_blocks, size, kv_heads=1, head_dim=1)
    view = RaggedPagedView(pool, [list(t) for t in tables], lengths, news)
    return (view.write_blocks * size + view.write_slots).tolist()


@exercise
@hints("A position names a place in its own request; the pool counts slots over its physical blocks. What turns "
       "the first into the second?",
       "Split the position into which block of the request it is in (//) and where inside that block (%). The "
       "request's own block table turns the first into a block of the pool, and pool block b starts at slot "
       "b x block_size.",
       "for table, ps in zip(block_tables, positions): for p in ps: slots.append(table[p // block_size] * "
       "block_size + p % block_size); return slots")
def check_slot_mapping(slot_mapping_fn) -> str:
    """slot_mapping_fn(block_tables, positions, block_size) -> one flat slot per new position, request by request."""
    expect(callable(slot_mapping_fn), "define slot_mapping(block_tables, positions, block_size) returning a list.")
    for tables, positions, size, lengths, news, num_blocks in _iterations(seed=84):
        with forbidden_all([(paged_kv, "slot_mapping"), RaggedPagedView],
                           "look each position up in its block table yourself: the mapping is the exercise"):
            got = call(slot_mapping_fn, [list(t) for t in tables], [list(p) for p in positions], size)
        got = returned(got, "ids", "the slot mapping")
        want = engine_slots(tables, lengths, news, size, num_blocks)
        expect(len(got) == len(want), f"{sum(news)} new positions in all need {len(want)} slots, one each, request "
                                      f"by request; you gave {len(got)}.")
        if got != want:
            for mistake, message in _MISTAKES:
                expect(got != _variant(tables, positions, size, **mistake), message)
            expect(False, f"block tables {tables}, positions {positions}, blocks of {size}: the engine writes to "
                          f"slots {want}, you gave {got}.")
    return ("the slot of every new position, as the engine writes it: vLLM computes this slot_mapping for every "
            "iteration, and its kernel writes each new K and V there before attention reads them.")
