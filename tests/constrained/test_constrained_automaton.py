"""The byte DFA (parse -> Thompson NFA -> subsets) and the JSON-schema subset's patterns, on strings that match and
strings that do not; checked against Python's re and json + jsonschema where they apply."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from llm_anatomy.constrained import DEAD, UnsupportedSchema, compile_pattern, schema_pattern
from llm_anatomy.errors import CourseError

CASES = [
    (r"ab|cd", ["ab", "cd"], ["", "a", "abcd", "ac"]),
    (r"a*b+c?", ["b", "aab", "abbbc", "bc"], ["", "a", "ac", "abcc"]),
    (r"(ab){2,3}", ["abab", "ababab"], ["ab", "abababab"]),
    (r"x{2,}", ["xx", "xxxxx"], ["x", ""]),
    (r"[a-c0-9_]+", ["a1_", "cc9"], ["d", "A", ""]),
    (r"\d\d?", ["1", "42"], ["", "123", "a"]),
    (r"[^ab]", ["c", "é", "中", "😀"], ["a", "b", "", "cc"]),
    (r"\.\*\[\]", [".*[]"], ["a*[]"]),
    (r"caf(é|e)", ["café", "cafe"], ["caf", "cafè"]),
    (r"(|a)b", ["b", "ab"], ["aab"]),
]


@pytest.mark.parametrize("pattern,good,bad", CASES)
def test_the_dfa_matches_what_re_fullmatch_matches(pattern, good, bad):
    dfa = compile_pattern(pattern)
    for text in good + bad:
        assert dfa.matches(text) == bool(re.fullmatch(pattern, text)) == (text in good), (pattern, text)


def test_a_class_that_admits_non_ascii_admits_only_well_formed_utf8():
    dfa = compile_pattern(r"[^a]*")
    assert dfa.matches("é中😀".encode())
    for bad in (b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xe4\xb8", b"\x80"):  # invalid, overlong, surrogate, cut
        assert not dfa.matches(bad), bad
    assert dfa.walk(dfa.start, b"\xe4\xb8") != DEAD  # but half a character is alive: a token can end there


def test_every_live_state_can_still_finish():
    dfa = compile_pattern(r"a(b|cz*q)")
    assert dfa.walk(dfa.start, b"ac") != DEAD and dfa.walk(dfa.start, b"ad") == DEAD
    for state in range(dfa.num_states):  # from every state, some bytes reach an accepting state
        seen, frontier = {state}, [state]
        while frontier and not any(dfa.accepting[s] for s in frontier):
            frontier = [t for s in frontier for t in dfa.table[s] if t != DEAD and t not in seen]
            seen.update(frontier)
        assert frontier, state


@pytest.mark.parametrize("bad", ["(ab", "a)", "*a", "[b-a]", r"\q", "a{3,1}"])
def test_patterns_it_cannot_read_raise_a_course_error(bad):
    with pytest.raises(CourseError):
        compile_pattern(bad)


SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "height": {"type": "number"},
                         "ok": {"type": "boolean"}, "size": {"enum": ["S", "M", 3, None]},
                         "tags": {"type": "array", "items": {"type": "string"}},
                         "pet": {"type": "object", "properties": {"kind": {"type": "string", "maxLength": 4}},
                                 "required": ["kind"]}},
          "required": ["name", "age", "height", "ok", "size", "tags", "pet"]}
GOOD = [
    {"name": "Zoë \"Z\" \\ \n", "age": -12, "height": 1.5e-3, "ok": True, "size": None, "tags": [],
     "pet": {"kind": ""}},
    {"name": "", "age": 0, "height": -0.25, "ok": False, "size": 3, "tags": ["a", "中"], "pet": {"kind": "cat"}},
]
BAD = [
    '{"name": "x", "age": 01, "height": 1, "ok": true, "size": "S", "tags": [], "pet": {"kind": ""}}',  # 01
    '{"name": "x", "age": 1, "height": 1., "ok": true, "size": "S", "tags": [], "pet": {"kind": ""}}',  # 1.
    '{"name": "x", "age": 1, "height": 1, "ok": true, "size": "L", "tags": [], "pet": {"kind": ""}}',  # enum
    '{"name": "x", "age": 1, "height": 1, "ok": true, "size": "S", "tags": [], "pet": {"kind": "horse"}}',  # length
    '{"age": 1, "name": "x", "height": 1, "ok": true, "size": "S", "tags": [], "pet": {"kind": ""}}',  # order
    '{"name": "x", "age": 1, "height": 1, "ok": true, "size": "S", "tags": [1], "pet": {"kind": ""}}',  # item type
    '{"name":"x","age":1,"height":1,"ok":true,"size":"S","tags":[],"pet":{"kind":""}}',  # other separators
    '{"name": "a\tb", "age": 1, "height": 1, "ok": true, "size": "S", "tags": [], "pet": {"kind": ""}}',  # control
]


def test_a_schemas_pattern_matches_its_json_and_refuses_the_rest():
    dfa = compile_pattern(schema_pattern(SCHEMA))
    for value in GOOD:
        text = json.dumps(value, ensure_ascii=False)
        jsonschema.validate(value, SCHEMA)
        assert dfa.matches(text) and dfa.matches(json.dumps(value)), text  # raw UTF-8 and \\u escapes
    for text in BAD:
        assert not dfa.matches(text), text
    compact = compile_pattern(schema_pattern(SCHEMA, separators=(",", ":")))
    assert compact.matches(BAD[-2]) and not compact.matches(json.dumps(GOOD[0]))


@pytest.mark.parametrize("schema,word", [
    ({"type": "object", "properties": {"a": {"type": "string"}}}, "optional"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}, "required": ["a"]}, "pattern"),
    ({"type": "object", "properties": {}, "required": [], "additionalProperties": True}, "additionalProperties"),
    ({"oneOf": [{"type": "string"}]}, "oneOf"),
    ({"type": "null"}, "'null'"),
])
def test_features_outside_the_subset_are_named(schema, word):
    with pytest.raises(UnsupportedSchema, match=word):
        schema_pattern(schema)
