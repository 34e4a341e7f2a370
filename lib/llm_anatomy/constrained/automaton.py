r"""A regular pattern compiled to a DFA over bytes: parse (pattern.py) -> Thompson NFA -> subset construction.

    dfa = compile_pattern(r'\{"age": (0|[1-9][0-9]*)\}')
    dfa.matches('{"age": 42}'.encode())        # True
    state = dfa.walk(dfa.start, b'{"x')       # -1 (DEAD) once a byte leaves the pattern

Bytes, not characters, because a byte-level BPE token can end in the middle of a UTF-8 character: the mask walks
each token's bytes (mask.py). A character class is a set of bytes for its ASCII part; a class that admits every
non-ASCII character ([^"\\], .) admits the well-formed UTF-8 sequences (RFC 3629's table), so the automaton never
accepts bytes that do not decode; a non-ASCII literal is its UTF-8 bytes.

Syntax: literals, escapes (\. \d \w \s \xHH \n \t), classes [a-z] and [^...], (groups), |, * + ? and
{n}, {n,}, {n,m}. The pattern always matches whole (fullmatch).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CourseError
from .pattern import escape, parse

__all__ = ["DEAD", "DFA", "compile_pattern", "escape", "parse"]

DEAD = -1


# --------------------------------------------------------------------------- Thompson's NFA


class _NFA:
    """States 0..n-1: each has epsilon moves and (byte set, target) moves. Built fragment by fragment."""

    def __init__(self):
        self.eps: list[list[int]] = []
        self.moves: list[list[tuple[frozenset, int]]] = []

    def state(self) -> int:
        self.eps.append([])
        self.moves.append([])
        return len(self.eps) - 1

    def build(self, node) -> tuple[int, int]:
        """A fragment for `node`: its (start, end) states, end with no moves out yet."""
        kind = node[0]
        start = self.state()
        if kind == "set":
            end = self.state()
            if node[1]:
                self.moves[start].append((node[1], end))
            return start, end
        if kind == "seq":
            end = start
            for item in node[1]:
                s, e = self.build(item)
                self.eps[end].append(s)
                end = e
            return start, end
        if kind == "alt":
            end = self.state()
            for item in node[1]:
                s, e = self.build(item)
                self.eps[start].append(s)
                self.eps[e].append(end)
            return start, end
        _, inner, low, high = node  # rep: `low` copies, then (high - low) optional ones or a loop
        end = start
        for _ in range(low):
            s, e = self.build(inner)
            self.eps[end].append(s)
            end = e
        if high is None:
            s, e = self.build(inner)
            self.eps[end].append(s)
            self.eps[e].append(s)
            tail = self.state()
            self.eps[end].append(tail)
            self.eps[e].append(tail)
            return start, tail
        tail = self.state()
        for _ in range(high - low):
            s, e = self.build(inner)
            self.eps[end].append(s)
            self.eps[end].append(tail)
            end = e
        self.eps[end].append(tail)
        return start, tail

    def closure(self, states) -> frozenset:
        seen, stack = set(states), list(states)
        while stack:
            for nxt in self.eps[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return frozenset(seen)


# --------------------------------------------------------------------------- the DFA


@dataclass
class DFA:
    """A deterministic automaton over bytes: `table[state][byte]` is the next state or DEAD; `accepting` the states
    where the input so far is a whole match. State 0 is the start. Every state can still reach an accepting one
    (states that cannot are made DEAD), so a live state always has a way to finish."""

    table: list[list[int]]
    accepting: list[bool]
    pattern: str = ""
    start: int = 0

    @property
    def num_states(self) -> int:
        return len(self.table)

    def step(self, state: int, byte: int) -> int:
        return DEAD if state == DEAD else self.table[state][byte]

    def walk(self, state: int, data: bytes) -> int:
        """The state after `data` from `state`; DEAD once a byte leaves the pattern."""
        table = self.table
        for byte in data:
            if state == DEAD:
                return DEAD
            state = table[state][byte]
        return state

    def matches(self, data: bytes | str) -> bool:
        """Does the whole of `data` (a str is UTF-8 encoded) match the pattern?"""
        if isinstance(data, str):
            data = data.encode("utf-8")
        state = self.walk(self.start, data)
        return state != DEAD and self.accepting[state]


def compile_pattern(pattern: str) -> DFA:
    """The pattern's DFA over bytes: Thompson NFA, subset construction, dead states pruned."""
    nfa = _NFA()
    start, end = nfa.build(parse(pattern))
    first = nfa.closure([start])
    index, sets, table = {first: 0}, [first], []
    while len(table) < len(sets):
        current = sets[len(table)]
        row = [DEAD] * 256
        targets: dict[int, set] = {}
        for s in current:
            for byteset, target in nfa.moves[s]:
                for byte in byteset:
                    targets.setdefault(byte, set()).add(target)
        closed: dict[frozenset, frozenset] = {}
        for byte, tset in targets.items():
            key = frozenset(tset)
            if key not in closed:
                closed[key] = nfa.closure(key)
            nxt = closed[key]
            if nxt not in index:
                index[nxt] = len(sets)
                sets.append(nxt)
            row[byte] = index[nxt]
        table.append(row)
    accepting = [end in s for s in sets]
    return _pruned(table, accepting, pattern)


def _pruned(table, accepting, pattern) -> DFA:
    """States from which no accepting state is reachable become DEAD (so a live state can always finish)."""
    alive = {s for s, ok in enumerate(accepting) if ok}
    changed = True
    while changed:
        changed = False
        for s, row in enumerate(table):
            if s not in alive and any(t in alive for t in row if t != DEAD):
                alive.add(s)
                changed = True
    if 0 not in alive:
        raise CourseError(f"The pattern {pattern!r} matches nothing.")
    order = sorted(alive)
    new = {old: i for i, old in enumerate(order)}
    rows = [[new.get(t, DEAD) if t != DEAD else DEAD for t in table[s]] for s in order]
    return DFA(rows, [accepting[s] for s in order], pattern)
