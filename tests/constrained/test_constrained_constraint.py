"""GrammarConstraint (constrained/constraint.py), the grammar the stepper decodes under: its state follows the
generated ids, its masks are the naive walk's, and one masker per schema shares the vocabulary's trie."""

from __future__ import annotations

import torch

from llm_anatomy.constrained import DEAD, naive_mask, token_bytes
from llm_anatomy.constrained.constraint import GrammarConstraint

POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}
FLAG = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}


def test_the_state_follows_the_ids_and_the_masks_are_the_naive_walks(reference_tokenizer):
    tokenizer = reference_tokenizer
    grammar = GrammarConstraint.for_schema(POINT, tokenizer)
    masker, tokens, eos = grammar.masker, token_bytes(tokenizer), tokenizer.eos_token_id
    ids = tokenizer('{"x": 12, "y": -3}', add_special_tokens=False).input_ids
    for cut in (0, 2, len(ids) - 1, len(ids)):
        state = grammar.state(ids[:cut])
        assert state == masker.dfa.walk(masker.dfa.start, b"".join(tokens[i] for i in ids[:cut])) != DEAD
        assert torch.equal(grammar.allowed(ids[:cut]), naive_mask(masker.dfa, tokens, state, eos))
    assert bool(grammar.allowed(ids)[eos]) and grammar.state(ids + [eos]) == grammar.state(ids)  # EOS keeps it
    assert grammar.state(tokenizer("{} nope", add_special_tokens=False).input_ids) == DEAD


def test_one_masker_per_schema_shares_the_trie_and_says_what_each_mask_cost(reference_tokenizer):
    first = GrammarConstraint.for_schema(FLAG, reference_tokenizer)
    again, other = (GrammarConstraint.for_schema(schema, reference_tokenizer) for schema in (FLAG, POINT))
    assert first.masker is again.masker and first is not again
    assert other.masker.trie is first.masker.trie and other.masker.cache is not first.masker.cache
    assert other.masker.dfa.pattern != first.masker.dfa.pattern
    first.masker.cache.clear()
    first.allowed([])
    assert first.last.state == first.masker.dfa.start and not first.last.cached and first.last.seconds > 0
    again.allowed([])
    assert again.last.cached and first.last is not again.last
