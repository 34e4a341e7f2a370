r"""A regular pattern compiled to a DFA over bytes: parse -> Thompson NFA -> subset construction.

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

DEAD = -1
_ALL = frozenset(range(256))
_DIGITS = frozenset(b"0123456789")
_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_SPACE = frozenset(b" \t\n\r\f\v")
_CONT = frozenset(range(0x80, 0xC0))
# every well-formed UTF-8 sequence of 2 to 4 bytes (RFC 3629, section 4), as sequences of byte sets
_UTF8_MULTI = [
    [frozenset(range(0xC2, 0xE0)), _CONT],
    [frozenset([0xE0]), frozenset(range(0xA0, 0xC0)), _CONT],
    [frozenset(range(0xE1, 0xED)), _CONT, _CONT],
    [frozenset([0xED]), frozenset(range(0x80, 0xA0)), _CONT],
    [frozenset(range(0xEE, 0xF0)), _CONT, _CONT],
    [frozenset([0xF0]), frozenset(range(0x90, 0xC0)), _CONT, _CONT],
    [frozenset(range(0xF1, 0xF4)), _CONT, _CONT, _CONT],
    [frozenset([0xF4]), frozenset(range(0x80, 0x90)), _CONT, _CONT],
]
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
_SPECIAL = set("\\.[](){}|*+?^$")


def escape(text: str) -> str:
    """`text` as a pattern that matches exactly it (its metacharacters escaped)."""
    return "".join("\\" + c if c in _SPECIAL else c for c in text)


# --------------------------------------------------------------------------- parsing, to a tree of tuples
# ("set", frozenset of bytes) | ("seq", [nodes]) | ("alt", [nodes]) | ("rep", node, min, max or None)


def _literal(char: str):
    data = char.encode("utf-8")
    return ("set", frozenset(data)) if len(data) == 1 else ("seq", [("set", frozenset([b])) for b in data])


def _any_char_but(ascii_excluded: frozenset):
    """Any character (a UTF-8 sequence) except the ASCII bytes in ascii_excluded."""
    branches = [("set", frozenset(range(0x80)) - ascii_excluded)]
    branches += [("seq", [("set", s) for s in seq]) for seq in _UTF8_MULTI]
    return ("alt", branches)


class _Parser:
    def __init__(self, pattern: str):
        self.text, self.pos = pattern, 0

    def error(self, why: str):
        raise CourseError(f"Pattern {self.text!r}, at position {self.pos}: {why}.")

    def peek(self):
        return self.text[self.pos] if self.pos < len(self.text) else None

    def take(self):
        char = self.peek()
        if char is None:
            self.error("it ends too early")
        self.pos += 1
        return char

    def parse(self):
        node = self.alternation()
        if self.peek() is not None:
            self.error(f"unexpected {self.peek()!r}")
        return node

    def alternation(self):
        branches = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def sequence(self):
        items = []
        while self.peek() not in (None, "|", ")"):
            items.append(self.repeat(self.atom()))
        return ("seq", items)

    def number(self):
        start = self.pos
        while self.peek() is not None and self.peek().isdigit():
            self.pos += 1
        return int(self.text[start:self.pos]) if self.pos > start else None

    def repeat(self, node):
        while self.peek() in ("*", "+", "?", "{"):
            op = self.take()
            if op == "{":
                low = self.number()
                high = low
                if low is None:
                    self.error("a repeat {n,m} needs a number")
                if self.peek() == ",":
                    self.pos += 1
                    high = self.number()
                if self.take() != "}" or (high is not None and high < low):
                    self.error("a repeat reads {n}, {n,} or {n,m} with n <= m")
                node = ("rep", node, low, high)
            else:
                node = ("rep", node, {"*": 0, "+": 1, "?": 0}[op], 1 if op == "?" else None)
        return node

    def escaped(self):
        """After a backslash: a byte set (\\d \\w \\s) or one character."""
        char = self.take()
        if char in "dws":
            return {"d": _DIGITS, "w": _WORD, "s": _SPACE}[char]
        if char == "x":
            digits = self.take() + self.take()
            try:
                return chr(int(digits, 16))
            except ValueError:
                self.error(f"\\x needs two hex digits, not {digits!r}")
        if char.isalnum() and char not in _ESCAPES:
            self.error(f"unknown escape \\{char}")
        return _ESCAPES.get(char, char)

    def atom(self):
        char = self.take()
        if char == "(":
            node = self.alternation()
            if self.take() != ")":
                self.error("a group is not closed")
            return node
        if char == "[":
            return self.char_class()
        if char == ".":
            return _any_char_but(frozenset(b"\n"))
        if char == "\\":
            got = self.escaped()
            return ("set", got) if isinstance(got, frozenset) else _literal(got)
        if char in "*+?{})]|":
            self.error(f"{char!r} has nothing before it to apply to; escape it as \\{char}")
        return _literal(char)

    def char_class(self):
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ascii_bytes, others, first = set(), [], True
        while first or self.peek() != "]":
            first = False
            char = self.take()
            if char == "\\":
                char = self.escaped()
                if isinstance(char, frozenset):
                    ascii_bytes |= char
                    continue
            if self.peek() == "-" and self.pos + 1 < len(self.text) and self.text[self.pos + 1] != "]":
                self.pos += 1
                high = self.take()
                if high == "\\":
                    high = self.escaped()
                if isinstance(high, frozenset) or ord(high) < ord(char):
                    self.error(f"bad range {char}-{high}")
                if ord(high) >= 0x80:
                    self.error("ranges of non-ASCII characters are not supported; list the characters")
                ascii_bytes |= set(range(ord(char), ord(high) + 1))
            elif ord(char) < 0x80:
                ascii_bytes.add(ord(char))
            else:
                others.append(char)
        self.pos += 1
        if negated:
            if others:
                self.error("a negated class of non-ASCII characters is not supported")
            return _any_char_but(frozenset(ascii_bytes))
        branches = [("set", frozenset(ascii_bytes))] if ascii_bytes else []
        return ("alt", branches + [_literal(c) for c in others])


def parse(pattern: str):
    """The pattern's tree (see the comment above _Parser); a CourseError names what it cannot read."""
    return _Parser(pattern).parse()


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
