"""Constrained generation: the logits masked to the tokens the DFA state allows, then the course's sampler.

    masker = TokenMasker.for_tokenizer(compile_pattern(schema_pattern(schema)), tokenizer)
    answer = constrained_generate(model, tokenizer, prompt, masker, SamplingParams(temperature=1.0), seed=0)
    json.loads(answer.text)

The mask goes on before sampling (a -inf logit has probability 0 at any temperature), and the state advances by the
chosen token's bytes. The answer ends at EOS, which the mask allows only where the state accepts; where the state
accepts and nothing else is allowed, EOS is the only choice. check_c26 is the claim's check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from ..claims import claim
from ..device import timed
from ..generate.decode import decode_step, prefill
from ..generate.sampling import SamplingParams, sample_next, seeded_generator
from .automaton import DEAD
from .mask import TokenMasker


@dataclass
class Answer:
    """One generation: its token ids and text, the DFA state before each token, whether it finished (EOS)."""

    ids: list[int]
    text: str
    states: list[int] = field(default_factory=list)
    finished: bool = False
    died: bool = False  # a chosen token left the pattern (only a buggy mask lets one through)


def _prompt_ids(tokenizer, prompt) -> torch.Tensor:
    ids = tokenizer(prompt, return_tensors="pt").input_ids if isinstance(prompt, str) else torch.as_tensor(prompt)
    return ids if ids.dim() == 2 else ids.unsqueeze(0)


@torch.inference_mode()
def constrained_generate(model, tokenizer, prompt, masker: TokenMasker | None, params: SamplingParams, *,
                         seed: int = 0, max_new_tokens: int = 64, on_step=None) -> Answer:
    """Decode one answer to `prompt` (a str or ids); masker None decodes unconstrained (stops at EOS only).

    on_step(state, allowed, chosen): called before each token is fed, for the tests that compare masks.
    """
    ids = _prompt_ids(tokenizer, prompt)
    cache = model.new_cache(1, ids.shape[1] + max_new_tokens + 1)
    generator = None if params.greedy else seeded_generator(seed)
    logits = prefill(model, ids, cache).logits[0, -1]
    eos = tokenizer.eos_token_id
    state = masker.dfa.start if masker is not None else 0
    out, states, finished, died = [], [], False, False
    for _ in range(max_new_tokens):
        allowed = None
        if masker is not None:
            allowed = masker.allowed(state)
            logits = logits.masked_fill(~allowed, float("-inf"))
        chosen = int(sample_next(logits, params, generator)[0])
        if on_step is not None:
            on_step(state, allowed, chosen)
        states.append(state)
        if chosen == eos:
            finished = True
            break
        out.append(chosen)
        if masker is not None:
            state = masker.advance(state, chosen)
            if state == DEAD:
                died = True
                break
        logits = decode_step(model, torch.tensor([[chosen]]), cache).logits[0, -1]
    return Answer(out, tokenizer.decode(out), states, finished, died)


def parses(text: str, schema: dict) -> bool:
    """Does `text` parse as JSON and validate against `schema` (jsonschema)?"""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def mask_timing(model, masker: TokenMasker, states: list[int], *, rounds: int = 3, context: int = 32) -> dict:
    """Seconds per mask against a decode step: naive (every token walked), trie_first (a state's first visit: the
    trie walked), cached (its mask looked up, applied to the logits).

    Measured in turns (one of each per round, the best of the rounds kept), so a busy machine slows all alike.
    """
    from .mask import naive_mask

    cache = model.new_cache(1, context + rounds + 2)
    prefill(model, torch.zeros(1, context, dtype=torch.long), cache)
    fresh = TokenMasker(masker.dfa, masker.tokens, masker.eos_id, masker.mode)  # its trie built, no mask cached yet
    # the trie walked once per state: what the first visit to a state costs
    first = timed(lambda: [fresh.allowed(s) for s in states])[0] / len(states)
    for s in states:
        masker.allowed(s)  # precomputed: what the cached figure measures is the look-up and the masked_fill
    logits = torch.zeros(len(masker.tokens))
    best = {"naive_s": float("inf"), "cached_s": float("inf"), "decode_step_s": float("inf")}
    for _ in range(rounds):
        naive = timed(lambda: [naive_mask(masker.dfa, masker.tokens, s, masker.eos_id) for s in states])[0]
        best["naive_s"] = min(best["naive_s"], naive / len(states))
        cached = timed(lambda: [logits.masked_fill(~masker.allowed(s), float("-inf")) for s in states])[0]
        best["cached_s"] = min(best["cached_s"], cached / len(states))
        with torch.inference_mode():
            step = timed(lambda: decode_step(model, torch.zeros(1, 1, dtype=torch.long), cache), model.device)[0]
        best["decode_step_s"] = min(best["decode_step_s"], step)
    best["trie_first_s"] = first
    return best


def check_c26(model, tokenizer, schema: dict, prompt, masker: TokenMasker, *, n: int = 8, seed: int = 0,
              max_new_tokens: int = 64):
    """C26's check: of `n` answers sampled at temperature 1 under the mask, all parse and validate.

    Returns (the claim's verdict, the answers); raises ClaimFailed when any answer does not parse.
    """
    params = SamplingParams(temperature=1.0)
    answers = [constrained_generate(model, tokenizer, prompt, masker, params, seed=seed + i,
                                    max_new_tokens=max_new_tokens) for i in range(n)]
    # an answer counts when the model ended it (EOS) and it parses and validates; one that a token took out of the
    # pattern (only a buggy mask allows such a token) ends there, unfinished: an engine would have nothing to sample
    good = [a for a in answers if a.finished and parses(a.text, schema)]
    bad = [a for a in answers if a not in good]
    first = "" if not bad else f"; the first that does not: {bad[0].text!r}" + (" (a token left the pattern)"
                                                                               if bad[0].died else "")
    evidence = (f"{len(good)} of {n} answers sampled at temperature 1 under the mask end, parse and validate against "
                f"the schema{first}")
    return claim("C26", len(good) == n, evidence), answers


def count_unconstrained_failures(model, tokenizer, schema: dict, prompt, *, n: int = 8, seed: int = 0,
                                 max_new_tokens: int = 64) -> tuple[int, list[str]]:
    """How many of `n` unconstrained answers (temperature 1, same seeds) do not parse and validate, and the texts."""
    params = SamplingParams(temperature=1.0)
    texts = [constrained_generate(model, tokenizer, prompt, None, params, seed=seed + i,
                                  max_new_tokens=max_new_tokens).text for i in range(n)]
    return sum(not parses(t, schema) for t in texts), texts
