"""Shared by the loop exercises (05, 06): a tiny random model whose greedy tokens vary, and a recorder around it."""

from __future__ import annotations

import functools

import torch

from . import expect


@functools.lru_cache(maxsize=1)
def tiny_model():
    """A 2-layer Llama with random weights, scaled up so that its greedy tokens vary (at the default scale it
    repeats one token, which would let a loop that never appends pass)."""
    from ..weights.random import random_llama
    from ..model.scratch import ScratchLlama

    hf = random_llama("tiny", seed=5)
    with torch.no_grad():
        for name, weight in hf.named_parameters():
            if "norm" not in name:
                weight.mul_(10)
    return ScratchLlama.from_hf(hf)


def reference_tokens(model, ids: torch.Tensor, n: int) -> list[int]:
    """The library's greedy tokens (prefill, then one token at a time) for one prompt `[1, seq]`."""
    from ..generate.decode import generate_greedy

    return generate_greedy(model, ids, n).tokens[0].tolist()


def stop_cases(model, seed: int, shapes):
    """The cases a loop-that-stops exercise runs: for each (prompt length, max new tokens), a random prompt and three
    runs, (ids, n, stop_ids, the tokens wanted, the reason wanted): one with a stop id that the model makes mid-way,
    its third token or later (the answer ends with it), one with stop ids the model never makes (the answer is all
    n tokens), and the first again with max_new_tokens ending at the stop id (its reason is still 'stop'). Every
    set also holds a token of the prompt that the model never makes, as every chat prompt holds <|im_end|>: a loop
    must look at the tokens it makes, not at the prompt."""
    g = torch.Generator().manual_seed(seed)
    for prompt_len, n in shapes:
        ids = torch.randint(3, model.cfg.vocab_size, (1, prompt_len), generator=g)
        full = reference_tokens(model, ids, n)
        stop = next((t for i, t in enumerate(full) if i >= 2 and t not in full[:i]), full[0])  # first made mid-way
        never = [t for t in range(model.cfg.vocab_size) if t not in full][:2]
        in_prompt = {t for t in ids[0].tolist() if t not in full}
        in_prompt = {min(in_prompt)} if in_prompt else set()
        yield ids, n, {stop, never[0]} | in_prompt, full[:full.index(stop) + 1], "stop"
        yield ids, n, set(never) | in_prompt, full, "length"
        yield ids, full.index(stop) + 1, {stop, never[0]} | in_prompt, full[:full.index(stop) + 1], "stop"


def stop_as_the_last_token(got: list[int], reason, want: list[int], why: str, n: int) -> str | None:
    """The message for a loop that said 'length' when the last token it was allowed was a stop id (else None)."""
    if why == "stop" and reason == "length" and got == want and len(want) == n:
        return (f"your last allowed token ({n} = max_new_tokens) is stop id {want[-1]}, and you said 'length': a stop "
                "id ends the loop with 'stop' even then, so check it before the length limit.")
    return None


def stopped_on_the_prompt(ids, got: list[int], reason, want: list[int], stop_ids) -> str | None:
    """The message for a loop that stopped because the PROMPT holds a stop id (None when that is not what happened)."""
    prompt_stops = sorted(set(ids[0].tolist()) & set(stop_ids))
    if ((reason == "stop" or got) and prompt_stops and len(got) < len(want) and got != want[:-1]
            and (not got or got[-1] not in stop_ids)):
        return (f"you stopped after {len(got)} token(s), none of them a stop id: the PROMPT holds stop id "
                f"{prompt_stops[0]} (every chat prompt holds <|im_end|>). Check only the token you just made.")
    return None


class Recorder:
    """The model as the learner's loop sees it: model(ids, cache=None) gives logits `[batch, seq, vocab]`.

    It records the shape fed and the cache passed at each call; a library loop (which calls model.trace) is refused.
    The model itself is held in a closure, not an attribute: the learner's loop cannot reach round the recording.
    """

    __slots__ = ("fed", "caches", "_forward", "new_cache", "cfg")

    def __init__(self, model):
        self.fed, self.caches = [], []
        self._forward = lambda ids, cache: model(ids, cache)
        self.new_cache = lambda *args, **kwargs: model.new_cache(*args, **kwargs)
        self.cfg = model.cfg

    def __call__(self, ids, cache=None):
        self.fed.append(tuple(ids.shape))
        self.caches.append(cache)
        return self._forward(ids, cache)

    def trace(self, *args, **kwargs):
        expect(False, "call the model itself, logits = model(ids, ...), not a library loop: the loop is the exercise.")
