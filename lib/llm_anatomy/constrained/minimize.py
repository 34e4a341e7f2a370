"""The smallest DFA of a pattern: states with the same future merged (Moore's partition refinement).

Subset construction (automaton.py) makes one state per set of NFA states reached, and many different sets have the
same future: the same bytes lead to the same kinds of states, the same ones accept. Such states allow the same tokens,
so a mask per state computes the same mask again for each of them. Merging them first (the minimal DFA, unique for
its language) leaves fewer masks to make: notebook 12's schema 622 -> 279 states, the API's json_object 3,441 -> 304.

Moore's algorithm: start from two classes, accepting or not; split every class by the classes its successors fall
in; repeat until no class splits. Each state's class is then its state in the minimal DFA (the start's is 0). A round
is one numpy sort of the states' signatures, over the distinct columns of the table only (the bytes that move alike
from every state, such as all the letters inside a string, count once); a pattern needs about as many rounds as its
longest chain of states that differ only by how far they are from the end (a string of maxLength n: n rounds).
"""

from __future__ import annotations

import numpy as np

from .automaton import DEAD, DFA


def minimized(dfa: DFA) -> DFA:
    """The minimal DFA of the same language: every state a class of states with the same future."""
    table = np.asarray(dfa.table, dtype=np.int64)
    columns = np.unique(table, axis=1)  # [states, distinct byte behaviours]
    dead = columns == DEAD
    classes = np.asarray(dfa.accepting, dtype=np.int64)
    count = len(np.unique(classes))
    while True:
        successors = np.where(dead, -1, classes[np.where(dead, 0, columns)])
        _, refined = np.unique(np.concatenate([classes[:, None], successors], axis=1), axis=0, return_inverse=True)
        classes = refined.reshape(-1)
        if classes.max() + 1 == count:  # no class split: the partition is stable
            break
        count = int(classes.max()) + 1
    start = int(classes[dfa.start])
    order = [start] + [c for c in range(count) if c != start]  # the start's class first: state 0
    number = np.empty(count, dtype=np.int64)
    number[order] = np.arange(count)
    _, first = np.unique(classes, return_index=True)  # one state of each class speaks for it: they all move alike
    rows = table[first[order]]
    rows = np.where(rows == DEAD, DEAD, number[classes[np.where(rows == DEAD, 0, rows)]])
    return DFA(rows.tolist(), [bool(dfa.accepting[first[c]]) for c in order], dfa.pattern)
