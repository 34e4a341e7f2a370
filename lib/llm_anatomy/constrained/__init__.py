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
  count_unconstrained_failures, mask_timing against a decode step, and check_c26, C26's check (claims.claim): an
  answer counts when it ended with EOS and parses and validates (a token that leaves the pattern ends it, failed).

What is tested (tests/constrained, about 3 minutes on 2 busy cores): patterns against re.fullmatch; UTF-8 classes
refuse invalid, overlong, surrogate bytes; schema patterns against json.dumps texts that validate and texts that do
not; features outside the subset named; token bytes equal tokenizer.decode for every token; the trie mask equal to
the naive mask (all three modes); at every step of greedy and sampled generations for 4 schemas (and compact
separators), our allowed set equal to xgrammar 0.2.9's bitmask (test_constrained_xgrammar.py, skipped where
xgrammar is not importable), except two differences by design: xgrammar lets a JSON string spell the 16 special
tokens (we never allow them), and its maxLength string has no escapes and admits raw control bytes; check_c26 holds
on the real model (8 of 8 sampled answers parse and validate; 4 of 4 unconstrained do not) and raises ClaimFailed
with the skip-last-byte and first-byte-only masks (tests/COUNTERFACTUALS.md lists both).

Figures measured here (2-core CPU, load about 3; mask_timing, best of 3 rounds in turns): a decode step 55 ms; a
cached mask (look-up + masked_fill over 49,152 logits) 0.07 ms; the naive walk of every token 14 ms per state on
average over a spread of states; the trie's first visit to a state 22 ms (pure Python; only caching makes it cheap).

What is left for notebook 12: the notebook itself (its C26 cells call check_c26 and count_unconstrained_failures,
print mask_timing); C26's notebook row in README's contents and INSTRUCTOR; xgrammar in requirements and the lock:
its wheel requires triton on Linux x86_64, so it is NOT added yet; it imports and runs on the CPU when installed
with `pip install --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2` (the lead decides how make and CI
install it); the stepper view of the removed candidates; the API's response_format; bench structured (xgrammar's
mask time beside ours); the learner's exercises; the quality section (token healing, answer distributions).
"""

from .automaton import DEAD, DFA, compile_pattern, escape, parse
from .mask import TokenMasker, naive_mask, token_bytes
from .schema import UnsupportedSchema, schema_pattern

__all__ = ["DEAD", "DFA", "compile_pattern", "escape", "parse", "TokenMasker", "naive_mask", "token_bytes",
           "UnsupportedSchema", "schema_pattern"]
from .generate import Answer, check_c26, constrained_generate, count_unconstrained_failures, mask_timing, parses

__all__ += ["Answer", "check_c26", "constrained_generate", "count_unconstrained_failures", "mask_timing", "parses"]
