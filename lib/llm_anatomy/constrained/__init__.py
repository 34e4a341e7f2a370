"""Constrained decoding from scratch (issue 50, notebook 12, claim C26): a JSON schema -> a regular pattern -> a DFA
over bytes -> a mask over the tokens -> masked sampling.

What exists (this package):
- automaton.py: a regular pattern parsed, built into a Thompson NFA and made a DFA over BYTES by subset construction
  (classes are byte sets; [^...] and . admit only well-formed UTF-8; non-ASCII literals are their UTF-8 bytes);
  dead states pruned, so every live state can still finish.
- schema.py: the JSON-schema subset (object with all properties required, string/integer/number/boolean/enum,
  arrays of those, nested objects; fixed separators ", " and ": ") as a pattern; UnsupportedSchema names a feature
  outside it.
- mask.py: each token's bytes (GPT-2's byte table); naive_mask (every token walked, no cache) and TokenMasker (a
  byte trie of the vocabulary walked once per reached state, cached); modes "skip_last" and "first_byte" plant the
  two classic bugs.
- generate.py: constrained_generate (logits masked to -inf before the course's sampler, the state advanced by the
  chosen token's bytes; greedy or seeded sampling), unconstrained answers for comparison, mask_timing against a
  decode step, and check_c26, C26's check (claims.claim).

What is tested (tests/constrained): patterns that match and do not; schemas against json.loads + jsonschema;
the trie mask equal to the naive mask; at every step of greedy and sampled generations for several schemas, our
allowed set equal to xgrammar's bitmask (skipped where xgrammar is not installed); check_c26 holding on the real
model, and failing (ClaimFailed) with the skip-last-byte and first-byte-only masks.

What is left for notebook 12: the notebook itself; C26 in COURSE's table, README and tests/COUNTERFACTUALS.md (the
counterfactual tests here use a plain pytest mark name until README lists C26, see tests/constrained); the stepper
view of the removed candidates; the API's response_format; bench structured; the learner's exercises.
"""

from .automaton import DEAD, DFA, compile_pattern, escape, parse
from .mask import TokenMasker, naive_mask, token_bytes
from .schema import UnsupportedSchema, schema_pattern

__all__ = ["DEAD", "DFA", "compile_pattern", "escape", "parse", "TokenMasker", "naive_mask", "token_bytes",
           "UnsupportedSchema", "schema_pattern"]
from .generate import Answer, check_c26, constrained_generate, count_unconstrained_failures, mask_timing, parses

__all__ += ["Answer", "check_c26", "constrained_generate", "count_unconstrained_failures", "mask_timing", "parses"]
