"""Notebook 12's C26 cells besides check_c26 (constrained/evidence.py), on the real model: the mask's cost per step
against a decode step (cost_claim), and our masks against xgrammar's at every step (reference_claim), each held to a
counterfactual world where it must fail: an engine that rebuilds the mask naively every step, a mask that checks
only each token's first byte."""

from __future__ import annotations

import pytest

from llm_anatomy.claims import ClaimFailed
from llm_anatomy.constrained import TokenMasker, compile_pattern, mask_timing, naive_mask, schema_pattern, token_bytes
from llm_anatomy.constrained.evidence import cost_claim, reference_claim
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


def test_the_reference_claim_needs_a_step():
    with pytest.raises(ClaimFailed, match="no step"):
        reference_claim([])


def _xgrammar_steps(real, real_scratch, dfa_and_vocab, mode):
    pytest.importorskip("xgrammar")
    from llm_anatomy.constrained.evidence import compare_with_xgrammar

    dfa, vocab = dfa_and_vocab
    masker = TokenMasker(dfa, vocab, real.tokenizer.eos_token_id, mode)
    return compare_with_xgrammar(real_scratch, real.tokenizer, SCHEMA, PROMPT, masker, GREEDY, max_new_tokens=8)


def test_our_masks_equal_xgrammars_in_the_notebooks_cell(real, real_scratch, dfa_and_vocab):
    steps = _xgrammar_steps(real, real_scratch, dfa_and_vocab, "full")
    assert "C26 holds" in str(reference_claim(steps)) and len(steps) == 8


@pytest.mark.counterfactual("C26", "a mask that checks only each token's first byte, set against xgrammar's masks")
def test_c26_reference_fails_for_a_mask_that_checks_only_the_first_byte(real, real_scratch, dfa_and_vocab):
    steps = _xgrammar_steps(real, real_scratch, dfa_and_vocab, "first_byte")
    with pytest.raises(ClaimFailed, match="C26 FAILED"):
        reference_claim(steps)
