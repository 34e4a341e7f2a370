"""The token mask: which of the vocabulary's tokens a DFA state allows, walking each token's bytes.

A token is allowed from `state` when walking ALL its bytes stays alive (one token can cross several states: `": "`
is three bytes); the end-of-sequence token only where the state accepts; other special tokens never.
`naive_mask` walks every token from the state (the whole vocabulary, each step); `TokenMasker` walks a byte trie of
the vocabulary once per state and caches the result, so a state reached again costs a dictionary look-up, as
outlines-core's index and xgrammar's per-state cache do.

`mode` plants the classic bugs, for the counterfactual tests of C26: "skip_last" walks all but a token's last
byte, "first_byte" only its first, "eos_anywhere" allows the end-of-sequence token in every live state (an answer may
stop half-written).
"""

from __future__ import annotations

import torch

from ..errors import CourseError
from .automaton import DEAD, DFA

MODES = ("full", "skip_last", "first_byte", "eos_anywhere")


def gpt2_byte_table() -> dict[str, int]:
    """Byte-level BPE's printable stand-ins: the character a token string uses for each byte (GPT-2's table)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) \
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes(tokenizer) -> list[bytes | None]:
    """Each token id's bytes (None for the special tokens, which a grammar never allows except EOS)."""
    table = gpt2_byte_table()
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    out = []
    for tid, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if tid in special or piece is None:
            out.append(None)
        else:
            try:
                out.append(bytes(table[c] for c in piece))
            except KeyError as missing:
                raise CourseError(f"Token {tid} ({piece!r}) has a character {missing} outside the byte table: "
                                  "is this a byte-level BPE tokenizer?") from None
    return out


def _walk(dfa: DFA, state: int, data: bytes, mode: str) -> int:
    if mode == "skip_last":
        data = data[:-1]
    elif mode == "first_byte":
        data = data[:1]
    return dfa.walk(state, data)


def naive_mask(dfa: DFA, tokens: list[bytes | None], state: int, eos_id: int, mode: str = "full") -> torch.Tensor:
    """The allowed tokens from `state`, a bool [vocab]: every token walked through the DFA, no trie, no cache."""
    allowed = torch.zeros(len(tokens), dtype=torch.bool)
    if state == DEAD:
        return allowed
    ok = [data is not None and len(data) > 0 and _walk(dfa, state, data, mode) != DEAD for data in tokens]
    allowed = torch.tensor(ok, dtype=torch.bool)
    allowed[eos_id] = dfa.accepting[state] or mode == "eos_anywhere"
    return allowed


class _Trie:
    """The vocabulary's bytes as a trie: children[node] maps a byte to a node, ends[node] the ids spelled there."""

    def __init__(self, tokens: list[bytes | None]):
        self.children: list[dict[int, int]] = [{}]
        self.ends: list[list[int]] = [[]]
        for tid, data in enumerate(tokens):
            if not data:
                continue
            node = 0
            for byte in data:
                nxt = self.children[node].get(byte)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[node][byte] = nxt
                    self.children.append({})
                    self.ends.append([])
                node = nxt
            self.ends[node].append(tid)


class TokenMasker:
    """Masks for a DFA over a tokenizer's vocabulary, computed once per reached state (lazily) and cached.

    masker.allowed(state): bool [vocab]; masker.advance(state, token_id): the state after the token's bytes (DEAD if
    they leave the pattern; the EOS token keeps the state). `mode`: see the module docstring.
    """

    def __init__(self, dfa: DFA, tokens: list[bytes | None], eos_id: int, mode: str = "full"):
        if mode not in MODES:
            raise CourseError(f"mode must be one of {MODES}, not {mode!r}.")
        self.dfa, self.tokens, self.eos_id, self.mode = dfa, tokens, eos_id, mode
        self.trie = _Trie(tokens)
        self.cache: dict[int, torch.Tensor] = {}

    @classmethod
    def for_tokenizer(cls, dfa: DFA, tokenizer, mode: str = "full", tokens=None) -> "TokenMasker":
        return cls(dfa, tokens if tokens is not None else token_bytes(tokenizer), tokenizer.eos_token_id, mode)

    def for_dfa(self, dfa: DFA) -> "TokenMasker":
        """A masker for another DFA over the same vocabulary: the trie shared (not built again), nothing cached."""
        other = TokenMasker.__new__(type(self))
        other.__dict__.update(self.__dict__, dfa=dfa, cache={})
        return other

    def precompute(self) -> None:
        """Every state's mask, before decoding starts (as outlines-core's index): then every step is a look-up."""
        for state in range(self.dfa.num_states):
            self.allowed(state)

    def allowed(self, state: int) -> torch.Tensor:
        if state not in self.cache:
            self.cache[state] = self._compute(state)
        return self.cache[state]

    def _compute(self, state: int) -> torch.Tensor:
        ids: list[int] = []
        if state != DEAD:
            table, children, ends, mode = self.dfa.table, self.trie.children, self.trie.ends, self.mode
            # depth-first over (trie node, the DFA state before its last byte, that byte): a branch stops where the
            # DFA dies. The bugs: "skip_last" admits a token once the state before its last byte is alive,
            # "first_byte" admits a whole subtree once its first byte is alive.
            stack = [(child, state, byte) for byte, child in children[0].items()]
            while stack:
                node, before, byte = stack.pop()
                after = table[before][byte]
                if mode == "skip_last":
                    ids.extend(ends[node])
                if after == DEAD:
                    continue
                if mode in ("full", "eos_anywhere"):
                    ids.extend(ends[node])
                if mode == "first_byte":
                    subtree = [node]
                    while subtree:
                        n = subtree.pop()
                        ids.extend(ends[n])
                        subtree.extend(children[n].values())
                    continue
                stack.extend((child, after, b) for b, child in children[node].items())
        allowed = torch.zeros(len(self.tokens), dtype=torch.bool)
        if ids:
            allowed[torch.tensor(ids)] = True
        allowed[self.eos_id] = state != DEAD and (self.dfa.accepting[state] or self.mode == "eos_anywhere")
        return allowed

    def advance(self, state: int, token_id: int) -> int:
        """The state after the token's bytes (the real walk, whatever the mode: the bug is in the mask only)."""
        if token_id == self.eos_id:
            return state
        data = self.tokens[token_id]
        return DEAD if data is None else self.dfa.walk(state, data)
