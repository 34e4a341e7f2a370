"""Constrained decoding from scratch (issue 50, notebook 12, claim C26): a JSON schema -> a regular pattern -> a DFA
over bytes -> a mask over the tokens -> masked sampling.

What exists (this package):
- automaton.py: a regular pattern parsed (pattern.py), built into a Thompson NFA and made a DFA over BYTES by subset
  construction (classes are byte sets; [^...] and . admit only well-formed UTF-8; non-ASCII literals are their UTF-8
  bytes); dead states pruned, so every live state can still finish.
- schema.py: the JSON-schema subset (object with all properties required, string/integer/number/boolean/enum,
  arrays of those, nested objects; fixed separators ", " and ": ") as a pattern; UnsupportedSchema names a feature
  outside it.
- mask.py: each token's bytes (GPT-2's byte table); naive_mask (every token walked, no cache) and TokenMasker (a
  byte trie of the vocabulary walked once per reached state, cached); modes "skip_last" and "first_byte" plant the
  two classic bugs.
- generate.py: constrained_generate (logits masked to -inf before the course's sampler, the state advanced by the
  chosen token's bytes; greedy or seeded sampling; on_step sees each step's state, mask and choice),
  unconstrained_answers and count_unconstrained_failures (why_not_parsed: not JSON, cut off by the budget, or
  another shape), mask_timing against a decode step (naive walk, first visit, kept mask), mask_replay (answers'
  steps on an empty cache: the first visits paid, the hit rate; state_kind sorts states literal/string/number), and
  check_c26, C26's check (claims.claim): an answer counts when it ended with EOS and parses and validates (a token
  that leaves the pattern ends it, failed).

Where it is used: notebook 12 (claim C26) builds each piece in front of the learner, then calls these; evidence.py
holds C26's cost half (cost_claim: the cached mask against a decode step) and the check against xgrammar
(compare_with_xgrammar, compare_along, reference_check: a reading, not a verdict on C26); constraint.py gives the
stepper a schema's mask and state (GrammarConstraint); minimize.py merges the states with the same future (Moore),
which the API's maskers use (server/structured.py: response_format); `python -m llm_anatomy bench structured` times
it all beside xgrammar.

What is tested (tests/constrained): patterns against re.fullmatch; UTF-8 classes refuse invalid, overlong, surrogate
bytes; schema patterns against json.dumps texts that validate and texts that do not; features outside the subset
named; token bytes equal tokenizer.decode for every token; the trie mask equal to the naive mask (all three modes);
at every step of greedy and sampled generations for 4 schemas (and compact separators), our allowed set equal to
xgrammar 0.2.9's bitmask (test_constrained_xgrammar.py; xgrammar is installed with --no-deps from
requirements-nodeps.txt, as its wheel requires triton on Linux x86_64 for GPU kernels only), except two differences
by design: xgrammar lets a JSON string spell the 16 special tokens (we never allow them), and its maxLength string has
no escapes and admits raw control bytes; check_c26 holds on the real model and raises ClaimFailed with the
skip-last-byte and first-byte-only masks, and cost_claim with a mask rebuilt naively every step
(tests/COUNTERFACTUALS.md lists them); reference_check raises for the first-byte-only mask; a minimized automaton
accepts the same strings and gives the same masks.
"""

from .automaton import DEAD, DFA, compile_pattern, escape, parse
from .mask import TokenMasker, naive_mask, token_bytes
from .schema import UnsupportedSchema, schema_pattern

__all__ = ["DEAD", "DFA", "compile_pattern", "escape", "parse", "TokenMasker", "naive_mask", "token_bytes",
           "UnsupportedSchema", "schema_pattern"]
from .generate import (Answer, audit_mask, check_c26, constrained_generate, count_unconstrained_failures, mask_replay,
                       mask_timing, parses, state_kind, unconstrained_answers, why_not_parsed)

__all__ += ["Answer", "audit_mask", "check_c26", "constrained_generate", "count_unconstrained_failures", "mask_replay", "mask_timing",
            "parses", "state_kind", "unconstrained_answers", "why_not_parsed"]
