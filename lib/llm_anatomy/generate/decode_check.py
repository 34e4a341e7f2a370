"""Claim C8, checked call by call: what a greedy generation fed the model and scored at each step (notebook 05).

Decode makes one token at a time, feeding only the newest token and appending its K and V. A peaked prompt ("the
capital of France") cannot tell a wrong decode step from a right one by its tokens: the logits can, on any prompt.
trace_greedy records a generation through hooks on the model's embedding and LM head; check_decode holds it to a
full pass without a cache (transformers'), step by step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import CourseError
from ..model.kv_cache import KVCacheInterface
from .decode import greedy_calls

@dataclass
class DecodeTrace:
    """What a greedy generation of one prompt `[1, seq]` did, call by call (trace_greedy).

    tokens: `[new_tokens]` the ids it chose. logits: `[new_tokens, vocab]` in fp32, the scores of the last position of
    each model call (call 0 is the prefill). fed: the tokens each call gave the model, counted where they enter it
    (its embedding). cache_lengths: the positions the cache held after each call (empty without a cache).
    """

    prompt_tokens: int
    tokens: torch.Tensor
    logits: torch.Tensor
    fed: list[int]
    cache_lengths: list[int]


def trace_greedy(model, prompt_ids: torch.Tensor, new_tokens: int, *, use_cache: bool = True,
                 cache: KVCacheInterface | None = None) -> DecodeTrace:
    """Run `greedy_calls` (the course's loop) on one prompt `[1, seq]` and record what each call fed and scored.

    The tokens fed are counted by a hook on the model's embedding, and the logits read by a hook on its LM head, so
    the record is what the model saw, whatever the loop meant to give it. cache: the cache to decode with (default a
    new one); use_cache=False runs the whole sequence again at every call (what a model without a cache does).
    """
    if prompt_ids.dim() != 2 or prompt_ids.shape[0] != 1:
        raise CourseError(f"trace_greedy follows one prompt, [1, seq], not {tuple(prompt_ids.shape)}.")
    if use_cache and cache is None:
        cache = model.new_cache(1, prompt_ids.shape[1] + new_tokens)
    fed, scores, lengths = [], [], []
    hooks = [model.embed_tokens.register_forward_hook(lambda m, args, out: fed.append(args[0].shape[1])),
             model.lm_head.register_forward_hook(lambda m, args, out: scores.append(out[0, -1].float().clone()))]
    try:
        calls = greedy_calls(model, prompt_ids, new_tokens, use_cache=use_cache, cache=cache)
        while True:
            try:
                call = next(calls)
            except StopIteration as done:
                tokens = done.value[0]
                break
            call()
            if use_cache:
                lengths.append(cache.length)
    finally:
        for hook in hooks:
            hook.remove()
    return DecodeTrace(prompt_ids.shape[1], tokens, torch.stack(scores), fed, lengths)


@torch.inference_mode()
def full_pass_logits(reference, prompt_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The logits a model without a cache gives at every step of a generation, `[new_tokens, vocab]` in fp32: one
    pass over the prompt and the tokens chosen (the last one is never fed), keeping the positions that predict them.

    reference: a transformers causal LM (or the course's LoadedModel), which knows nothing of our cache.
    """
    from ..weights.load import transformers_model

    model = transformers_model(reference)
    ids = torch.cat([prompt_ids, tokens[None, :-1].to(prompt_ids.device)], dim=1)  # [1, prompt + new - 1]
    logits = model(ids, attention_mask=torch.ones_like(ids), use_cache=False).logits  # [1, seq, vocab]
    return logits[0, prompt_ids.shape[1] - 1:].float()


DECODE_ATOL = 1e-4  # fp32 logits (scale ~36 on the real model): measured 5.1e-5 from transformers' full pass at worst
# over 32 steps of a 53-token prompt; a decode step whose RoPE positions are shifted by +1 moves them by 1.8 to 6.5
# (+3: 3.3 to 18; +8: 5.7 to 35) from the first shifted step on, whatever tokens it then picks.


def check_decode(trace: DecodeTrace, reference_logits: torch.Tensor, *, atol: float = DECODE_ATOL):
    """Claim C8 on a traced generation: the prefill fed the prompt once, every later call fed one token and the cache
    grew by one position, and at every step the logits equal those of a full pass without a cache (within `atol`, in
    fp32) and the tokens are their argmax. Returns the claim's verdict; raises ClaimFailed otherwise.

    A peaked prompt ("the capital of France") cannot tell a wrong decode step from a right one by its tokens: the
    logits can, on any prompt.
    """
    from ..claims import claim

    n, p = trace.tokens.shape[0], trace.prompt_tokens
    diff = (trace.logits.cpu() - reference_logits.float().cpu()).abs().amax(-1)  # [new] worst logit of each step
    same_shape = reference_logits.shape == trace.logits.shape
    expected_fed = [p] + [1] * (n - 1)
    expected_lengths = [p + i for i in range(n)]
    close = same_shape and bool((diff <= atol).all())
    argmax = same_shape and torch.equal(reference_logits.argmax(-1).cpu(), trace.tokens.cpu())
    worst = int(diff.argmax()) if same_shape else -1
    evidence = (f"{n} greedy steps after a {p}-token prompt, fp32: tokens fed per call {_runs(trace.fed)} "
                f"(the prompt once, then 1 a step: {trace.fed == expected_fed}); cache length {p} to "
                f"{trace.cache_lengths[-1] if trace.cache_lengths else 'none'}, one more each step "
                f"({trace.cache_lengths == expected_lengths}); logits against a full pass without a cache: at most "
                f"{float(diff.max()) if same_shape else float('nan'):.1e} (step {worst}), within {atol:g}: {close}; "
                f"tokens are its argmax: {argmax}")
    return claim("C8", trace.fed == expected_fed and trace.cache_lengths == expected_lengths and close and argmax,
                 evidence)


def _runs(counts: list[int]) -> str:
    """[53, 1, 1, 1] as '53, 1 x 3': a list of counts, short."""
    parts, i = [], 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(str(counts[i]) if j - i == 1 else f"{counts[i]} x {j - i}")
        i = j
    return ", ".join(parts)


