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
    """The cases a loop-that-stops exercise runs: for each (prompt length, max new tokens), a random prompt and two
    runs, (ids, n, stop_ids, the tokens wanted, the reason wanted): one with a stop id that the model makes mid-way
    (the answer ends with it), one with stop ids the model never makes (the answer is all n tokens)."""
    g = torch.Generator().manual_seed(seed)
    for prompt_len, n in shapes:
        ids = torch.randint(3, model.cfg.vocab_size, (1, prompt_len), generator=g)
        full = reference_tokens(model, ids, n)
        stop = next((t for i, t in enumerate(full) if i >= 2 and t not in full[:i]), full[0])  # first made mid-way
        never = [t for t in range(model.cfg.vocab_size) if t not in full][:2]
        yield ids, n, {stop, never[0]}, full[:full.index(stop) + 1], "stop"
        yield ids, n, set(never), full, "length"


class Recorder:
    """The model as the learner's loop sees it: model(ids, cache=None) gives logits `[batch, seq, vocab]`.

    It records the shape fed and the cache passed at each call; a library loop (which calls model.trace) is refused.
    """

    def __init__(self, model):
        self.model, self.fed, self.caches = model, [], []

    def __call__(self, ids, cache=None):
        self.fed.append(tuple(ids.shape))
        self.caches.append(cache)
        return self.model(ids, cache)

    def new_cache(self, *args, **kwargs):
        return self.model.new_cache(*args, **kwargs)

    @property
    def cfg(self):
        return self.model.cfg

    def trace(self, *args, **kwargs):
        expect(False, "call the model itself, logits = model(ids, ...), not a library loop: the loop is the exercise.")


def as_ids(result, what: str) -> list[int]:
    """The learner's tokens as a list of ints (a tensor of any shape is flattened)."""
    if isinstance(result, torch.Tensor):
        result = result.flatten().tolist()
    expect(isinstance(result, (list, tuple)), f"return the {what} as a list of ints, not {type(result).__name__}.")
    return [int(i) for i in result]
