"""The checks behind notebook 12's C26 cells besides check_c26, each a function of measured evidence, so that a test
can hand it the evidence of a world where the claim is false and see it fail
(tests/constrained/test_constrained_evidence.py).

`cost_claim`: a state's kept mask, looked up and applied per step (mask_timing's "cached_s": a look-up and a
masked_fill) costs under a tenth of a decode step, and walking the whole vocabulary instead costs at least ten times
as much. Both hold on any machine: a dictionary look-up and one pass over 49,152 booleans against a 135M-parameter
forward pass, and against 49,152 walks in Python. An engine that rebuilds the mask by walking every token at every
step fails the first half (measured here at about a quarter of a decode step). What makes the per-step mask cheap is
keeping it (a cache, or a precompute), not the trie: a state's first visit (the trie walked once, pure Python) costs
about as much as the naive walk; it is printed (mask_timing, constrained.mask_replay), not asserted.

`reference_check`: not a verdict on C26 (matching a library proves neither half of its sentence) but a check of our
masks against the engines' reference: at every step of an answer our allowed set equals xgrammar's
(`compare_with_xgrammar` generates one, `compare_along` walks an answer already made), leaving out the 16 special
tokens that xgrammar lets a JSON string spell (we never allow them) and, in a string with maxLength, the tokens
that differ by design (`bounded_string_difference`). A reading when they agree; AssertionError when they do not (a
mask that checks only each token's first byte differs at the first step inside a string).
"""

from __future__ import annotations

import json

import torch

from ..claims import claim, reading
from ..generate.sampling import SamplingParams
from .generate import constrained_generate
from .mask import TokenMasker

CHEAP = 0.1  # the engine's mask per step, as a share of a decode step (the aim on the default model)
PRECOMPUTED_GAIN = 10  # the naive walk over the kept mask, at least (about 200x measured here)


def cost_claim(figures: dict):
    """C26's cost half on mask_timing's figures (seconds): a state's kept mask, looked up and applied per step
    ("cached_s"), under CHEAP of a decode step, and the naive walk of the vocabulary at least PRECOMPUTED_GAIN times
    that."""
    mask, naive, step = figures["cached_s"], figures["naive_s"], figures["decode_step_s"]
    evidence = (f"a state's kept mask, looked up and applied, costs {mask * 1e3:.3f} ms per step, {mask / step:.2%} "
                f"of a {step * 1e3:.1f} ms decode step (under {CHEAP:.0%} asked); walking all the vocabulary's tokens "
                f"costs {naive * 1e3:.1f} ms per step, {naive / mask:,.0f}x the kept mask (at least "
                f"{PRECOMPUTED_GAIN}x asked) and {naive / step:.0%} of a decode step")
    return claim("C26", mask < CHEAP * step and naive >= PRECOMPUTED_GAIN * mask, evidence)


def _bitmask_to_bool(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """xgrammar's int32 words (bit i of word w: token 32w + i) as a bool [vocab]."""
    words = bitmask[0].to(torch.int64) & 0xFFFFFFFF
    return ((words.unsqueeze(1) >> torch.arange(32)) & 1).reshape(-1)[:vocab].bool()


def bounded_string_difference(data: bytes, ours: bool) -> bool:
    r"""xgrammar 0.2.9 writes a string with maxLength as [^"\\\r\n]{0,n}: no escapes, and raw control bytes (a tab)
    that JSON forbids. Ours is JSON's string, escapes counted as one character. A token differs for that reason when
    we allow it and it has a backslash, or xgrammar allows it and it has a control byte."""
    return (ours and b"\\" in data) or (not ours and any(b < 0x20 and b not in (10, 13) for b in data))


_COMPILERS: dict[int, tuple] = {}  # id(tokenizer) -> (the tokenizer, kept alive; its TokenizerInfo; a GrammarCompiler)


def _xgrammar(tokenizer, schema: dict, masker: TokenMasker, separators):
    """xgrammar's matcher for the schema, and a compare(state, allowed, chosen) that records one step and accepts
    the chosen token: how many tokens each allows and the ids where they differ, apart from the special tokens
    (xgrammar lets a string spell them; we never do) and, for a bounded string, the differences by design."""
    import xgrammar as xgr

    if id(tokenizer) not in _COMPILERS:  # the vocabulary read once per tokenizer, not once per schema
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
        _COMPILERS[id(tokenizer)] = (tokenizer, info, xgr.GrammarCompiler(info))
    _, info, compiler = _COMPILERS[id(tokenizer)]
    grammar = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                             separators=separators, strict_mode=True)
    matcher, bitmask = xgr.GrammarMatcher(grammar), xgr.allocate_token_bitmask(1, info.vocab_size)
    special = torch.tensor([i for i, data in enumerate(masker.tokens) if data is None and i != masker.eos_id])
    bounded = any(key in json.dumps(schema) for key in ('"maxLength"', '"minLength"'))
    steps = []

    def compare(state, allowed, chosen):
        matcher.fill_next_token_bitmask(bitmask)
        theirs = _bitmask_to_bool(bitmask, info.vocab_size)
        theirs[special] = False
        differ = (allowed ^ theirs).nonzero().flatten().tolist()
        by_design = [t for t in differ if bounded and bounded_string_difference(masker.tokens[t], bool(allowed[t]))]
        steps.append({"state": state, "ours": int(allowed.sum()), "theirs": int(theirs.sum()), "chosen": chosen,
                      "differ": [t for t in differ if t not in set(by_design)], "by_design": by_design})
        matcher.accept_token(chosen)

    return compare, steps


def compare_with_xgrammar(model, tokenizer, schema: dict, prompt, masker: TokenMasker, params: SamplingParams, *,
                          seed: int = 0, max_new_tokens: int = 48, separators=(", ", ": ")) -> list[dict]:
    """One constrained generation with xgrammar's matcher beside it: per step, how many tokens each allows and the
    ids where they differ (see _xgrammar).

    Raises ImportError where xgrammar is not installed (pip install --no-deps -r requirements-nodeps.txt).
    """
    compare, steps = _xgrammar(tokenizer, schema, masker, separators)
    constrained_generate(model, tokenizer, prompt, masker, params, seed=seed, max_new_tokens=max_new_tokens,
                         on_step=compare)
    return steps


def compare_along(tokenizer, schema: dict, masker: TokenMasker, ids: list[int], *, finished: bool = True,
                  separators=(", ", ": ")) -> list[dict]:
    """Our mask and xgrammar's at each step of an answer already chosen (its ids, then EOS when it ended): the same
    comparison as compare_with_xgrammar, with no model run. Raises ImportError where xgrammar is not installed."""
    compare, steps = _xgrammar(tokenizer, schema, masker, separators)
    state = masker.dfa.start
    for chosen in list(ids) + ([masker.eos_id] if finished else []):
        compare(state, masker.allowed(state), chosen)
        state = masker.advance(state, chosen)
    return steps


def reference_check(compared: dict[str, list[dict]]):
    """Our masks against xgrammar's (compared: a name -> the steps of compare_*): a reading when every step allows
    exactly xgrammar's tokens (the differences by design counted apart); AssertionError at the first that does not."""
    parts = []
    for name, steps in compared.items():
        if not steps:
            raise AssertionError(f"{name}: no step was compared with xgrammar's")
        differ = [i for i, s in enumerate(steps) if s["differ"]]
        if differ:
            raise AssertionError(f"{name}: our mask differs from xgrammar's at {len(differ)} of {len(steps)} steps; "
                                 f"the first, step {differ[0]}: {len(steps[differ[0]]['differ'])} tokens")
        design = {t for s in steps for t in s["by_design"]}
        parts.append(f"{name}, {len(steps)} of {len(steps)} steps (from {min(s['ours'] for s in steps):,} to "
                     f"{max(s['ours'] for s in steps):,} tokens a step)"
                     + (f", {len(design):,} tokens apart that differ by design" if design else ""))
    return reading("C26", "a reference check, not a verdict on C26: our mask allows exactly xgrammar's tokens at "
                          "every step: " + "; ".join(parts))
