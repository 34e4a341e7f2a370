r"""A regular pattern read into a tree of byte sets (automaton.py builds the tree into a DFA).

Bytes, not characters: a character class is a set of bytes for its ASCII part; a class that admits every non-ASCII
character ([^"\\], .) admits the well-formed UTF-8 sequences (RFC 3629's table), so the automaton never accepts bytes
that do not decode; a non-ASCII literal is its UTF-8 bytes. Syntax: see automaton.py.
"""

from __future__ import annotations

from ..errors import CourseError

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
