"""The minimal DFA (constrained/minimize.py): the same language as the subset construction's, proved state by state,
with fewer states, none of them equivalent; and the same token masks along an answer."""

from __future__ import annotations

import json

import pytest

from llm_anatomy.constrained import DEAD, TokenMasker, compile_pattern, schema_pattern
from llm_anatomy.constrained.minimize import minimized
from llm_anatomy.server.structured import json_object_pattern

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "n": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
          "required": ["name", "n", "tags"]}
PATTERNS = {"schema": schema_pattern(SCHEMA), "json_object": json_object_pattern(2), "alternatives": "(ab|ac)*d?",
            "counted": "x{2,4}(yx{2,4})*"}


def _equivalent(a, b) -> bool:
    """Walk both DFAs in lockstep from their starts over every byte: the same language exactly when every pair of
    states reached agrees on accepting and on which bytes die."""
    seen, todo = {(a.start, b.start)}, [(a.start, b.start)]
    while todo:
        s, t = todo.pop()
        if a.accepting[s] != b.accepting[t]:
            return False
        for byte in range(256):
            pair = (a.table[s][byte], b.table[t][byte])
            if (pair[0] == DEAD) != (pair[1] == DEAD):
                return False
            if pair[0] != DEAD and pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return True


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_the_minimal_dfa_has_the_same_language_and_no_two_equivalent_states(name):
    dfa = compile_pattern(PATTERNS[name])
    small = minimized(dfa)
    assert _equivalent(dfa, small) and small.start == 0 and small.num_states <= dfa.num_states
    assert minimized(small).num_states == small.num_states  # nothing left to merge
    broken = minimized(dfa)
    broken.accepting[0] = not broken.accepting[0]  # the check can fail: one state's verdict changed
    assert not _equivalent(dfa, broken)


def test_merging_makes_fewer_masks_and_the_same_ones():
    dfa = compile_pattern(json_object_pattern(2))
    small = minimized(dfa)
    assert small.num_states < dfa.num_states  # subset construction left states with the same future
    vocab = [b"{", b"}", b'"', b'":', b" ", b'": ', b"a", b"ab", b", ", b'", "', b"1", b"[", b"]", b"true", None]
    eos = len(vocab) - 1
    big_masker, small_masker = TokenMasker(dfa, vocab, eos), TokenMasker(small, vocab, eos)
    text = json.dumps({"ab": [1, "a"], "a": {"b": True}}).encode()
    s, t = dfa.start, small.start
    for byte in text:
        assert big_masker.allowed(s).tolist() == small_masker.allowed(t).tolist()
        s, t = dfa.step(s, byte), small.step(t, byte)
    assert dfa.accepting[s] and small.accepting[t]
