"""Solutions to the exercises of notebook 12 (output you can parse)."""

from __future__ import annotations

DEAD = -1  # the automaton's dead state (llm_anatomy.constrained.DEAD)


def token_mask(dfa, state, vocab, eos_id):
    """Exercise 12.1: one boolean per token id: all of the token's bytes keep the automaton alive from `state`; a
    special token (None) never; the end-of-sequence token exactly where the state accepts."""
    mask = [False] * len(vocab)
    if state == DEAD:
        return mask
    for tid, data in enumerate(vocab):
        if data is None:
            continue
        s = state
        for byte in data:
            s = dfa.step(s, byte)
            if s == DEAD:
                break
        mask[tid] = s != DEAD
    mask[eos_id] = bool(dfa.accepting[state])
    return mask


def advance(dfa, state, data):
    """Exercise 12.2: the state after the token's bytes, or DEAD once a byte leaves the pattern."""
    for byte in data:
        if state == DEAD:
            return DEAD
        state = dfa.step(state, byte)
    return state
