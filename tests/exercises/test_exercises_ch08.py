"""Notebook 08's exercise checks: the solutions pass, typical wrong answers fail with a helpful hint."""

from __future__ import annotations

import hashlib

from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.exercises import ch08

solutions = load_solutions("ch08")


def test_solutions_pass():
    for verdict in (ch08.check_allocator(solutions.MyAllocator), ch08.check_admission(solutions.admit),
                    ch08.check_block_keys(solutions.block_keys), ch08.check_slot_mapping(solutions.slot_mapping),
                    ch08.check_plan_iteration(solutions.plan_iteration)):
        assert verdict.passed, verdict


# --------------------------------------------------------------------------- 8.1 the allocator


class _FreesAtOnce(solutions.MyAllocator):
    def release(self, block):  # the typical mistake: ignores the other holders
        self.refs[block] = max(0, self.refs[block] - 1)
        if block not in self.free:
            self.free.append(block)


class _NeverRefuses(solutions.MyAllocator):
    def allocate(self):
        if not self.free:
            return 0
        return super().allocate()


class _KeepsFreeList(solutions.MyAllocator):
    def allocate(self):
        block = self.free[-1]  # forgets to take it off the free list
        self.refs[block] = 1
        return block


class _NoDoubleFreeCheck(solutions.MyAllocator):
    def release(self, block):
        self.refs[block] = max(0, self.refs[block] - 1)
        if self.refs[block] == 0:
            self.free.append(block)


def test_allocator_mistakes_get_specific_hints():
    not_yet(ch08.check_allocator(_FreesAtOnce), "still in use", "refs reaches 0")
    not_yet(ch08.check_allocator(_NeverRefuses), "must refuse")
    not_yet(ch08.check_allocator(_KeepsFreeList), "still in use")
    not_yet(ch08.check_allocator(_NoDoubleFreeCheck), "double free")
    not_yet(ch08.check_allocator(solutions.MyAllocator(3)), "class itself")

    class Unattempted(solutions.MyAllocator):
        allocate = unattempted

    not_yet(ch08.check_allocator(Unattempted), "not attempted")


# --------------------------------------------------------------------------- 8.2 admission


def test_admission_mistakes_get_specific_hints():
    def ignores_arrival(arrivals, needed, running, free, max_batch, now):
        return solutions.admit([0.0] * len(arrivals), needed, running, free, max_batch, now)

    def overtakes(arrivals, needed, running, free, max_batch, now):
        joined = 0
        for arrival, need in zip(arrivals, needed):
            if arrival <= now and running + joined < max_batch and need <= free:
                free -= need
                joined += 1
        return joined

    def never_subtracts(arrivals, needed, running, free, max_batch, now):
        joined = 0
        for arrival, need in zip(arrivals, needed):
            if arrival > now or running + joined >= max_batch or need > free:
                break
            joined += 1
        return joined

    def ignores_batch(arrivals, needed, running, free, max_batch, now):
        return solutions.admit(arrivals, needed, 0, free, 10**6, now)

    not_yet(ch08.check_admission(ignores_arrival), "arrival <= now")
    not_yet(ch08.check_admission(overtakes), "no overtaking")
    not_yet(ch08.check_admission(never_subtracts), "subtract")
    not_yet(ch08.check_admission(ignores_batch), "one slot is free")
    not_yet(ch08.check_admission(lambda *a: None), "number of requests")
    not_yet(ch08.check_admission(unattempted), "not attempted")


# --------------------------------------------------------------------------- 8.3 chained keys


def test_block_key_mistakes_get_specific_hints():
    def unchained(tokens, block_size):  # each block hashed alone: the typical mistake
        return [hashlib.sha256(str(tokens[i:i + block_size]).encode()).hexdigest()
                for i in range(0, len(tokens) - block_size + 1, block_size)]

    def with_partial(tokens, block_size):
        return solutions.block_keys(tokens + [0] * (-len(tokens) % block_size), block_size)

    def whole_prompt(tokens, block_size):
        key = hashlib.sha256(str(tokens).encode()).hexdigest()
        return [key] * (len(tokens) // block_size)

    not_yet(ch08.check_block_keys(unchained), "Chain each key")
    not_yet(ch08.check_block_keys(with_partial), "partial block")
    not_yet(ch08.check_block_keys(whole_prompt), "share those 3 keys")
    not_yet(ch08.check_block_keys(lambda t, b: "abc"), "list")
    not_yet(ch08.check_block_keys(unattempted), "not attempted")


# --------------------------------------------------------------------------- 8.4 the slot mapping


def _slots(slot):
    """A slot mapping that computes each slot with `slot(table, p, size)`, request by request."""
    return lambda tables, positions, size: [slot(t, p, size) for t, ps in zip(tables, positions) for p in ps]


def test_slot_mapping_mistakes_are_named():
    not_yet(ch08.check_slot_mapping(_slots(lambda t, p, b: (p // b) * b + p % b)), "logical block", "block table")
    not_yet(ch08.check_slot_mapping(_slots(lambda t, p, b: t[p % b] * b + p // b)), "swapped")
    not_yet(ch08.check_slot_mapping(_slots(lambda t, p, b: t[p // b] * b + p % b + 1)), "off by one on the block offset")
    not_yet(ch08.check_slot_mapping(_slots(lambda t, p, b: t[(p - 1) // b] * b + (p - 1) % b)), "positions count "
                                                                                                 "from 0")
    not_yet(ch08.check_slot_mapping(_slots(lambda t, p, b: t[p // b] + p % b)), "multiply the physical block")

    def list_index(tables, positions, size):
        return [t[i // size] * size + i % size for t, ps in zip(tables, positions) for i in range(len(ps))]

    def first_table(tables, positions, size):
        return [tables[0][p // size] * size + p % size for ps in positions for p in ps]

    not_yet(ch08.check_slot_mapping(list_index), "own value, not its index")
    not_yet(ch08.check_slot_mapping(first_table), "its own block table")
    not_yet(ch08.check_slot_mapping(lambda tables, positions, size: [0]), "one each")
    not_yet(ch08.check_slot_mapping(lambda tables, positions, size: None), "None")
    not_yet(ch08.check_slot_mapping(unattempted), "not attempted")


def test_the_engines_slots_are_where_the_view_writes_and_the_solution_agrees():
    from llm_anatomy.exercises.ch08_slots import _iterations, engine_slots

    cases = list(_iterations(seed=84))
    assert {size for _, _, size, *_ in cases} == {2, 3, 4, 16} and any(max(n) > 1 for *_, n, _ in cases)
    for tables, positions, size, lengths, news, blocks in cases:
        assert engine_slots(tables, lengths, news, size, blocks) == solutions.slot_mapping(tables, positions, size)


# --------------------------------------------------------------------------- 8.5 one scheduler iteration


def _planner(*, prompts_first=False, decodes_free=False, oldest=False, keep_blocks=False, floor=False,
             no_replan=False, whole_prompt=False, library=False):
    """A learner's plan_iteration with one typical mistake (all off: right, written apart from the solution)."""
    import math

    def plan_iteration(rows, budget, free_blocks, block_size):
        if library:
            from llm_anatomy.serve.iteration import RowState, plan_iteration as theirs

            return theirs([RowState(*r) for r in rows], budget, free_blocks, block_size)
        live, preempted, first = list(range(len(rows))), [], None
        while True:
            ready = [i for i in live if rows[i][1] == 1 and rows[i][0] > 0]
            left = math.inf if budget is None else budget
            decoders, chunks = ([] if prompts_first else ready), []
            left -= 0 if (prompts_first or decodes_free) else len(ready)
            for i in (i for i in live if i not in ready):
                if left > 0:
                    chunks.append((i, rows[i][1] if whole_prompt else min(rows[i][1], left)))
                    left -= chunks[-1][1]
            if prompts_first:
                decoders = ready[:max(0, min(len(ready), left))] if left != math.inf else ready
            if no_replan and first is not None:
                decoders, chunks = [i for i in first[0] if i in live], [(i, n) for i, n in first[1] if i in live]
            first = first or (decoders, chunks)
            blocks = (lambda p: p // block_size) if floor else (lambda p: math.ceil(p / block_size))
            need = sum(max(0, blocks(rows[i][0] + n) - rows[i][2]) for i, n in [(i, 1) for i in decoders] + chunks)
            if need <= free_blocks or len(live) <= 1:
                return decoders, chunks, preempted
            victim = live.pop(0 if oldest else -1)
            preempted.append(victim)
            free_blocks += 0 if keep_blocks else rows[victim][2]
    return plan_iteration


def test_a_plan_written_apart_from_the_solution_passes():
    assert ch08.check_plan_iteration(_planner()).passed


def test_plan_mistakes_are_named():
    not_yet(ch08.check_plan_iteration(_planner(prompts_first=True)), "decodes come first")
    not_yet(ch08.check_plan_iteration(_planner(decodes_free=True)), "each decode takes one token of the budget")
    not_yet(ch08.check_plan_iteration(_planner(whole_prompt=True)), "cut to what is left of the budget")
    not_yet(ch08.check_plan_iteration(_planner(oldest=True)), "youngest")
    not_yet(ch08.check_plan_iteration(_planner(keep_blocks=True)), "blocks are free again")
    not_yet(ch08.check_plan_iteration(_planner(floor=True)), "ceil(p / block_size)")
    not_yet(ch08.check_plan_iteration(_planner(no_replan=True)), "plan the rows again")
    not_yet(ch08.check_plan_iteration(_planner(library=True)), "don't call", "plan_iteration")
    not_yet(ch08.check_plan_iteration(lambda rows, budget, free, size: ([], [])), "three things")
    not_yet(ch08.check_plan_iteration(unattempted), "not attempted")
