"""Checks for notebook 08 (serving many users): a block allocator, the scheduler's admission step, chained block keys.

Each check runs the learner's piece on inputs the notebook never showed, compares it with the library
(paged_kv.BlockAllocator, scheduler.admit, prefix_cache.block_keys), and names the typical mistake when it differs.
"""

from __future__ import annotations

import random

from ..serve.paged_kv import BlockAllocator
from ..serve.prefix_cache import block_keys
from ..serve.scheduler import admit
from . import call, exercise, expect, hint, hints  # noqa: F401  (hint: for the notebook)


def _refused(fn, *args) -> bool:
    try:
        fn(*args)
    except Exception:
        return True
    return False


@exercise
@hints("allocate() pops a block off self.free and sets its count to 1; release() is where the care goes.",
       "A shared block has several holders: release() lowers its count, and only a count of 0 frees the block.",
       "release: refuse when refs[b] == 0; refs[b] -= 1; if refs[b] == 0: self.free.append(b)")
def check_allocator(cls) -> str:
    """cls(num_blocks) with .free (list of free ids), .refs (count per block), allocate(), share(b), release(b)."""
    expect(isinstance(cls, type), "give the class itself (MyAllocator), not an instance.")
    rng = random.Random(8)
    for num_blocks in (1, 3, 6):
        mine, ref = cls(num_blocks), BlockAllocator(num_blocks)
        held: dict[int, int] = {}  # learner's block -> library's block
        for _ in range(60):
            op = rng.choice(["allocate", "allocate", "share", "release", "release"])
            if op == "allocate":
                if ref.num_free == 0:
                    expect(_refused(mine.allocate), f"with all {num_blocks} blocks in use, allocate() must refuse "
                                                    "(raise an error), not hand out a block someone holds.")
                    continue
                block = mine.allocate()
                expect(isinstance(block, int), f"allocate() must return a block id (an int), not {block!r}.")
                expect(block not in mine.free, f"allocate() handed out block {block} but left it on the free list, "
                                               "so it would be handed out again while still in use: take it off.")
                expect(block not in held, f"allocate() handed out block {block}, which is still in use: take the "
                                           "block off the free list when you hand it out.")
                expect(mine.refs[block] == 1, f"a freshly allocated block has one holder: refs[{block}] should be "
                                              f"1, not {mine.refs[block]}.")
                held[block] = ref.allocate()
            elif held:
                block = rng.choice(sorted(held))
                if op == "share":
                    mine.share(block)
                    ref.incref(held[block])
                else:
                    before = mine.refs[block]
                    mine.release(block)
                    ref.decref(held[block])
                    if ref.refcount(held[block]) > 0:
                        expect(block not in mine.free,
                               f"block {block} was held {before} times and released once: it is still in use, "
                               "so it must not go back on the free list yet. Only free it when refs reaches 0.")
                    else:
                        expect(block in mine.free, f"block {block} has no holder left after release(): put it "
                                                   "back on the free list.")
                        del held[block]
            expect(len(mine.free) == ref.num_free,
                   f"after {op}: {len(mine.free)} blocks on your free list, {ref.num_free} expected.")
            for block, theirs in held.items():
                expect(mine.refs[block] == ref.refcount(theirs),
                       f"after {op}: refs[{block}] is {mine.refs[block]}, expected {ref.refcount(theirs)}: share() "
                       "adds one holder, release() removes one.")
    fresh = cls(2)
    block = fresh.allocate()
    fresh.release(block)
    expect(_refused(fresh.release, block), f"release({block}) of a free block must refuse: a double free would put "
                                           "it on the free list twice and hand it to two requests.")
    return "a free list and a count of holders per block: what vLLM's block manager keeps for every GPU block."


@exercise
@hints("Walk the queue in order and count; three things can stop a request: time, slots, blocks.",
       "Keep a running count of free blocks: each request that joins takes its blocks from it. Stop (break) at the "
       "first request that cannot join, even if a later one would fit.",
       "for arrival, need in zip(...): if arrival > now or running + joined >= max_batch or need > free_blocks: "
       "break; free_blocks -= need; joined += 1")
def check_admission(admit_fn) -> str:
    """admit_fn(arrivals, blocks_needed, running, free_blocks, max_batch, now) -> how many head requests join."""
    expect(callable(admit_fn), "define admit(arrivals, blocks_needed, running, free_blocks, max_batch, now).")
    cases = [  # (arguments, the mistake that gives another answer)
        (([0.0, 0.5, 3.0], [1, 1, 1], 0, 9, 8, 1.0), "a request that arrives at 3.0 s cannot join at 1.0 s: check "
                                                      "arrival <= now."),
        (([0.0, 0.0, 0.0], [1, 1, 1], 3, 9, 4, 0.0), "3 requests run and max_batch is 4: one slot is free, so only "
                                                      "one joins."),
        (([0.0, 0.0, 0.0], [3, 3, 3], 0, 7, 8, 0.0), "7 free blocks hold two prompts of 3 blocks, not three: subtract "
                                                      "what each admitted request takes."),
        (([0.0, 0.0, 0.0], [2, 9, 1], 0, 5, 8, 0.0), "the second request needs 9 blocks and only 3 are left: it waits, "
                                                      "and so does the third (first come, first served: no "
                                                      "overtaking). Stop at the first that cannot join."),
    ]
    for args, hint in cases:
        got = call(admit_fn, *[list(a) if isinstance(a, list) else a for a in args])
        expect(isinstance(got, int) and not isinstance(got, bool), f"return a number of requests, not {got!r}.")
        expect(got == admit(*args), f"admit{args} should be {admit(*args)}, you said {got}: {hint}")
    rng = random.Random(15)
    for _ in range(200):
        n = rng.randint(0, 6)
        args = (sorted(round(rng.uniform(0, 2), 1) for _ in range(n)), [rng.randint(1, 4) for _ in range(n)],
                rng.randint(0, 4), rng.randint(0, 12), rng.randint(1, 6), round(rng.uniform(0, 2), 1))
        got = call(admit_fn, *[list(a) if isinstance(a, list) else a for a in args])
        expect(got == admit(*args), f"admit{args} should be {admit(*args)}, you said {got!r}.")
    return "arrived, a free slot, room for the prompt, in order: the admission step of every continuous batcher."


@exercise
@hints("Loop over the full blocks only: range(0, len(tokens) - block_size + 1, block_size).",
       "Each key must depend on everything before it: hash the previous key together with this block's tokens.",
       "parent = hashlib.sha256((parent + str(tokens[start:start + block_size])).encode()).hexdigest(); "
       "keys.append(parent)")
def check_block_keys(keys_fn) -> str:
    """keys_fn(tokens, block_size) -> one key per full block, chained to the key of the block before it."""
    expect(callable(keys_fn), "define block_keys(tokens, block_size) returning a list of keys.")
    rng = random.Random(4)
    for block_size in (2, 3, 4):
        a = [rng.randint(0, 99) for _ in range(5 * block_size + 1)]
        got = call(keys_fn, list(a), block_size)
        expect(isinstance(got, list), f"return a list of keys, not {type(got).__name__}.")
        expect(len(got) == len(a) // block_size, f"{len(a)} tokens in blocks of {block_size} make "
                                                 f"{len(a) // block_size} full blocks: one key each, none for the "
                                                 f"partial block at the end; you gave {len(got)}.")
        same = call(keys_fn, list(a[:3 * block_size]) + [7] * (2 * block_size), block_size)
        expect(got[:3] == same[:3] and got[3] != same[3],
               "two prompts that agree on their first 3 blocks must share those 3 keys, and differ from the 4th on.")
        moved = [rng.randint(100, 199) for _ in range(block_size)] + list(a[block_size:])  # only block 0 differs
        other = call(keys_fn, moved, block_size)
        expect(all(x != y for x, y in zip(got, other)),
               "these prompts differ only in their FIRST block, so every later key must differ too: the same "
               "tokens after a different start have different keys and values. Chain each key to the one before.")
        lib_a, lib_b = block_keys(a, block_size), block_keys(moved, block_size)
        expect([x == y for x, y in zip(got, other)] == [x == y for x, y in zip(lib_a, lib_b)],
               "your keys agree where the library's do not.")
        expect(call(keys_fn, list(a), block_size) == got, "the same tokens must give the same keys every time.")
    return "a key names the whole prefix up to its block, so a hit guarantees the same K and V."
