"""Claim C8's time (notebook 06): a greedy generation with and without the KV cache, timed call by call in turns,
with the tokens each call fed the model counted, and the speed-up held to a margin that two runs without a cache
cannot reach.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..generate.decode import Generation, greedy_calls
from .timing import time_generations_interleaved

@dataclass
class CountedRun:
    """A timed greedy generation (its tokens and each call's seconds), the tokens each call fed the model, and the
    prompt's length."""

    generation: Generation
    fed: list[int]
    prompt_tokens: int = 0

    @property
    def seconds(self) -> float:
        return sum(self.generation.step_seconds)


def _counting(model, calls, fed: list):
    """greedy_calls, each call counting the tokens that enter the model's embedding (into `fed`)."""
    while True:
        try:
            call = next(calls)
        except StopIteration as done:
            return done.value

        def counted(call=call):
            hook = model.embed_tokens.register_forward_hook(lambda m, args, out: fed.append(args[0].shape[1]))
            try:
                call()
            finally:
                hook.remove()
        yield counted


def time_cache_runs(model, prompt_ids: torch.Tensor, new_tokens: int, device=None, *,
                    uses_cache: dict | None = None) -> dict:
    """Time greedy generations of `prompt_ids` `[1, seq]` with and without the KV cache, call by call in turns
    (measure.timing.time_generations_interleaved), counting the tokens each call fed the model: {name: CountedRun}.

    uses_cache: {name: whether that run uses the cache}, by default {"with": True, "without": False}.
    """

    uses_cache = {"with": True, "without": False} if uses_cache is None else uses_cache
    fed = {name: [] for name in uses_cache}
    calls = {name: _counting(model, greedy_calls(model, prompt_ids, new_tokens, use_cache=cached), fed[name])
             for name, cached in uses_cache.items()}
    runs = time_generations_interleaved(calls, device if device is not None else prompt_ids.device)
    return {name: CountedRun(runs[name], fed[name], prompt_ids.shape[1]) for name in uses_cache}


# The speed-up a cache must show on a CPU: the time without it over the time with it, both runs timed call by call in
# turns (notebook 06: 64 new tokens after a 9-token prompt, SmolLM2-135M in fp32, torch on the cores the policy found
# free). Measured on the 2-core test machine, shared with other jobs (load average 5-8, torch on 1 thread):
# - the true world (with against without the cache): 2.82, 2.75, 2.73, 2.69, and 2.9 in the notebook under nbval;
#   with one more core burned: 2.79, 2.61, and 2.8 in the notebook (tools/busy_check.py, 1 and 2 cores burned);
# - the false world (both runs without a cache, through time_cache_runs): 0.99, 1.00, 1.02, 1.00; burned: 1.00, 0.97.
# The calls in turns keep the false world within 3% of 1. 1.5 sits 1.45x above its worst ratio and 1.7x below the true
# world's worst. On an idle machine torch gets both cores, which help the many-token passes without a cache more than
# the one-token steps: the true ratio may be lower there than on one thread; the margin leaves room for that.
MIN_CPU_SPEEDUP = 1.5


def check_cache_speedup(runs: dict, *, on_gpu: bool, min_speedup: float = MIN_CPU_SPEEDUP):
    """Claim C8 on `time_cache_runs`'s two runs, "with" and "without": the cached run fed the whole prompt once and
    then one token per call, the uncached run fed more, and, on a CPU (fp32), both chose the same tokens (a step that
    feeds one token but attends to nothing cached is fast and wrong) and the uncached run took at least `min_speedup`
    times as long (a margin that two runs without a cache, timed in turns, do not reach).

    On a GPU the time is reported, not asserted: for a model this small, a step's time there is mostly fixed costs
    (launches), with or without the cache (notebook 07 measures it); in 16 bits the two runs' tokens may part where
    two candidates tie, so notebook 05's fp32 check is the exactness evidence there.
    """
    from ..claims import claim

    with_cache, without = runs["with"], runs["without"]
    n, p = with_cache.generation.tokens.shape[1], with_cache.prompt_tokens
    one_each = p > 0 and with_cache.fed == [p] + [1] * (n - 1)
    fed_less = sum(with_cache.fed) < sum(without.fed)
    same = torch.equal(with_cache.generation.tokens.cpu(), without.generation.tokens.cpu())
    speedup = without.seconds / with_cache.seconds
    fast = on_gpu or speedup >= min_speedup
    evidence = (f"{n} tokens: {without.seconds:.2f} s without the cache ({sum(without.fed):,} tokens fed to the "
                f"model), {with_cache.seconds:.2f} s with it ({sum(with_cache.fed):,} fed: the {p}-token prompt once, "
                f"then one a step: {one_each}), the same tokens: {same}, the calls in turns: {speedup:.1f}x faster"
                + (" (on a GPU the time and the tokens are a reading, not asserted)" if on_gpu
                   else f" (asserted: at least {min_speedup:g}x)"))
    return claim("C8", one_each and fed_less and fast and (on_gpu or same), evidence)
