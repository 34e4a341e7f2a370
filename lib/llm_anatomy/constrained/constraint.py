"""A grammar as a constraint on the course's decoding loop: the tokens allowed after the tokens generated so far.

    constraint = GrammarConstraint.for_schema(SCHEMA, tokenizer)
    session = GenerationSession(model, tokenizer, params, constraint=constraint)   # generate/session.py

The state is worked out from the generated ids at every call (their bytes walked from the start: a few dozen
tokens), so a reset, a resample or a new prefill needs nothing from the constraint: the automaton restarts with the
text. The masks are the TokenMasker's, cached per state; the end-of-sequence token keeps the state. One masker
serves every constraint of the same schema and tokenizer (its trie takes about a second to build on 2 cores, and
its masks stay cached across prefills, resets and widgets). `last` says what the latest mask cost: a state's first visit walks the vocabulary's trie (milliseconds to a few hundred on 2
cores), a state seen before is a dictionary look-up (C26's "precomputing makes the mask cheap", seen step by step).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..device import timed
from .automaton import compile_pattern
from .mask import TokenMasker, token_bytes
from .schema import schema_pattern


@dataclass(frozen=True)
class MaskLookup:
    """One mask asked for: the automaton's state, whether its mask was cached already, and the seconds it took."""

    state: int
    cached: bool
    seconds: float


class GrammarConstraint:
    """allowed(ids): bool [vocab], the tokens the grammar allows after `ids`; state(ids): the automaton's state."""

    def __init__(self, masker: TokenMasker):
        self.masker = masker
        self.last: MaskLookup | None = None

    @classmethod
    def for_schema(cls, schema: dict | str, tokenizer) -> "GrammarConstraint":
        """The constraint of a JSON schema of the course's subset (UnsupportedSchema names a feature outside it)."""
        return cls(_masker(schema_pattern(schema), tokenizer))

    @property
    def vocab_size(self) -> int:
        return len(self.masker.tokens)

    def state(self, ids) -> int:
        """The DFA state after the tokens `ids` (DEAD once one leaves the pattern)."""
        state = self.masker.dfa.start
        for token in ids:
            state = self.masker.advance(state, int(token))
        return state

    def allowed(self, ids) -> torch.Tensor:
        """The tokens allowed after `ids` (bool [vocab]); what it cost goes to `last`."""
        state = self.state(ids)
        cached = state in self.masker.cache
        seconds, mask = timed(lambda: self.masker.allowed(state))
        self.last = MaskLookup(state, cached, seconds)
        return mask


@functools.lru_cache(maxsize=4)
def _vocabulary(tokenizer) -> TokenMasker:
    """A masker over the tokenizer's vocabulary (the tokenizer by identity): its token bytes and byte trie, which do
    not depend on the grammar, built once."""
    return TokenMasker(compile_pattern(""), token_bytes(tokenizer), tokenizer.eos_token_id)


@functools.lru_cache(maxsize=16)
def _masker(pattern: str, tokenizer) -> TokenMasker:
    """The masker of a pattern over a tokenizer's vocabulary, built once and shared: the vocabulary's masker with
    this pattern's DFA and a cache of its own (the trie is shared, read only)."""
    return _vocabulary(tokenizer).for_dfa(compile_pattern(pattern))
