"""Checks for notebook 08 (serving many users): a block allocator, the scheduler's admission step, chained block keys
(the slot mapping, exercise 8.4, is in ch08_slots.py; one scheduler iteration, exercise 8.5, in ch08_plan.py).

Each check runs the learner's piece on inputs the notebook never showed, compares it with the library
(paged_kv.BlockAllocator, scheduler.admit, prefix_cache.block_keys), with the library's own piece refused while the
learner's code runs, and names the typical mistake when it differs.
"""

from __future__ import annotations

import random

from ..serve import prefix_cache, scheduler
from ..serve.paged_kv import BlockAllocator
from ..serve.prefix_cache import PrefixCache, block_keys
from ..serve.scheduler import admit
from . import NotYet, call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: notebook)
from .ch08_plan import check_plan_iteration  # noqa: F401  (exercise 8.5, one scheduler iteration, in its own file)
from .ch08_slots import check_slot_mapping  # noqa: F401  (exercise 8.4, the slot mapping, in its own file)


def _no_library_allocator() -> forbidden_all:
    return forbidden_all([BlockAllocator], "keep the free list and the counts yourself: the allocator is the exercise")


def _mine(method, *args):
    """Call one of the learner's methods, the library's allocator refused meanwhile."""
    with _no_library_allocator():
        return call(method, *args)


def _raises(method, *args) -> bool:
    """Whether the learner's method refuses (raises) for these arguments ("not attempted" is reported as such)."""
    try:
        with _no_library_allocator():
            method(*args)
    except (NotImplementedError, NotYet):
        raise
    except Exception:
        return True
    return False


def _free_list(mine):
    free = getattr(mine, "free", None)
    expect(hasattr(free, "__len__") and hasattr(free, "__contains__"),
           "keep the free block ids in self.free (a list, a set or a deque: anything with len() and `in`), not "
           f"{type(free).__name__}.")
    return free


def _holders(mine, block: int) -> int:
    refs = getattr(mine, "refs", None)
    expect(hasattr(refs, "__getitem__"), "keep each block's count of holders in self.refs (a list or a dict).")
    try:
        return returned(refs[block], "whole", f"refs[{block}]")
    except (KeyError, IndexError):
        return 0


@exercise
@hints("Three operations, one rule: a block is free exactly when nobody holds it. Which operation has to be careful?",
       "A shared block has several holders: release() lowers its count, and only a count of 0 frees the block. A free "
       "block has no holder to share or to release: both must refuse (raise).",
       "release: refuse when refs[b] == 0; refs[b] -= 1; if refs[b] == 0: self.free.append(b). share: refuse when "
       "refs[b] == 0; refs[b] += 1")
def check_allocator(cls) -> str:
    """cls(num_blocks) with .free (the free block ids), .refs (count per block), allocate(), share(b), release(b)."""
    expect(isinstance(cls, type), "give the class itself (MyAllocator), not an instance.")
    rng = random.Random(8)
    for num_blocks in (1, 3, 6):
        mine = _mine(cls, num_blocks)
        ref = BlockAllocator(num_blocks)
        held: dict[int, int] = {}  # learner's block -> library's block
        freed: list[int] = []  # learner's blocks that went back on the free list
        for _ in range(60):
            op = rng.choice(["allocate", "allocate", "share", "release", "release", "share a free one"])
            _step(mine, ref, op, held, freed, rng, num_blocks)
            expect(len(_free_list(mine)) == ref.num_free,
                   f"after {op}: {len(_free_list(mine))} blocks on your free list, {ref.num_free} expected.")
            for block, theirs in held.items():
                expect(_holders(mine, block) == ref.refcount(theirs),
                       f"after {op}: refs[{block}] is {_holders(mine, block)}, expected {ref.refcount(theirs)}: "
                       "share() adds one holder, release() removes one.")
    fresh = _mine(cls, 2)
    block = returned(_mine(fresh.allocate), "id", "the block allocate() hands out")
    _mine(fresh.release, block)
    expect(_raises(fresh.release, block), f"release({block}) of a free block must refuse: a double free would put it "
                                          "on the free list twice and hand it to two requests.")
    expect(_raises(fresh.share, block), f"share({block}) of a free block must refuse (raise): nobody holds it, so a "
                                        "request that shares it would read a block that the next allocate() hands to "
                                        "someone else.")
    return "a free list and a count of holders per block: what vLLM's block manager keeps for every GPU block."


def _step(mine, ref, op, held, freed, rng, num_blocks) -> None:
    """One random operation on the learner's allocator and on the library's, checked as it goes."""
    if op == "allocate":
        if ref.num_free == 0:
            expect(_raises(mine.allocate), f"with all {num_blocks} blocks in use, allocate() must refuse (raise an "
                                           "error), not hand out a block someone holds.")
            return
        block = returned(_mine(mine.allocate), "id", "the block id allocate() hands out")
        expect(block not in _free_list(mine), f"allocate() handed out block {block} but left it on the free list, "
                                              "so it would be handed out again while still in use: take it off.")
        expect(block not in held, f"allocate() handed out block {block}, which is still in use: take the block off "
                                  "the free list when you hand it out.")
        expect(_holders(mine, block) == 1, f"a freshly allocated block has one holder: refs[{block}] should be 1, not "
                                           f"{_holders(mine, block)}.")
        held[block] = ref.allocate()
        if block in freed:
            freed.remove(block)
    elif op == "share a free one":
        if freed:
            block = freed[-1]
            expect(_raises(mine.share, block), f"share({block}) of a free block must refuse (raise): nobody holds it, "
                                               "and the next allocate() would hand it to another request.")
    elif held:
        block = rng.choice(sorted(held))
        if op == "share":
            _mine(mine.share, block)
            ref.incref(held[block])
            return
        before = _holders(mine, block)
        _mine(mine.release, block)
        ref.decref(held[block])
        if ref.refcount(held[block]) > 0:
            expect(block not in _free_list(mine),
                   f"block {block} was held {before} times and released once: it is still in use, so it must not go "
                   "back on the free list yet. Only free it when refs reaches 0.")
        else:
            expect(block in _free_list(mine), f"block {block} has no holder left after release(): put it back on the "
                                              "free list.")
            del held[block]
            freed.append(block)


def _admit_with(arrivals, needed, running, free_blocks, max_batch, now, *, strict_arrival=False, ignore_arrival=False,
                overtake=False, no_subtract=False, ignore_running=False, ignore_batch=False, extra_slot=False,
                strict_blocks=False) -> int:
    """admit() with one typical mistake switched on (all off: admit itself)."""
    joined = 0
    for arrival, need in zip(arrivals, needed):
        arrived = ignore_arrival or (arrival < now if strict_arrival else arrival <= now)
        slot = ignore_batch or (joined if ignore_running else running + joined) < max_batch + extra_slot
        fits = need < free_blocks if strict_blocks else need <= free_blocks
        if not (arrived and slot and fits):
            if overtake:
                continue
            break
        free_blocks -= 0 if no_subtract else need
        joined += 1
    return joined


_ADMISSION_MISTAKES = [
    (dict(strict_arrival=True), "a request whose arrival time equals now has arrived: it may join (arrival <= now)."),
    (dict(ignore_arrival=True), "a request that arrives later than now cannot join yet: check arrival <= now."),
    (dict(overtake=True), "the first request that cannot join stops the queue: the ones behind it wait too (first "
                          "come, first served: no overtaking). Break, do not skip."),
    (dict(no_subtract=True), "each request that joins takes its blocks: subtract them from the free blocks before the "
                             "next request is considered."),
    (dict(ignore_running=True), "the requests already running hold slots too: a request joins while running + joined "
                                "< max_batch."),
    (dict(ignore_batch=True), "the batch has max_batch slots and `running` of them are taken: with 3 running and "
                              "max_batch 4, one slot is free, so only one request joins (running + joined < "
                              "max_batch)."),
    (dict(extra_slot=True), "one request too many joined: with running + joined == max_batch the batch is full."),
    (dict(strict_blocks=True), "a request whose prompt needs exactly the free blocks fits: need <= free blocks."),
]


@exercise
@hints("Walk the queue in order and count; three things can stop a request: time, slots, blocks.",
       "Keep a running count of free blocks: each request that joins takes its blocks from it. Stop (break) at the "
       "first request that cannot join, even if a later one would fit. A request that arrived at or before now has "
       "arrived.",
       "for arrival, need in zip(...): if arrival > now or running + joined >= max_batch or need > free_blocks: "
       "break; free_blocks -= need; joined += 1")
def check_admission(admit_fn) -> str:
    """admit_fn(arrivals, blocks_needed, running, free_blocks, max_batch, now) -> how many head requests join."""
    expect(callable(admit_fn), "define admit(arrivals, blocks_needed, running, free_blocks, max_batch, now).")
    cases = [([0.0, 0.5, 3.0], [1, 1, 1], 0, 9, 8, 1.0), ([0.0, 1.0, 3.0], [1, 1, 1], 0, 9, 8, 1.0),
             ([0.0, 0.0, 0.0], [1, 1, 1], 3, 9, 4, 0.0), ([0.0, 0.0, 0.0], [3, 3, 3], 0, 7, 8, 0.0),
             ([0.0, 0.0, 0.0], [2, 9, 1], 0, 5, 8, 0.0), ([0.0, 0.0], [2, 3], 0, 5, 8, 0.0)]
    rng = random.Random(15)
    for _ in range(200):
        n = rng.randint(0, 6)
        cases.append((sorted(round(rng.uniform(0, 2), 1) for _ in range(n)), [rng.randint(1, 4) for _ in range(n)],
                      rng.randint(0, 4), rng.randint(0, 12), rng.randint(1, 6), round(rng.uniform(0, 2), 1)))
    answers = []
    for args in cases:
        with forbidden_all([(scheduler, "admit")], "walk the queue yourself: the admission step is the exercise"):
            got = call(admit_fn, *[list(a) if isinstance(a, list) else a for a in args])
        answers.append(returned(got, "whole", "the number of requests that join"))
    right = [admit(*args) for args in cases]
    if answers == right:
        return "arrived, a free slot, room for the prompt, in order: the admission step of every continuous batcher."
    for mistake, message in _ADMISSION_MISTAKES:
        expect(answers != [_admit_with(*args, **mistake) for args in cases], message)
    args, got, want = next((a, g, w) for a, g, w in zip(cases, answers, right) if g != w)
    expect(False, f"admit{tuple(args)} should be {want}, you said {got}.")


def _no_library_keys() -> forbidden_all:
    return forbidden_all([(prefix_cache, "block_keys"), PrefixCache], "chain the hashes yourself: the keys are the "
                                                                      "exercise")


def _keys(keys_fn, tokens, block_size: int) -> list:
    with _no_library_keys():
        got = call(keys_fn, list(tokens), block_size)
    expect(got is not None, "your function returned None: end it with `return keys`.")
    expect(isinstance(got, list), f"return a list of keys, not {type(got).__name__}.")
    return got


@exercise
@hints("Two prompts should share a key exactly when they share everything up to the end of that block. What must a "
       "key depend on, then?",
       "Loop over the full blocks only (a partial block at the end gets no key). Each key must depend on everything "
       "before it: hash the previous key together with this block's tokens, written so that [1, 23] and [12, 3] "
       "differ.",
       "parent = ''; for start in range(0, len(tokens) - block_size + 1, block_size): parent = "
       "hashlib.sha256((parent + str(tokens[start:start + block_size])).encode()).hexdigest(); keys.append(parent)")
def check_block_keys(keys_fn) -> str:
    """keys_fn(tokens, block_size) -> one key per full block, chained to the key of the block before it."""
    expect(callable(keys_fn), "define block_keys(tokens, block_size) returning a list of keys.")
    rng = random.Random(4)
    for block_size in (2, 3, 4):
        a = [rng.randint(0, 99) for _ in range(5 * block_size + 1)]
        got = _keys(keys_fn, a, block_size)
        expect(len(got) == len(a) // block_size, f"{len(a)} tokens in blocks of {block_size} make "
                                                 f"{len(a) // block_size} full blocks: one key each, none for the "
                                                 f"partial block at the end; you gave {len(got)}.")
        same = _keys(keys_fn, a[:3 * block_size] + [7] * (2 * block_size), block_size)
        expect(got[:3] == same[:3] and got[3] != same[3],
               "two prompts that agree on their first 3 blocks must share those 3 keys, and differ from the 4th on.")
        moved = [rng.randint(100, 199) for _ in range(block_size)] + a[block_size:]  # only block 0 differs
        other = _keys(keys_fn, moved, block_size)
        expect(all(x != y for x, y in zip(got, other)),
               "these prompts differ only in their FIRST block, so every later key must differ too: the same "
               "tokens after a different start have different keys and values. Chain each key to the one before.")
        middle = a[:2 * block_size] + [rng.randint(100, 199) for _ in range(block_size)] + a[3 * block_size:]
        third = _keys(keys_fn, middle, block_size)  # only block 2 differs
        expect(got[:2] == third[:2] and all(x != y for x, y in zip(got[2:], third[2:])),
               "these prompts differ only in their THIRD block, so its key and every key after it must differ; yours "
               "agree after it. Chain each key to the key just before it (which names the whole prefix), not to the "
               "first key.")
        swapped = a[block_size:2 * block_size] + a[:block_size] + a[2 * block_size:]  # blocks 0 and 1 swapped
        turned = _keys(keys_fn, swapped, block_size)
        expect(all(x != y for x, y in zip(got[1:], turned[1:])),
               "two prompts whose first two blocks are swapped (the same blocks in another order) got the same key "
               "from block 1 on: your chaining forgets the order (xor or + of the blocks' hashes does). Hash the "
               "previous key together with this block's tokens: hash(parent + block).")
        inside = a[:block_size] + a[block_size:2 * block_size][::-1] + a[2 * block_size:]  # block 1's tokens reversed
        if inside != a:
            expect(all(x != y for x, y in zip(got[1:], _keys(keys_fn, inside, block_size)[1:])),
                   "two prompts whose second block holds the same tokens in another order got the same key: a key "
                   "must depend on the order of the tokens inside its block too (sorted, set or sum forget it), since "
                   "the same tokens in another order have other K and V. Hash the block's tokens as a list, in order.")
        if block_size >= 3:
            poked = a[:block_size + 1] + [a[block_size + 1] + 1000] + a[block_size + 2:]  # a middle token of block 1
            expect(all(x != y for x, y in zip(got[1:], _keys(keys_fn, poked, block_size)[1:])),
                   "two prompts that differ in one middle token of their second block got the same key: a key must "
                   "depend on every token of its block, not on a few of them (its first and last, say).")
        lib_a, lib_b = block_keys(a, block_size), block_keys(moved, block_size)
        expect([x == y for x, y in zip(got, other)] == [x == y for x, y in zip(lib_a, lib_b)],
               "your keys agree where the library's do not.")
        expect(_keys(keys_fn, a, block_size) == got, "the same tokens must give the same keys every time.")
    glued = _keys(keys_fn, [1, 23, 5, 6], 2), _keys(keys_fn, [12, 3, 5, 6], 2)
    expect(glued[0][0] != glued[1][0], "the blocks [1, 23] and [12, 3] got the same key: write the tokens so that the "
                                       "boundaries between them stay (str(list), ','.join(...) or their bytes), not "
                                       "glued together as '123'.")
    short = [k for k in got if len(k if isinstance(k, (str, bytes)) else str(k)) < 32]
    expect(not short, f"a key of {len(short[0]) if short else 0} characters is too short to trust: keep the whole "
                      "SHA-256 digest (hexdigest(): 64 characters; digest(): 32 bytes). A shorter key lets prefixes "
                      "collide once enough are cached, and on a shared server a collision hands one user another's K "
                      "and V.")
    many = _keys(keys_fn, [rng.randint(0, 49151) for _ in range(1200)], 2)  # 600 blocks, 600 different prefixes
    expect(len(set(many)) == len(many),
           f"600 different prefixes got only {len(set(many))} different keys: keys this short collide, and on a shared "
           "server a collision hands one user another's K and V (vLLM made SHA-256 its default for prefix keys after "
           "an advisory about predictable collisions). Keep the whole digest.")
    return "a key names the whole prefix up to its block, so a hit guarantees the same K and V."
