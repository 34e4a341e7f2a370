"""Exercise 8.5 of notebook 08: one scheduler iteration, decided from numbers alone (serve/iteration.plan_iteration).

The learner writes plan_iteration(rows, budget, free_blocks, block_size): the running requests, oldest first, each as
(positions cached, tokens not yet cached, blocks held); the token budget of the iteration (None: no limit); the free
blocks of the pool. It returns (decoders, chunks, preempted): the rows that decode one token, the (row, tokens) prompt
chunks, and the rows preempted, youngest first. The check compares it with the library's plan_iteration (refused
while the learner's code runs) on queues the notebook never showed, and names each typical mistake.
"""

from __future__ import annotations

import math
import random

from ..serve import iteration, scheduler
from ..serve.iteration import RowState, plan_iteration
from . import call, exercise, expect, forbidden_all, hints


def _variant(rows, budget, free, size, *, prompts_first=False, decodes_free=False, oldest=False, keep_blocks=False,
             floor=False, no_replan=False, whole_prompt=False):
    """plan_iteration with one typical mistake switched on (all off: the right one)."""
    live, preempted = list(range(len(rows))), []
    first = None
    while True:
        if first is not None and no_replan:  # the first plan kept, the preempted rows only struck out
            decoders = [i for i in first[0] if i in live]
            chunks = [(i, n) for i, n in first[1] if i in live]
        else:
            decoders, chunks = _rows(rows, live, budget, prompts_first, decodes_free, whole_prompt)
            first = first or (decoders, chunks)
        blocks = (lambda p: p // size) if floor else (lambda p: math.ceil(p / size))
        need = sum(max(0, blocks(rows[i][0] + n) - rows[i][2]) for i, n in [(i, 1) for i in decoders] + chunks)
        if need <= free or len(live) <= 1:
            return decoders, chunks, preempted
        victim = live.pop(0 if oldest else -1)
        preempted.append(victim)
        free += 0 if keep_blocks else rows[victim][2]


def _rows(rows, live, budget, prompts_first, decodes_free, whole_prompt):
    """Decoders and chunks of the live rows under the budget, with the mistakes of _variant."""
    ready = [i for i in live if rows[i][1] == 1 and rows[i][0] > 0]
    prompts = [i for i in live if i not in ready]
    left = math.inf if budget is None else budget
    decoders, chunks = [], []
    if not prompts_first:
        decoders = ready
        left -= 0 if decodes_free else len(ready)
    for i in prompts:
        if left > 0:
            n = rows[i][1] if whole_prompt else int(min(rows[i][1], left))
            chunks.append((i, n))
            left -= n
    if prompts_first:
        decoders = ready if left == math.inf else ready[:max(0, int(left))]  # what the prompts left
    return decoders, chunks


_MISTAKES = [
    (dict(prompts_first=True), "decodes come first: a request that is decoding gets its one token before any prompt "
                               "chunk takes the budget (a long prompt must not stall everyone's next token)."),
    (dict(decodes_free=True), "each decode takes one token of the budget too: the chunks get budget - decoders."),
    (dict(whole_prompt=True), "a prompt chunk is cut to what is left of the budget: min(pending, budget left)."),
    (dict(oldest=True), "preempt the youngest request (the last admitted, at the end of rows), not the oldest: it has "
                        "done the least work, so recomputing it later costs the least."),
    (dict(keep_blocks=True), "a preempted request's blocks are free again: add them to free_blocks before you check "
                             "whether the others now fit."),
    (dict(floor=True), "a row that grows to p positions needs ceil(p / block_size) blocks, not p // block_size: a "
                       "partly filled block is a block."),
    (dict(no_replan=True), "after a preemption, plan the rows again without the preempted request: the budget it "
                           "would have used goes to the others' prompt chunks."),
]


def _cases() -> list[tuple]:
    fixed = [([(8, 1, 2), (0, 6, 0), (3, 1, 1)], 4, 9, 4),  # budget: two decodes, then a chunk of 2
             ([(8, 1, 2), (4, 1, 1), (4, 1, 1)], None, 0, 4),  # every decode crosses a block: preempt
             ([(0, 12, 0), (7, 1, 2)], 5, 9, 4),  # prompt before a decoder in the queue: the decoder still goes first
             ([(15, 1, 4), (2, 9, 1), (0, 5, 0)], 8, 1, 4)]
    rng = random.Random(85)
    for _ in range(300):
        size = rng.choice([2, 4, 8])
        rows = []
        for _ in range(rng.randint(1, 6)):
            if rng.random() < 0.5:  # decoding: all cached but its newest token
                computed = rng.randint(1, 30)
                rows.append((computed, 1, math.ceil(computed / size)))
            else:  # prefilling: part of its prompt cached, or none
                computed, pending = rng.choice([0, 0, size, 2 * size]), rng.randint(2, 20)
                rows.append((computed, pending, math.ceil(computed / size)))
        fixed.append((rows, rng.choice([None, 3, 6, 12, 24]), rng.randint(0, 8), size))
    return fixed


def _answer(fn, rows, budget, free, size):
    with forbidden_all([(iteration, "plan_iteration"), (scheduler, "plan")],
                       "decide the iteration yourself: the scheduler's step is the exercise"):
        got = call(fn, [tuple(r) for r in rows], budget, free, size)
    expect(isinstance(got, tuple) and len(got) == 3,
           "return three things: (decoders, chunks, preempted), e.g. `return decoders, chunks, preempted`.")
    decoders, chunks, preempted = got
    try:
        return [int(i) for i in decoders], [(int(i), int(n)) for i, n in chunks], [int(i) for i in preempted]
    except (TypeError, ValueError):  # not lists of whole numbers
        expect(False, "decoders and preempted are lists of row indices, chunks a list of (row index, tokens) pairs.")


@exercise
@hints("Two passes: first decide the rows as if every block were free (decodes, then chunks under the budget), then "
       "check the blocks they need against the free ones.",
       "A decoding row has pending == 1 and computed > 0; every other row is prefilling. The budget pays one token per "
       "decode first, then each prompt in order gets min(pending, what is left). A row that grows to computed + n "
       "positions needs ceil((computed + n) / block_size) - blocks more blocks.",
       "live = list(range(len(rows))); loop: plan the live rows; need = sum of the new blocks; if need <= free or only "
       "one row is left: return; else victim = live.pop() (the youngest), preempted.append(victim), free += its blocks")
def check_plan_iteration(fn) -> str:
    """fn(rows, budget, free_blocks, block_size) -> (decoders, chunks, preempted), as scheduler.plan_iteration."""
    expect(callable(fn), "define plan_iteration(rows, budget, free_blocks, block_size).")
    cases = _cases()
    answers = [_answer(fn, *case) for case in cases]
    right = [_as_tuple(plan_iteration([RowState(*r) for r in rows], budget, free, size))
             for rows, budget, free, size in cases]
    if answers == right:
        return ("decodes first, prompt chunks under the budget, the youngest preempted while the blocks run out: "
                "one iteration of vLLM's scheduler, decided from numbers alone.")
    for mistake, message in _MISTAKES:
        expect(answers != [_as_tuple(_variant(*case, **mistake)) for case in cases], message)
    (rows, budget, free, size), got, want = next((c, a, w) for c, a, w in zip(cases, answers, right) if a != w)
    expect(False, f"rows {rows}, budget {budget}, {free} free blocks of {size}: expected (decoders, chunks, preempted) "
                  f"= {want}, you gave {got}.")


def _as_tuple(result) -> tuple:
    decoders, chunks, preempted = result
    return list(decoders), [tuple(c) for c in chunks], list(preempted)
