"""Notebook 12's C26 cells besides check_c26 (constrained/evidence.py), on the real model: the mask's cost per step
against a decode step (cost_claim), held to its counterfactual world (an engine that rebuilds the mask naively every
step); the answers' first visits replayed (mask_replay); and our masks against xgrammar's at every step of an answer
(reference_check: a reference, not a claim; it raises for a mask that checks only each token's first byte)."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.claims import ClaimFailed
from llm_anatomy.constrained import (Answer, TokenMasker, compile_pattern, mask_replay, mask_timing, naive_mask,
                                     schema_pattern, state_kind, token_bytes)
from llm_anatomy.constrained.evidence import compare_along, cost_claim, reference_check
from llm_anatomy.generate.sampling import GREEDY

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
PROMPT = "A person, as JSON: "


class RebuildingMasker(TokenMasker):
    """An engine without the precomputation: every step walks the whole vocabulary from the state again."""

    def allowed(self, state):
        return naive_mask(self.dfa, self.tokens, state, self.eos_id, self.mode)


@pytest.fixture(scope="module")
def dfa_and_vocab(real):
    return compile_pattern(schema_pattern(SCHEMA)), token_bytes(real.tokenizer)


def _states(dfa):
    text = b'{"name": "Ada", "age": 36}'
    states = [dfa.walk(dfa.start, text[:n]) for n in range(0, len(text), 6)]  # literal, string and number states
    return states


def test_the_precomputed_mask_is_cheap_beside_a_decode_step(real, real_scratch, dfa_and_vocab):
    dfa, vocab = dfa_and_vocab
    figures = mask_timing(real_scratch, TokenMasker(dfa, vocab, real.tokenizer.eos_token_id), _states(dfa), rounds=2)
    assert "C26 holds" in str(cost_claim(figures))


@pytest.mark.counterfactual("C26", "an engine that rebuilds the mask by walking the whole vocabulary at every step")
def test_c26_cost_fails_for_an_engine_that_rebuilds_the_mask_every_step(real, real_scratch, dfa_and_vocab):
    dfa, vocab = dfa_and_vocab
    figures = mask_timing(real_scratch, RebuildingMasker(dfa, vocab, real.tokenizer.eos_token_id), _states(dfa),
                          rounds=2)
    print({k: f"{v * 1e3:.3f} ms" for k, v in figures.items()})
    with pytest.raises(ClaimFailed, match="C26 FAILED.*of a .* decode step"):
        cost_claim(figures)


def test_the_replay_pays_each_first_visit_once(real, dfa_and_vocab):
    dfa, vocab = dfa_and_vocab
    masker = TokenMasker(dfa, vocab, real.tokenizer.eos_token_id)
    states = _states(dfa)
    replay = mask_replay(masker, [Answer([], "", states), Answer([], "", states[:3])])
    assert replay["steps"] == len(states) + 3 and set(replay["first_visit_s"]) == set(states)
    assert replay["hit_rate"] == pytest.approx(1 - len(set(states)) / (len(states) + 3))
    assert not masker.cache  # the replay's cache is its own
    tiny = masker.for_dfa(compile_pattern(r"-?(0|[1-9][0-9]*)"))  # the trie shared, nothing cached
    tiny.precompute()
    assert tiny.trie is masker.trie and sorted(tiny.cache) == list(range(tiny.dfa.num_states)) and not masker.cache
    assert torch.equal(tiny.allowed(1), naive_mask(tiny.dfa, vocab, 1, real.tokenizer.eos_token_id))
    assert [state_kind(dfa, s) for s in states[:3]] == ["literal", "literal", "string"]
    assert state_kind(dfa, dfa.walk(dfa.start, b'{"name": "Ada", "age": 3')) == "number"


def test_the_reference_check_needs_a_step():
    with pytest.raises(AssertionError, match="no step"):
        reference_check({"person": []})


def _xgrammar_steps(real, dfa_and_vocab, mode, schema=SCHEMA, text=b'{"name": "Ada", "age": 36}'):
    pytest.importorskip("xgrammar")
    dfa, vocab = dfa_and_vocab
    if schema is not SCHEMA:
        dfa = compile_pattern(schema_pattern(schema))
    masker = TokenMasker(dfa, vocab, real.tokenizer.eos_token_id, mode)
    ids = real.tokenizer.encode(text.decode(), add_special_tokens=False)
    return compare_along(real.tokenizer, schema, masker, ids)


def test_our_masks_equal_xgrammars_along_an_answer(real, dfa_and_vocab):
    bounded = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                "age": {"type": "integer"}}, "required": ["name", "age"]}
    steps = {"person": _xgrammar_steps(real, dfa_and_vocab, "full"),
             "bounded": _xgrammar_steps(real, dfa_and_vocab, "full", bounded)}
    shown = str(reference_check(steps))
    assert "reference check, not a verdict" in shown and "differ by design" in shown, shown
    assert not any(s["by_design"] for s in steps["person"]) and any(s["by_design"] for s in steps["bounded"])


def test_the_reference_check_raises_for_a_mask_that_checks_only_the_first_byte(real, dfa_and_vocab):
    steps = _xgrammar_steps(real, dfa_and_vocab, "first_byte")
    with pytest.raises(AssertionError, match="differs from xgrammar's"):
        reference_check({"person": steps})
