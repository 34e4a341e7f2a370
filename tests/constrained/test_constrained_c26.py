"""C26 on the real model and tokenizer: every sampled answer under the mask parses and validates; unconstrained, some
do not; and the check fails (ClaimFailed) for the classic mask bugs: the last byte of each token skipped, only the
first byte checked, or the end-of-sequence token allowed anywhere: notebook 12's claim cell (its schema, prompt, N and token budget) in its counterfactual worlds.
Also the mask's cost against a decode step (printed; asserted only where any machine agrees), and the trie's mask
against the naive one on a schema with every kind of value.
"""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.claims import ClaimFailed
from llm_anatomy.constrained import (Answer, TokenMasker, audit_mask, check_c26, compile_pattern, count_unconstrained_failures,
                                     mask_timing, parses, schema_pattern, token_bytes, why_not_parsed)

# notebook 12's: the string bounded (maxLength) so that every answer can end within the token budget at temperature 1
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
PROMPT = "A person, as JSON: "
N, BUDGET = 8, 48
# a string, an integer, an enum and a boolean, for the trie against the naive mask (numbers and arrays: the xgrammar
# test); maxLength 2: the string's 34 states per character repeat twice, not 16 times (the same shapes, a quarter of
# the states)
SHAPES = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 2}, "age": {"type": "integer"},
                         "city": {"enum": ["Paris", "London", "Tokyo"]}, "student": {"type": "boolean"}},
          "required": ["name", "age", "city", "student"]}


@pytest.fixture(scope="module")
def vocab_bytes(real):
    return token_bytes(real.tokenizer)


def _masker(real, vocab_bytes, mode="full", schema=SCHEMA):
    return TokenMasker(compile_pattern(schema_pattern(schema)), vocab_bytes, real.tokenizer.eos_token_id, mode)


@pytest.fixture(scope="module")
def masker(real, vocab_bytes):
    """One masker for the module: a state's mask, computed once (about 0.2 s inside a string), serves every test."""
    return _masker(real, vocab_bytes)


def test_c26_holds_and_unconstrained_answers_do_not_parse(real, real_scratch, masker):
    verdict, answers = check_c26(real_scratch, real.tokenizer, SCHEMA, PROMPT, masker, n=N, max_new_tokens=BUDGET)
    assert "C26 holds" in str(verdict) and f"{N} of {N}" in str(verdict)
    assert all(a.finished and parses(a.text, SCHEMA) for a in answers)
    assert len({a.text for a in answers}) > 1  # sampled, not one answer eight times
    failed, texts = count_unconstrained_failures(real_scratch, real.tokenizer, SCHEMA, PROMPT, n=4,
                                                 max_new_tokens=16)  # as notebook 12: a whole answer fits in 14
    print(f"unconstrained: {failed} of 4 do not parse, e.g. {texts[0]!r}")
    assert failed > 0


def test_a_failed_answer_says_why_a_cut_off_apart_from_not_json():
    cases = {'{"name": "Jo", "age": 3}': None, '{"a": 1}': "wrong schema", '\n{\n  "path": "/api", "n": ': "cut off",
             '{"name": "Jo': "cut off", ' {"error": arrays[2]}': "not JSON", "00000000. This bug": "not JSON"}
    for text, why in cases.items():
        assert why_not_parsed(Answer([], text), SCHEMA) == why, text
    assert why_not_parsed(Answer([], '{"name": "Jo', finished=True), SCHEMA) == "not JSON"  # ended, never closed


@pytest.mark.counterfactual("C26", "a mask that skips the last byte of each token")
def test_c26_fails_when_the_mask_skips_each_tokens_last_byte(real, real_scratch, vocab_bytes):
    with pytest.raises(ClaimFailed, match="C26 FAILED"):
        check_c26(real_scratch, real.tokenizer, SCHEMA, PROMPT, _masker(real, vocab_bytes, "skip_last"), n=N,
                  max_new_tokens=BUDGET)


@pytest.mark.counterfactual("C26", "a mask that checks only the first byte of each token")
def test_c26_fails_when_the_mask_checks_only_the_first_byte(real, real_scratch, vocab_bytes):
    with pytest.raises(ClaimFailed, match="C26 FAILED"):
        check_c26(real_scratch, real.tokenizer, SCHEMA, PROMPT, _masker(real, vocab_bytes, "first_byte"), n=N,
                  max_new_tokens=BUDGET)


@pytest.mark.counterfactual("C26", "a mask that allows the end-of-sequence token in every state")
def test_c26_fails_when_the_mask_allows_the_end_anywhere(real, real_scratch, vocab_bytes):
    """The model rarely ends an answer mid-string, so the sampled answers alone could pass: the audit catches it."""
    with pytest.raises(ClaimFailed, match="the end-of-sequence token allowed in a state that does not accept"):
        check_c26(real_scratch, real.tokenizer, SCHEMA, PROMPT, _masker(real, vocab_bytes, "eos_anywhere"), n=N,
                  max_new_tokens=BUDGET)


def test_the_audit_finds_a_wrong_token_a_special_token_and_the_end_refused(real, vocab_bytes, masker):
    generator = torch.Generator().manual_seed(0)
    start = masker.dfa.start
    assert audit_mask(masker, start, masker.allowed(start), generator) is None
    leaks = masker.allowed(start).clone()
    leaks[real.tokenizer.convert_tokens_to_ids("hello")] = True  # one wrong token among two right ones
    for _ in range(3):  # drawn at random, but only three tokens are allowed: it is always drawn
        assert "leave the pattern" in audit_mask(masker, start, leaks, generator)
    special = masker.allowed(start).clone()
    special[0] = True  # <|endoftext|>: a special token, no bytes of text
    assert "special token" in audit_mask(masker, start, special, generator)
    accepting = next(s for s in range(masker.dfa.num_states) if masker.dfa.accepting[s])
    refused = masker.allowed(accepting).clone()
    refused[masker.eos_id] = False
    assert "refused in a state that accepts" in audit_mask(masker, accepting, refused, generator)


def test_the_cached_mask_costs_less_than_a_tenth_of_a_decode_step(real_scratch, masker):
    states = list(range(0, masker.dfa.num_states, 31))  # a spread of states: outside, inside strings, numbers
    figures = mask_timing(real_scratch, masker, states)
    print({k: f"{v * 1e3:.3f} ms" for k, v in figures.items()})
    # a dictionary look-up and a masked_fill over 49,152 logits against a 135M-parameter forward pass: far apart
    # on any machine; the naive walk's figure is printed, not asserted (it depends on how many tokens each state
    # kills at the first byte)
    assert figures["cached_s"] < 0.1 * figures["decode_step_s"]
    assert figures["cached_s"] < figures["naive_s"]


def test_token_bytes_decode_as_the_tokenizer_does(real, vocab_bytes):
    tok = real.tokenizer
    special = [i for i, b in enumerate(vocab_bytes) if b is None]
    assert tok.eos_token_id in special and set(tok.all_special_ids) <= set(special) and len(special) < 40
    checked = 0
    for tid, data in enumerate(vocab_bytes):
        if data is None:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:  # a token that ends inside a UTF-8 character: compare the pieces
            assert tok.convert_tokens_to_string([tok.convert_ids_to_tokens(tid)]) == data.decode("utf-8", "replace")
            continue
        assert text == tok.decode([tid]), tid
        checked += 1
    assert checked > 45_000


def test_the_trie_mask_equals_the_naive_mask(real, vocab_bytes, masker):
    from llm_anatomy.constrained import naive_mask

    for mode, every in (("full", 1), ("skip_last", 3), ("first_byte", 3)):  # every state; every 3rd for the bugs
        masker = _masker(real, vocab_bytes, mode, SHAPES)
        for state in range(0, masker.dfa.num_states, every):
            naive = naive_mask(masker.dfa, vocab_bytes, state, real.tokenizer.eos_token_id, mode)
            assert torch.equal(masker.allowed(state), naive), (mode, state)
    assert int(masker.allowed(0).sum()) < 100  # at the start only tokens that open with {
