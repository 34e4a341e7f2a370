"""Timing on the learner's own machine: the rules that keep a measurement honest, and the latencies the course names.

- warm up first: the first call pays for memory allocation, kernel selection and caches;
- on a CPU, give torch only the cores that are free (device.use_cpu_threads, re-measured here before each timed
  comparison): a thread whose core another program holds makes every operation wait for it;
- on a GPU, synchronize before reading the clock (`llm_anatomy.device.timed`, the one clock, does);
- repeat, and take the median or the minimum (one slow run, a page fault or another program, must not set the
  figure); when several candidates are compared, interleave them (`time_interleaved`: A, B, C, A, B, C, ...), so
  that a busy moment slows all of them alike instead of the one that happened to run then;
- say how far the repeats disagree (`Timing.spread`) and warn beside a figure whose repeats disagree by more than
  NOISY_SPREAD (`Timing.noise_warning()`): that figure is rough, whatever its digits.

The latencies, each defined once here (seconds):
- TTFT, time to first token. Of one generation (notebook 07): the prefill call, the whole prompt through the model
  and the logits of its last position (tokenizing, a queue and the network are not included). Of a served request
  (notebooks 08 and 11): from its arrival to its first token, queueing included (`time_to_first_token_s`).
  Behind an HTTP API (notebook 11) it is read in two places. Engine TTFT: from the request's arrival at the engine
  (its HTTP request read and checked, its chat template applied) to the wall-clock instant its first token came out
  of a scheduler step. Client TTFT: from the client's sending the request to the first streamed chunk with text.
  Client TTFT - engine TTFT is the server's own latency (its HTTP work, the hand-over of the token to the event loop,
  the loopback network, and the client's own work, which no server can remove).
- TPOT, time per output token, in two meanings that the course keeps apart by name:
  - `median_decode_step_s`: the median wall time of one decode step (notebook 07's TPOT, what the model costs per
    token; the median, so one stall does not move it);
  - `mean_token_gap_s`: one served request's (last token - first token) / (tokens - 1), the mean gap between its
    later tokens (notebook 08's TPOT, what a user sees; it includes the steps spent on other requests' prompts).
- ITL, inter-token latency: every gap between two consecutive tokens of a request (`inter_token_gaps_s`); their mean
  is that request's mean_token_gap_s, their worst is the stall a user notices.
- end-to-end latency: from a request's arrival to its last token (`end_to_end_s`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..device import recheck_cpu_threads, timed
from ..errors import CourseError
from ..generate.decode import decode_step

NOISY_SPREAD = 0.3  # repeats whose middle half spans more than 30% of their median: the figure is rough


@dataclass
class Timing:
    """Repeated wall-clock times of one piece of work, seconds."""

    times_s: list[float]
    warmup: int
    threads: int | None = None  # torch's CPU threads while it ran (None: not a CPU timing)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def max_s(self) -> float:
        return max(self.times_s)

    @property
    def median_ms(self) -> float:
        return self.median_s * 1e3

    @property
    def spread(self) -> float:
        """How far the repeats disagree: the interquartile range over the median (0.3 = the middle half of the
        repeats spans 30% of the median). One stall among many repeats does not move it; a busy machine does.
        NaN for a single repeat (nothing to compare with)."""
        if len(self.times_s) < 2:
            return math.nan
        q1, _, q3 = statistics.quantiles(self.times_s, n=4, method="inclusive")
        median = self.median_s
        return (q3 - q1) / median if median > 0 else 0.0

    @property
    def noisy(self) -> bool:
        """Whether the spread passes NOISY_SPREAD (False when it cannot be told: one repeat)."""
        return self.spread > NOISY_SPREAD

    def noise_warning(self) -> str:
        """'' when the repeats agree, else a sentence to print beside the figure."""
        if not self.noisy:
            return ""
        return (f"warning: the repeats spread by {self.spread:.0%} (more than {NOISY_SPREAD:.0%}): the machine was "
                "busy, so this figure is rough; run it again when it is idle")

    def __repr__(self) -> str:
        spread = "" if math.isnan(self.spread) else f", spread {self.spread:.0%}"
        threads = "" if self.threads is None else f", {self.threads} thread{'s' if self.threads > 1 else ''}"
        return (f"Timing(median {self.median_ms:.3f} ms, min {self.min_s * 1e3:.3f} ms over {len(self.times_s)} runs"
                f"{spread}, {self.warmup} warm-up{threads})")


def _once(fn: Callable[[], object], device: torch.device, cuda_events: bool) -> float:
    """Seconds of one call: device.timed's wall clock, or (cuda_events) the GPU's own time between two events."""
    if not cuda_events:
        return timed(fn, device)[0]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def time_interleaved(candidates: dict[str, Callable[[], object]], device: torch.device | str = "cpu", *,
                     warmup: int = 1, repeats: int = 5, cuda_events: bool = False) -> dict[str, Timing]:
    """Time every candidate `repeats` times, in rounds (A, B, C, A, B, C, ...), after `warmup` untimed rounds.

    Interleaving makes a busy moment of the machine hit every candidate alike, so that their ratio holds even when
    their absolute times do not. Returns {name: Timing} in the order given.
    cuda_events=True (CUDA only) reads the time the GPU spent between two events instead of the wall clock; it
    excludes Python's time before the first kernel starts, so it is the GPU's own time.
    """
    device = torch.device(device)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1 or warmup < 0:
        raise CourseError(f"Use repeats >= 1 and warmup >= 0, not {repeats} and {warmup}.")
    if not candidates or not all(callable(fn) for fn in candidates.values()):
        raise CourseError("Give the work to time as {name: function taking no argument}, at least one.")
    threads = None
    if device.type == "cpu":
        recheck_cpu_threads()  # the cores free now (the policy's choice, unless the threads were pinned)
        threads = torch.get_num_threads()
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    use_events = cuda_events and device.type == "cuda"
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            times[name].append(_once(fn, device, use_events))
    return {name: Timing(seconds, warmup, threads) for name, seconds in times.items()}


def time_it(fn: Callable[[], object], device: torch.device | str = "cpu", *, warmup: int = 1,
            repeats: int = 5, cuda_events: bool = False) -> Timing:
    """Time `fn()` `repeats` times after `warmup` untimed calls; the device is synchronized around each.

    The one-candidate case of `time_interleaved` (see there for cuda_events)."""
    return time_interleaved({"fn": fn}, device, warmup=warmup, repeats=repeats, cuda_events=cuda_events)["fn"]


# --------------------------------------------------------------------------- the latencies (module docstring)


def median_decode_step_s(step_seconds) -> float:
    """TPOT of a timed generation: the median of its decode steps' seconds (the prefill not among them)."""
    steps = list(step_seconds)
    if not steps:
        raise CourseError("Time per output token needs at least one decode step: generate at least 2 new tokens.")
    return statistics.median(steps)


def _token_times(token_times) -> list[float]:
    times = list(token_times)
    if not times:
        raise CourseError("This request has produced no token yet: serve it first.")
    return times


def time_to_first_token_s(arrival_s: float, token_times) -> float:
    """TTFT of a served request: from its arrival to its first token (queueing included), seconds."""
    return _token_times(token_times)[0] - arrival_s


def inter_token_gaps_s(token_times) -> list[float]:
    """ITL: the gap before each of a request's tokens after the first, seconds ([] for a one-token answer)."""
    times = _token_times(token_times)
    return [b - a for a, b in zip(times, times[1:])]


def mean_token_gap_s(token_times) -> float:
    """TPOT of a served request: (last token - first token) / (tokens - 1), seconds; 0 for a one-token answer."""
    times = _token_times(token_times)
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0


def end_to_end_s(arrival_s: float, token_times) -> float:
    """End-to-end latency of a served request: from its arrival to its last token, seconds."""
    return _token_times(token_times)[-1] - arrival_s


def met_objectives(ttft_s: float, tpot_s: float, ttft_slo_s: float | None = None,
                   tpot_slo_s: float | None = None) -> bool:
    """Whether a request met both latency objectives (DistServe's SLOs): TTFT <= ttft_slo_s and TPOT <= tpot_slo_s.
    A None objective is always met, and so is the TPOT of an answer of one token (it has none: 0 or NaN).

    The one test behind both goodputs the course reports: vLLM's `bench serve` "request goodput" (requests per second
    of one run that met both: serve/metrics.serving_metrics, server/client.summarize) and DistServe's goodput (the
    highest arrival rate at which at least 90% of requests meet both: serve/load.goodput_rate)."""
    ttft_ok = ttft_slo_s is None or ttft_s <= ttft_slo_s
    tpot_ok = tpot_slo_s is None or math.isnan(tpot_s) or tpot_s <= tpot_slo_s
    return ttft_ok and tpot_ok


@dataclass
class GenerationTiming:
    """TTFT and time per output token (the median decode step) of one generation, seconds."""

    prompt_tokens: int
    new_tokens: int
    batch: int
    ttft_s: float
    tpot_s: float  # median_decode_step_s over every decode step of every run
    step_seconds: list[float] = field(default_factory=list)  # the last run's steps, its prefill first
    prefill_seconds: list[float] = field(default_factory=list)  # every run's prefill (their median is ttft_s)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second while decoding, all sequences of the batch together."""
        return self.batch / self.tpot_s

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.batch * self.prompt_tokens / self.ttft_s


def time_generations_interleaved(generations: dict, device: torch.device | str = "cpu") -> dict:
    """Run several greedy generations (generate.decode.greedy_calls) one model call of each in turns, timing every
    call: {name: Generation with its step_seconds}. A busy moment of the machine then slows every one alike, so
    their ratio holds even when their times do not (the rule of time_interleaved, call by call)."""
    from ..generate.decode import Generation

    device = torch.device(device)
    if device.type == "cpu":
        recheck_cpu_threads()
    seconds: dict = {name: [] for name in generations}
    tokens: dict = {}
    running = dict(generations)
    while running:
        for name, calls in list(running.items()):
            try:
                call = next(calls)
            except StopIteration as done:
                tokens[name] = done.value
                del running[name]
                continue
            seconds[name].append(timed(call, device)[0])
    return {name: Generation(tokens[name], seconds[name]) for name in generations}


def time_generations(model, prompts: dict, new_tokens: int = 16, warmup: bool = True, repeats: int = 1) -> dict:
    """TTFT and TPOT of greedy generation by a from-scratch model for every prompt `[batch, seq]` of `prompts`
    ({name: ids}): {name: GenerationTiming} (definitions in the module docstring).

    warmup: one untimed run of each prompt first (the first call pays for allocation and kernel choice).
    repeats: rounds; in each, the prompts' generations run call by call in turns (time_generations_interleaved).
    TTFT is the median of a prompt's prefills, TPOT the median of all its decode steps.
    """
    from ..generate.decode import generate_greedy, greedy_calls

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise CourseError(f"repeats must be at least 1, not {repeats}.")
    if new_tokens < 2:
        raise CourseError("Time per output token needs at least 2 new tokens.")
    if warmup:
        for ids in prompts.values():
            generate_greedy(model, ids, 2)
    device = next(iter(prompts.values())).device
    rounds = [time_generations_interleaved({name: greedy_calls(model, ids, new_tokens) for name, ids in prompts.items()},
                                           device) for _ in range(repeats)]
    timings = {}
    for name, ids in prompts.items():
        runs = [r[name] for r in rounds]
        prefills = [run.step_seconds[0] for run in runs]
        tpot = median_decode_step_s(s for run in runs for s in run.step_seconds[1:])
        timings[name] = GenerationTiming(ids.shape[1], new_tokens, ids.shape[0], statistics.median(prefills), tpot,
                                         runs[-1].step_seconds, prefills)
    return timings


def time_generation(model, prompt_ids: torch.Tensor, new_tokens: int = 16, warmup: bool = True,
                    repeats: int = 1) -> GenerationTiming:
    """TTFT and TPOT of greedy generation of one prompt `[batch, seq]`: the one-prompt case of time_generations."""
    return time_generations(model, {"prompt": prompt_ids}, new_tokens, warmup, repeats)["prompt"]


def decode_step_times(model, shapes, repeats: int = 3) -> dict:
    """One decode step at each (batch, context) of `shapes`, all timed in turns (time_interleaved, after a warm-up
    round): {(batch, context): Timing}. One cache per batch, of the largest context asked for it, its length set
    before each step to `context`, as if that many positions had been prefilled: a step's time does not depend on the
    values it reads, and a prefill of batch x context tokens would take far longer than the step we time."""
    shapes = list(dict.fromkeys(shapes))
    caches = {b: model.new_cache(b, max(c for bb, c in shapes if bb == b) + 1) for b, _ in shapes}
    tokens = {b: torch.zeros(b, 1, dtype=torch.long, device=model.device) for b in caches}  # [batch, 1]

    def step(batch, context):
        caches[batch].length = context
        decode_step(model, tokens[batch], caches[batch])

    with torch.inference_mode():
        return time_interleaved({shape: (lambda shape=shape: step(*shape)) for shape in shapes}, model.device,
                                warmup=1, repeats=repeats)


def decode_tokens_per_s(model, batch: int, context: int, repeats: int = 3) -> float:
    """Decode throughput, all rows together (tokens/s), of one step at `batch` rows of `context` cached positions:
    batch over the median of `repeats` steps (decode_step_times)."""
    return batch / decode_step_times(model, [(batch, context)], repeats)[(batch, context)].median_s
