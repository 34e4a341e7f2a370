"""The checks behind notebook 12's C26 cells besides check_c26, each a function of measured evidence, so that a test
can hand it the evidence of a world where the claim is false and see it fail
(tests/constrained/test_constrained_evidence.py).

`cost_claim`: the mask an engine applies per step (mask_timing's "cached_s": a look-up and a masked_fill) costs under
a tenth of a decode step, and walking the whole vocabulary instead costs at least ten times as much. Both hold on any
machine: a dictionary look-up and one pass over 49,152 booleans against a 135M-parameter forward pass, and against
49,152 walks in Python. An engine that rebuilds the mask by walking every token at every step fails the first half
(measured here at about a quarter of a decode step). The first visit of a state (the trie walked once) is printed,
not asserted: pure Python, it costs a good part of a decode step, once per state.

`reference_claim`: at every step of a constrained generation our allowed set equals xgrammar's (`compare_with_xgrammar`,
which leaves out the 16 special tokens that xgrammar lets a JSON string spell and we never allow); a mask that checks
only each token's first byte differs at the first step inside a string.
"""

from __future__ import annotations

import json

import torch

from ..claims import claim
from ..generate.sampling import SamplingParams
from .generate import constrained_generate
from .mask import TokenMasker

CHEAP = 0.1  # the engine's mask per step, as a share of a decode step (the aim on the default model)
PRECOMPUTED_GAIN = 10  # the naive walk over the precomputed mask, at least (about 200x measured here)


def cost_claim(figures: dict):
    """C26's cost half on mask_timing's figures (seconds): the engine's mask per step ("cached_s") under CHEAP of a
    decode step, and the naive walk of the vocabulary at least PRECOMPUTED_GAIN times the engine's."""
    mask, naive, step = figures["cached_s"], figures["naive_s"], figures["decode_step_s"]
    evidence = (f"the engine's mask costs {mask * 1e3:.3f} ms per step, {mask / step:.2%} of a {step * 1e3:.1f} ms "
                f"decode step (under {CHEAP:.0%} asked); walking all the vocabulary's tokens costs "
                f"{naive * 1e3:.1f} ms per step, {naive / mask:,.0f}x the engine's mask (at least {PRECOMPUTED_GAIN}x "
                f"asked) and {naive / step:.0%} of a decode step")
    return claim("C26", mask < CHEAP * step and naive >= PRECOMPUTED_GAIN * mask, evidence)


def _bitmask_to_bool(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """xgrammar's int32 words (bit i of word w: token 32w + i) as a bool [vocab]."""
    words = bitmask[0].to(torch.int64) & 0xFFFFFFFF
    return ((words.unsqueeze(1) >> torch.arange(32)) & 1).reshape(-1)[:vocab].bool()


def compare_with_xgrammar(model, tokenizer, schema: dict, prompt, masker: TokenMasker, params: SamplingParams, *,
                          seed: int = 0, max_new_tokens: int = 48, separators=(", ", ": ")) -> list[dict]:
    """One constrained generation with xgrammar's matcher beside it: per step, how many tokens each allows and the
    ids where they differ (the special tokens but EOS left out: xgrammar lets a string spell them; we never do).

    Raises ImportError where xgrammar is not installed (pip install --no-deps -r requirements-nodeps.txt).
    """
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    grammar = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                             separators=separators, strict_mode=True)
    matcher, bitmask = xgr.GrammarMatcher(grammar), xgr.allocate_token_bitmask(1, info.vocab_size)
    special = torch.tensor([i for i, data in enumerate(masker.tokens) if data is None and i != masker.eos_id])
    steps = []

    def compare(state, allowed, chosen):
        matcher.fill_next_token_bitmask(bitmask)
        theirs = _bitmask_to_bool(bitmask, info.vocab_size)
        theirs[special] = False
        steps.append({"state": state, "ours": int(allowed.sum()), "theirs": int(theirs.sum()), "chosen": chosen,
                      "differ": (allowed ^ theirs).nonzero().flatten().tolist()})
        matcher.accept_token(chosen)

    constrained_generate(model, tokenizer, prompt, masker, params, seed=seed, max_new_tokens=max_new_tokens,
                         on_step=compare)
    return steps


def reference_claim(steps: list[dict]):
    """C26's reference half: at every step of the generation, our allowed set equals xgrammar's, token for token."""
    if not steps:
        return claim("C26", False, "no step of a generation was compared with xgrammar's")
    differ = [s for s in steps if s["differ"]]
    first = "" if not differ else (f"; the first that differs, step {steps.index(differ[0])}: "
                                   f"{len(differ[0]['differ'])} tokens")
    evidence = (f"{len(steps) - len(differ)} of {len(steps)} steps allow exactly xgrammar's tokens (from "
                f"{min(s['ours'] for s in steps):,} to {max(s['ours'] for s in steps):,} tokens a step){first}")
    return claim("C26", not differ, evidence)
