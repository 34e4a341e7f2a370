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
    trie walked, nothing cached), cached (its kept mask looked up, applied to the logits).

    Measured in turns (one of each per round, the best of the rounds kept), so a busy machine slows all alike.
    """
    from .mask import naive_mask

    cache = model.new_cache(1, context + rounds + 2)
    prefill(model, torch.zeros(1, context, dtype=torch.long), cache)
    fresh = masker.for_dfa(masker.dfa)  # the same trie (no second build), a cache of its own
    for s in states:
        masker.allowed(s)  # kept: what the cached figure measures is the look-up and the masked_fill
    logits = torch.zeros(len(masker.tokens))
    best = dict.fromkeys(("naive_s", "trie_first_s", "cached_s", "decode_step_s"), float("inf"))
    for _ in range(rounds):
        naive = timed(lambda: [naive_mask(masker.dfa, masker.tokens, s, masker.eos_id) for s in states])[0]
        best["naive_s"] = min(best["naive_s"], naive / len(states))
        fresh.cache.clear()  # every state a first visit again
        first = timed(lambda: [fresh.allowed(s) for s in states])[0]
        best["trie_first_s"] = min(best["trie_first_s"], first / len(states))
        cached = timed(lambda: [logits.masked_fill(~masker.allowed(s), float("-inf")) for s in states])[0]
        best["cached_s"] = min(best["cached_s"], cached / len(states))
        with torch.inference_mode():
            step = timed(lambda: decode_step(model, torch.zeros(1, 1, dtype=torch.long), cache), model.device)[0]
        best["decode_step_s"] = min(best["decode_step_s"], step)
    return best


def mask_replay(masker: TokenMasker, answers: list[Answer]) -> dict:
    """The answers' steps replayed as an engine met them, on a masker with nothing cached: at each step the state's
    mask (computed on its first visit, looked up after) applied to the logits. What a mask costs per step with the
    first visits paid, not only the look-up.

    Returns per_step_s (first visits included), steps, hit_rate (the steps whose mask was kept) and first_visit_s
    (state -> the seconds of its first visit).
    """
    fresh = masker.for_dfa(masker.dfa)  # the same trie, an empty cache
    logits = torch.zeros(len(masker.tokens))
    first, total, steps = {}, 0.0, 0
    for answer in answers:
        for state in answer.states:
            new = state not in fresh.cache
            seconds = timed(lambda: logits.masked_fill(~fresh.allowed(state), float("-inf")))[0]  # noqa: B023
            if new:
                first[state] = seconds
            total, steps = total + seconds, steps + 1
    return {"per_step_s": total / max(steps, 1), "steps": steps, "hit_rate": 1 - len(first) / max(steps, 1),
            "first_visit_s": first}


def state_kind(dfa, state: int) -> str:
    """Where a state of a schema's DFA sits: "literal" (one byte goes on: braces, keys, separators), "number" (digits,
    a minus sign, the closing brace) or "string" (inside a string: most bytes go on)."""
    alive = {b for b in range(256) if dfa.step(state, b) != DEAD}
    if len(alive) <= 1:
        return "literal"
    return "number" if alive <= set(b"0123456789-}") else "string"


AUDIT_SAMPLE = 32  # per step, this many of the allowed tokens walked again through the automaton, byte by byte


def audit_mask(masker: TokenMasker, state: int, allowed: torch.Tensor, generator: torch.Generator) -> str | None:
    """One step's mask against the automaton it was made from: the end-of-sequence token allowed exactly where the
    state accepts, and AUDIT_SAMPLE allowed tokens drawn at random each walked whole from the state, alive (a sampled
    answer may never meet the token a buggy mask lets through; the audit looks for it). None, or what is wrong."""
    dfa, eos = masker.dfa, masker.eos_id
    accepts = state != DEAD and dfa.accepting[state]
    if bool(allowed[eos]) != accepts:
        return f"the end-of-sequence token {'allowed' if allowed[eos] else 'refused'} in a state that " \
               f"{'does not accept' if allowed[eos] else 'accepts'} (state {state})"
    ids = allowed.nonzero().flatten()
    ids = ids[ids != eos]
    for i in ids[torch.randperm(len(ids), generator=generator)[:AUDIT_SAMPLE]].tolist():
        if masker.tokens[i] is None:
            return f"the special token {i} allowed in state {state}"
        if dfa.walk(state, masker.tokens[i]) == DEAD:
            return f"token {i} ({masker.tokens[i]!r}) allowed in state {state}, where its bytes leave the pattern"
    return None


def check_c26(model, tokenizer, schema: dict, prompt, masker: TokenMasker, *, n: int = 8, seed: int = 0,
              max_new_tokens: int = 64):
    """C26's check: of `n` answers sampled at temperature 1 under the mask, all parse and validate, and every step's
    mask passes audit_mask (the mask is the grammar's, not only lucky in what was sampled).

    Returns (the claim's verdict, the answers); raises ClaimFailed when any answer does not parse or a mask is wrong.
    """
    params, steps, wrong = SamplingParams(temperature=1.0), [], []
    generator = seeded_generator(seed)

    def audit(state, allowed, chosen):
        steps.append(state)
        problem = audit_mask(masker, state, allowed, generator)
        if problem is not None:
            wrong.append(problem)

    answers = [constrained_generate(model, tokenizer, prompt, masker, params, seed=seed + i,
                                    max_new_tokens=max_new_tokens, on_step=audit) for i in range(n)]
    # an answer counts when the model ended it (EOS) and it parses and validates; one that a token took out of the
    # pattern (only a buggy mask allows such a token) ends there, unfinished: an engine would have nothing to sample
    good = [a for a in answers if a.finished and parses(a.text, schema)]
    bad = [a for a in answers if a not in good]
    first = "" if not bad else f"; the first that does not: {bad[0].text!r}" + (" (a token left the pattern)"
                                                                               if bad[0].died else "")
    audited = (f"at {len(steps) - len(wrong)} of {len(steps)} steps the mask allowed the end-of-sequence token "
               f"only where the automaton accepts and {AUDIT_SAMPLE} of its allowed tokens, drawn at random, each "
               f"walked whole through the automaton" + (f"; first wrong: {wrong[0]}" if wrong else ""))
    evidence = (f"{len(good)} of {n} answers sampled at temperature 1 under the mask end, parse and validate against "
                f"the schema{first}; {audited}")
    return claim("C26", len(good) == n and not wrong, evidence), answers


def unconstrained_answers(model, tokenizer, prompt, *, n: int = 8, seed: int = 0,
                          max_new_tokens: int = 64) -> list[Answer]:
    """`n` answers sampled at temperature 1 without a mask (the seeds check_c26 uses)."""
    params = SamplingParams(temperature=1.0)
    return [constrained_generate(model, tokenizer, prompt, None, params, seed=seed + i, max_new_tokens=max_new_tokens)
            for i in range(n)]


def why_not_parsed(answer: Answer, schema: dict) -> str | None:
    """None when the answer parses and validates; else "wrong schema" (JSON, not the schema's), "cut off" (JSON so
    far, stopped by the token budget before it could close) or "not JSON" (a byte that no JSON text has there)."""
    try:
        json.loads(answer.text)
    except ValueError as error:
        so_far = error.pos >= len(answer.text.rstrip()) or error.msg.startswith("Unterminated string")
        return "cut off" if so_far and not answer.finished else "not JSON"
    return None if parses(answer.text, schema) else "wrong schema"


def count_unconstrained_failures(model, tokenizer, schema: dict, prompt, *, n: int = 8, seed: int = 0,
                                 max_new_tokens: int = 64) -> tuple[int, list[str]]:
    """How many of `n` unconstrained answers (temperature 1, same seeds) do not parse and validate, and the texts."""
    texts = [a.text for a in unconstrained_answers(model, tokenizer, prompt, n=n, seed=seed,
                                                   max_new_tokens=max_new_tokens)]
    return sum(not parses(t, schema) for t in texts), texts
