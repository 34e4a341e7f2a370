"""Checks for notebook 12 (output you can parse): the token mask of an automaton state, and the state's advance by
the chosen token.

Both checks use patterns and toy vocabularies the notebook never shows (a clock time, a hex colour, a version
number) and the real tokenizer's 49,152 tokens on two states of a pattern of their own; the reference is the
course's constrained package (naive_mask, DFA.walk), computed before the learner's code runs and refused to it while
it runs, as is the notebook's own walk_trace (section 2), which already walks a token's bytes. Each typical mistake
is named in one sentence: only the first byte checked, the last byte skipped, a DEAD state given a mask (EOS read
from dfa.accepting[-1]), the end-of-sequence token allowed too early or never, a special token allowed, the state not
advanced, a DEAD state walked on.
"""

from __future__ import annotations

import functools
import types

import torch

from ..constrained import DEAD, DFA, compile_pattern, naive_mask, token_bytes
from ..constrained import mask as mask_module
from ..constrained.mask import TokenMasker
from . import call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: for the notebook)
from .not_yet import NotYet, _LearnerFailed

# toy vocabularies: id 0 is the end-of-sequence token, None a special token; the bytes cross states, some die on
# their last byte only (b"0ag" after "#"), some revive if a walk goes on from DEAD
_COLOUR = (r"#[0-9a-f]{6}", [None, b"#", b"#f", b"#ff", b"ff", b"f", b"0a", b"0g", b"0ag", b"g0", b"#00ff00",
                             b"00ff00", b"a", b"ab", b"abc", None, b"\n", b" #", b"12", b"123456", b"1234567"],
           [b"", b"#", b"#12", b"#12345", b"#123456"])
_CLOCK = (r"([01][0-9]|2[0-3]):[0-5][0-9]", [None, b"0", b"1", b"2", b"23", b"24", b"9", b":", b":5", b":6",
                                              b":59", b":599", b"12:", b"12:3", b"12:30", b"29", b"0:", None, b"5"],
          [b"", b"1", b"2", b"12", b"12:", b"12:3", b"12:30"])
_VERSION = (r"v[0-9]+\.[0-9]+(\.[0-9]+)?", [None, b"v", b"v1", b"v1.", b"v1.2", b"1", b"12", b".", b".3", b".x",
                                             b"1.2", b"1.2.3", b"1..", b"a", None, b"v1.2.3.4", b"0"],
            [b"", b"v", b"v1", b"v1.", b"v1.2", b"v1.2.", b"v1.2.3"])
_TOYS = [_COLOUR, _CLOCK, _VERSION]
# a pattern of the check's own on the real vocabulary: inside a string many tokens are allowed, after it few
_REAL_PATTERN = r'[a-z_]+ = "[^"\\]*"(; [a-z_]+ = [0-9]+)?'
_REAL_PREFIXES = [b"max_tokens = \"caf", b"max_tokens = \"ok\"; n = 4"]
_SHORTCUTS = [(mask_module, "naive_mask"), naive_mask, TokenMasker]
_NOTEBOOKS_WALKS = ("walk_trace",)  # notebook 12's own walk of a token's bytes (section 2), in the learner's namespace


def _notebooks_walks(function) -> list:
    """The notebook's functions that walk bytes for the learner, as the learner's function sees them: its globals
    are the notebook's namespace (a lambda's or a helper's too)."""
    names = getattr(function, "__globals__", {})
    return [names[n] for n in _NOTEBOOKS_WALKS if isinstance(names.get(n), types.FunctionType)]


@functools.cache
def _real_vocab() -> tuple[tuple, int]:
    """The default model's tokens as bytes (None for the special ones) and its end-of-sequence id, read once."""
    from transformers import AutoTokenizer

    from ..weights.cache import fetch_default_model

    tokenizer = AutoTokenizer.from_pretrained(fetch_default_model(progress=False))
    return tuple(token_bytes(tokenizer)), int(tokenizer.eos_token_id)


def _walk_on(dfa: DFA, state: int, data: bytes, mode: str = "full") -> int:
    """A mistaken walk: "first"/"skip_last" read too few bytes, "on" goes on from DEAD through table[-1]."""
    data = data[:1] if mode == "first" else data[:-1] if mode == "skip_last" else data
    if mode != "on":
        return dfa.walk(state, data)
    for byte in data:
        state = dfa.table[state][byte]  # DEAD is -1: Python reads the last state's row
    return state


def _cases(real: bool):
    """(pattern, vocab, eos_id, state, what the state follows) for the toy DFAs, then a few states on the real vocab."""
    for pattern, vocab, prefixes in _TOYS:
        dfa = compile_pattern(pattern)
        for prefix in prefixes:
            yield pattern, list(vocab), 0, dfa.walk(dfa.start, prefix), prefix
        yield pattern, list(vocab), 0, DEAD, b"a byte that left the pattern"
    if real:
        vocab, eos = _real_vocab()
        dfa = compile_pattern(_REAL_PATTERN)
        for prefix in _REAL_PREFIXES:
            yield _REAL_PATTERN, list(vocab), eos, dfa.walk(dfa.start, prefix), prefix


def _the_mask(value, n: int) -> torch.Tensor:
    mask = returned(value, "tensor", "the mask (one boolean per token id)")
    expect(mask.dim() == 1 and mask.numel() == n, f"return one boolean per token id ({n} of them, in id order), not "
                                                  f"a shape of {list(mask.shape)}: a list of the allowed ids is not a "
                                                  "mask.")
    expect(bool(((mask == 0) | (mask == 1)).all()), "return booleans (True where the token is allowed), not scores.")
    return mask.bool()


@exercise
@hints("A token is allowed when all of its bytes, read one after another from the state, keep the automaton alive; "
       "the end-of-sequence token depends on the state alone.",
       "For each token: None (a special token) is refused; otherwise step through its bytes with dfa.step and refuse "
       "it as soon as a byte leads to DEAD. Then set the entry of eos_id to dfa.accepting[state]; from DEAD nothing "
       "is allowed.",
       "mask = [False] * len(vocab); for each id and data: skip None; s = state; for each byte: s = dfa.step(s, "
       "byte), break at DEAD; mask[id] = s != DEAD. Finally mask[eos_id] = state != DEAD and dfa.accepting[state].")
def check_token_mask(token_mask) -> str:
    """token_mask(dfa, state, vocab, eos_id) -> one boolean per token id: may this token come next?"""
    expect(callable(token_mask), "define a function token_mask(dfa, state, vocab, eos_id).")
    for pattern, vocab, eos, state, prefix in _cases(real=True):
        dfa = compile_pattern(pattern)  # the learner's own copy
        want = naive_mask(dfa, vocab, state, eos)
        try:
            with forbidden_all(_SHORTCUTS + _notebooks_walks(token_mask), "walk each token's bytes through the "
                               "automaton yourself, with dfa.step"):
                got = call(token_mask, dfa, state, list(vocab), eos)
        except _LearnerFailed as failed:  # a TypeError about None: the special tokens were walked
            err = failed.args[0]
            expect(not (isinstance(err, TypeError) and "NoneType" in str(err)), f"your code raised TypeError ({err}): "
                   "vocab holds None for each special token, which is never allowed (the end-of-sequence token is "
                   "decided by the state, not by bytes).")
            raise
        got = _the_mask(got, len(vocab))
        if torch.equal(got, want):
            continue
        where = f"for {pattern!r} after {prefix!r}" + (" (DEAD)" if state == DEAD else "")
        eos_from_dead = (", and not the end-of-sequence token either (dfa.accepting[DEAD] is dfa.accepting[-1], the "
                         "last state's flag: check for DEAD first).")
        expect(state != DEAD, f"{where}: from DEAD nothing is allowed, not {int(got.sum())} tokens"
                              + (eos_from_dead if got[eos] else "."))
        accepts = dfa.accepting[state]
        expect(not (got[eos] and not accepts), f"{where} you allowed the end-of-sequence token too early: the state "
                                               "does not accept, so the answer would end unfinished.")
        expect(not (accepts and not got[eos]), f"{where} the state accepts, and you never allow the end-of-sequence "
                                               "token there: the answer could never end (allow it exactly where "
                                               "dfa.accepting[state]).")
        special = [i for i, data in enumerate(vocab) if data is None and i != eos and got[i]]
        expect(not special, f"{where} you allowed the special token {special[:1]} (None in vocab): a special token is "
                            "never allowed.")
        mistakes = [("first", "you checked only each token's first byte: walk ALL its bytes (one token can cross "
                              "several states, and die on a later byte)."),
                    ("skip_last", "you skipped each token's last byte: walk all of them, the last one too."),
                    ("on", "your walk went on after a byte led to DEAD: stop there (DEAD is -1, and dfa.table[-1] is "
                           "the last state's row, not a dead end).")]
        for mode, message in mistakes:
            wrong = torch.tensor([data is not None and _walk_on(dfa, state, data, mode) != DEAD for data in vocab])
            wrong[eos] = want[eos]
            expect(not torch.equal(got, wrong), f"{where} {message}")
        tid = int((got != want).nonzero()[0])
        expect(False, f"{where} token {tid} ({vocab[tid]!r}) should be {'allowed' if want[tid] else 'refused'}: "
                      f"walking its bytes from the state {'stays alive' if want[tid] else 'reaches DEAD'}.")
    return "a state's mask walks every token's bytes; most tokens are refused, and EOS only where the state accepts."


def _advance_cases():
    """(pattern, state, data, what the state follows): tokens that stay alive, die on a later byte, or start DEAD."""
    for pattern, vocab, prefixes in _TOYS:
        dfa = compile_pattern(pattern)
        for prefix in prefixes:
            for data in sorted(filter(None, vocab), key=len, reverse=True):  # the tokens of several bytes first
                yield pattern, dfa.walk(dfa.start, prefix), data, prefix
        yield pattern, DEAD, vocab[1], b"a byte that left the pattern"
    vocab, _ = _real_vocab()
    dfa = compile_pattern(_REAL_PATTERN)
    for prefix in _REAL_PREFIXES:
        state = dfa.walk(dfa.start, prefix)
        alive = [data for data in vocab if data and dfa.walk(state, data) != DEAD]
        for data in alive[::max(1, len(alive) // 40)] + [b' = "', b'"; n', b"\xe2\x80"]:
            yield _REAL_PATTERN, state, data, prefix


@exercise
@hints("The token's bytes move the automaton one byte at a time, from the state before it; once a byte leaves the "
       "pattern, nothing brings it back.",
       "Start from `state` and call dfa.step(s, byte) for each byte of data, in order; return DEAD as soon as a step "
       "gives DEAD (or when you start from DEAD), else the state after the last byte.",
       "s = state; for byte in data: if s == DEAD: return DEAD; s = dfa.step(s, byte). return s")
def check_advance(advance) -> str:
    """advance(dfa, state, data) -> the state after the token's bytes `data`, or DEAD."""
    expect(callable(advance), "define a function advance(dfa, state, data).")
    dfas = {}  # the learner's copies, one per pattern
    for pattern, state, data, prefix in _advance_cases():
        dfa = dfas.setdefault(pattern, compile_pattern(pattern))
        want = dfa.walk(state, data)
        with forbidden_all([(DFA, "walk"), TokenMasker] + _notebooks_walks(advance), "step through the bytes "
                           "yourself with dfa.step"):
            got = call(advance, dfa, state, data)
        expect(got is not None, f"advance returned None for {data!r}: return DEAD (-1) when a byte leaves the pattern.")
        got = returned(got, "whole", "the state (an int, or DEAD)")
        if got == want:
            continue
        where = f"for {pattern!r}, after {prefix!r}, the token {data!r}"
        expect(state != DEAD, f"{where}: from DEAD the state stays DEAD, whatever the bytes, not {got}.")
        several = len(data) > 1  # a one-byte token reads the same either way
        expect(not several or got != _walk_on(dfa, state, data, "first"), f"{where}: you read only the token's first "
                                                                          "byte: walk all of them.")
        expect(not several or got != _walk_on(dfa, state, data, "skip_last"), f"{where}: you skipped the token's "
                                                                              "last byte.")
        expect(want != DEAD or got != _walk_on(dfa, state, data, "on"), f"{where} leaves the pattern, and your walk "
               "went on after a byte led to DEAD: stop there (DEAD is -1, and dfa.table[-1] is the last state's row, "
               "not a dead end).")
        expect(want != DEAD, f"{where} leaves the pattern: return DEAD (-1), not {got}.")
        expect(got != state, f"{where}: you returned the state it started from: advance it by the token's bytes.")
        expect(got != dfa.start, f"{where}: you returned the start state: advance it from the state you were given "
                                 "by the token's bytes.")
        expect(False, f"{where} leads to state {want}, not {got}.")
    return "the state follows the chosen token's bytes, so the next mask is the one the text so far allows."

