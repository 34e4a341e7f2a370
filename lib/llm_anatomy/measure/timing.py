"""Timing on the learner's own machine: the rules that keep a measurement honest.

- warm up first: the first call pays for memory allocation, kernel selection and caches;
- on a GPU, synchronize before reading the clock (`llm_anatomy.device.timed` does);
- repeat and take the median (`statistics.median`, the one definition the course uses): one slow run
  (another program, a page fault) must not set the figure.

TTFT and TPOT, as the course defines them (`time_generation`):
- TTFT, time to first token: the wall time of the prefill call, the whole prompt through the model and the logits
  of its last position (the first token is their argmax, taken after the clock stops: microseconds). Tokenizing,
  a server's queue and the network are not included; with repeats, the median of the runs' prefills;
- TPOT, time per output token: the median wall time of one decode step after the first token, over every step
  of every run (the median, not the mean: one stall, a page fault or another program, does not move it).

Units: seconds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..device import timed
from ..errors import CourseError
from ..generate.decode import decode_step


@dataclass
class Timing:
    """Repeated wall-clock times of one piece of work, seconds."""

    times_s: list[float]
    warmup: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def median_ms(self) -> float:
        return self.median_s * 1e3

    def __repr__(self) -> str:
        return f"Timing(median {self.median_ms:.3f} ms over {len(self.times_s)} runs, {self.warmup} warm-up)"


def time_it(fn: Callable[[], object], device: torch.device | str = "cpu", *, warmup: int = 1,
            repeats: int = 5, cuda_events: bool = False) -> Timing:
    """Time `fn()` `repeats` times after `warmup` untimed calls; the device is synchronized around each.

    cuda_events=True (CUDA only) reads the time the GPU spent between two events instead of the wall clock;
    it excludes Python's time before the first kernel starts, so it is the GPU's own time.
    """
    device = torch.device(device)
    if repeats < 1 or warmup < 0:
        raise CourseError(f"Use repeats >= 1 and warmup >= 0, not {repeats} and {warmup}.")
    for _ in range(warmup):
        fn()
    times = []
    use_events = cuda_events and device.type == "cuda"
    for _ in range(repeats):
        if use_events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            times.append(timed(fn, device)[0])
    return Timing(times, warmup)


@dataclass
class GenerationTiming:
    """TTFT and time per output token of one generation, seconds."""

    prompt_tokens: int
    new_tokens: int
    batch: int
    ttft_s: float
    tpot_s: float
    step_seconds: list[float] = field(default_factory=list)  # the last run's steps, its prefill first
    prefill_seconds: list[float] = field(default_factory=list)  # every run's prefill (their median is ttft_s)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second while decoding, all sequences of the batch together."""
        return self.batch / self.tpot_s

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.batch * self.prompt_tokens / self.ttft_s


def time_generation(model, prompt_ids: torch.Tensor, new_tokens: int = 16, warmup: bool = True,
                    repeats: int = 1) -> GenerationTiming:
    """TTFT and TPOT of greedy generation by a from-scratch model (definitions in the module docstring).

    warmup: one untimed run at this very shape first (the first call pays for allocation and kernel choice).
    repeats: timed runs; TTFT is the median of their prefills, TPOT the median of all their decode steps.
    """
    from ..generate.decode import generate_greedy

    if repeats < 1:
        raise CourseError(f"repeats must be at least 1, not {repeats}.")
    if warmup:
        generate_greedy(model, prompt_ids, 2)
    runs = [generate_greedy(model, prompt_ids, new_tokens, timed=True) for _ in range(repeats)]
    ttft = statistics.median(r.ttft_s for r in runs)
    steps = [s for r in runs for s in r.step_seconds[1:]]
    if not steps:
        raise CourseError("Time per output token needs at least 2 new tokens.")
    return GenerationTiming(prompt_ids.shape[1], new_tokens, prompt_ids.shape[0], ttft, statistics.median(steps),
                            runs[-1].step_seconds, [r.ttft_s for r in runs])


def decode_tokens_per_s(model, batch: int, context: int, repeats: int = 3) -> float:
    """Decode throughput, all rows together (tokens/s), of one step at `batch` rows of `context` cached positions.

    The cache is filled with zeros instead of a real prefill: a step's time does not depend on the values it reads,
    and a prefill of batch x context tokens would take far longer than the step we time.
    """
    cache = model.new_cache(batch, context + repeats + 2)
    cache.length = context  # as if `context` positions had been prefilled
    token = torch.zeros(batch, 1, dtype=torch.long, device=model.device)  # [batch, 1]
    with torch.inference_mode():
        seconds = time_it(lambda: decode_step(model, token, cache), model.device, warmup=1, repeats=repeats).median_s
    return batch / seconds
