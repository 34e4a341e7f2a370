"""Serving requests in batches: a request and its clock, and static batching (claims C13, C15).

A server runs many users' requests through one model. A `Request` holds a prompt, how many tokens to write, when
it arrived, and, once served, its output and the time each token came out (TTFT, TPOT, ITL and end-to-end latency
follow from those, as measure/timing.py defines them).

Static (request-level) batching serves a batch the way `generate` does: take up to `max_batch` waiting requests,
left-pad their prompts into one rectangle, prefill it, then decode until the longest is done; each row's token is
chosen by its request's own params (sampler.py), as the continuous scheduler chooses it. One decode step reads
the weights once for every row, which is why batching pays (C13). But a request that is done early keeps its row,
computing for nobody, and one that arrives meanwhile waits for the whole batch: continuous batching
(scheduler.py) fixes both (C15).

The clock: every model call (Engine.call) is timed with device.timed and the engine's clock `now` advances by its
seconds; when nothing runs it jumps to the next arrival. `cost(tokens, rows, context=..., kind=...)` replaces the
measurement by a formula (cost.StepCost, calibrated from measured step times), so that tests and pictures follow a
schedule that does not depend on how busy the machine is.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..device import timed
from ..errors import CourseError
from ..generate.decode import decode_step, extend_mask, left_pad, padding_mask, prefill
from ..generate.sampling import GREEDY, SamplingParams
from ..generate.stops import finish_reason
from ..measure.timing import end_to_end_s, inter_token_gaps_s, mean_token_gap_s, time_to_first_token_s
from .sampler import sample


@dataclass(eq=False)
class Request:
    """One user's request: what was asked, and what happened to it. Times are seconds on the scheduler's clock.

    The scheduler's own state while it serves a request (its slot, its block table, the positions computed) lives in
    the scheduler's record of it (scheduler.Admission), not here: a request is what a user sees of it.

    `params` (generate/sampling.SamplingParams) is the one truth of how its tokens are picked and when it stops:
    max_new_tokens, when given, becomes params.max_tokens, and eos_token_id, when given, joins params.stop_token_ids;
    the properties `max_new_tokens` and `eos_token_id` read them back.
    """

    prompt: list[int]
    max_new_tokens: dataclasses.InitVar[int | None] = None  # None: params.max_tokens
    arrival_s: float = 0.0
    eos_token_id: dataclasses.InitVar[int | None] = None  # stop early on this token too
    id: int = -1  # set when submitted
    output: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # when each output token came out
    admitted_s: float | None = None  # when it first joined a batch
    finished_s: float | None = None
    released_s: float | None = None  # when its slot was free again (static batching: when the whole batch ended)
    preempted: int = 0  # times its blocks were taken back (it is then recomputed, keeping its output)
    cached: int = 0  # prompt positions its last admission found in the prefix cache (no prefill for them)
    spans: list = field(default_factory=list, repr=False)  # (slot, start, end): each stay in a row of the batch
    # how its tokens are picked and when it stops (notebook 11; the default is notebook 08's greedy request)
    params: SamplingParams = GREEDY
    generator: torch.Generator | None = field(default=None, repr=False)  # made from params.seed at its first draw
    logprobs: list = field(default_factory=list, repr=False)  # per output token: (logprob, [(id, logprob), ...])
    cancelled: bool = False  # ContinuousScheduler.cancel took it out before it was done
    error: str | None = None  # why it ended with an error (a step that ran it failed: ContinuousScheduler.fail)
    # a grammar on its tokens (server/structured.RowMask: .apply(logits) before each draw, .advance(token) after), or
    # None; its state is this request's own (the API's response_format)
    constraint: object = field(default=None, repr=False)

    def __post_init__(self, max_new_tokens, eos_token_id):
        if isinstance(self.prompt, torch.Tensor):
            self.prompt = self.prompt.flatten().tolist()
        if not isinstance(self.prompt, (list, tuple)) or not self.prompt:
            raise CourseError("The prompt is empty: a request needs at least one token id.")
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0 for t in self.prompt):
            raise CourseError("A prompt is a list of token ids, whole numbers >= 0.")
        self.prompt = [int(t) for t in self.prompt]
        n = max_new_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise CourseError(f"max_new_tokens must be a whole number, at least 1, not {n!r}.")
        eos = eos_token_id
        if eos is not None and (isinstance(eos, bool) or not isinstance(eos, numbers.Integral) or eos < 0):
            raise CourseError(f"eos_token_id must be a token id (a whole number >= 0) or None, not {eos!r}.")
        if not (isinstance(self.arrival_s, (int, float)) and math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise CourseError(f"arrival_s must be a time in seconds, 0 or more, not {self.arrival_s!r}.")
        if not isinstance(self.params, SamplingParams):
            raise CourseError(f"params must be a SamplingParams(temperature=..., seed=...), not {self.params!r}.")
        changes = {}
        if n is not None:
            changes["max_tokens"] = n
        if eos is not None and int(eos) not in self.params.stop_token_ids:
            changes["stop_token_ids"] = self.params.stop_token_ids + (int(eos),)
        if changes:
            self.params = dataclasses.replace(self.params, **changes)
        self._eos = None if eos is None else int(eos)

    def fresh(self) -> "Request":
        """A copy with nothing recorded yet (the same params, its constraint back at its start), to serve it again."""
        return Request(list(self.prompt), None, self.arrival_s, self._eos, self.id, params=self.params,
                       constraint=None if self.constraint is None else self.constraint.fresh())

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def finish_reason(self) -> str | None:
        """Why it is finished, by generate/stops.finish_reason on its params: "stop" (a stop token), "length"
        (max_tokens reached), or None. A cancelled request's reason is the scheduler's business."""
        return finish_reason(self.params, self.output)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def ttft_s(self) -> float:
        """Time to first token: from arrival to the first output token (queueing included), seconds."""
        return time_to_first_token_s(self.arrival_s, self.token_times)

    @property
    def mean_token_gap_s(self) -> float:
        """This request's TPOT: the mean gap between its output tokens, seconds (0 for one token)."""
        return mean_token_gap_s(self.token_times)

    @property
    def inter_token_gaps_s(self) -> list[float]:
        """ITL: the gap before each output token after the first, seconds."""
        return inter_token_gaps_s(self.token_times)

    @property
    def end_to_end_s(self) -> float:
        """From arrival to the last output token, seconds."""
        return end_to_end_s(self.arrival_s, self.token_times)


def _max_new_tokens(request: Request) -> int:
    """At most this many output tokens: params.max_tokens."""
    return request.params.max_tokens


def _set_max_new_tokens(request: Request, n: int) -> None:
    request.params = dataclasses.replace(request.params, max_tokens=n)  # checked: CourseError if not a count


# Readers keep `request.max_new_tokens` and `request.eos_token_id`, read from params. They are set here, after the
# dataclass took the InitVars of the same names for its __init__ (a property in the class body would be their default).
Request.max_new_tokens = property(_max_new_tokens, _set_max_new_tokens)
Request.eos_token_id = property(lambda request: request._eos,
                                doc="The end-of-sequence id it was given (one of params.stop_token_ids), or None.")


class Call(NamedTuple):
    """One model call of an engine: when it ran on the engine's clock (s), what it was, and its size."""

    start_s: float
    end_s: float
    kind: str  # "prefill", "decode", or "mixed" (one flattened call of both: ContinuousScheduler(flatten=True))
    rows: int  # sequences in the call
    tokens: int  # new tokens computed, padding included
    context: int  # cached positions its rows read, all rows together
    measured_s: float  # its wall time as measured, even when a cost model set the clock


class Engine:
    """What both schedulers share: the model, the clock, the requests and how their times are recorded."""

    def __init__(self, model, max_batch: int, cost=None, clock=None, keep_log: int | None = None):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise CourseError(f"max_batch must be a whole number of sequences, at least 1, not {max_batch!r}.")
        self.model, self.max_batch, self.cost, self.clock = model, max_batch, cost, clock
        self.now = 0.0  # seconds on the scheduler's clock
        self.calls: deque[Call] = deque(maxlen=keep_log)  # every model call, in order (the last keep_log of them)

    def call(self, kind: str, rows: int, tokens: int, fn, context: int = 0):
        """Run one model call (`kind` "prefill", "decode" or "mixed", `rows` sequences, `tokens` new tokens in all,
        `context` cached positions read); the clock advances by its measured time, or by cost(tokens, rows,
        context=context, kind=kind) when the engine has a cost model. Returns what `fn` returns."""
        measured, out = timed(fn, self.model.device)
        seconds = measured if self.cost is None else float(self.cost(tokens, rows, context=context, kind=kind))
        self.calls.append(Call(self.now, self.now + seconds, kind, rows, tokens, context, measured))
        self.now += seconds
        return out

    def emit(self, request: Request, token: int) -> None:
        """`token` comes out of `request` now (and the request is finished if that was its last). With a clock (a
        server's wall clock, seconds), now is moved on to it first: the time between the model calls counts too."""
        if self.clock is not None:
            self.now = max(self.now, self.clock())
        request.output.append(int(token))
        request.token_times.append(self.now)
        if request.done:
            request.finished_s = self.now

    def leave(self, request: Request, slot: int, since_s: float, retired: bool) -> None:
        """`request` leaves batch row `slot`, which it held since `since_s`: retired (done), or preempted."""
        request.spans.append((slot, since_s, self.now))
        if retired:
            request.released_s = self.now

    def check(self, request: Request, capacity: int | None = None) -> None:
        """Refuse, with one clear sentence, a request this engine cannot serve (`capacity`: the KV pool's positions)."""
        if not isinstance(request, Request):
            raise CourseError(f"Submit a Request(prompt=[ids], max_new_tokens=n), not {type(request).__name__}.")
        cfg, total = self.model.cfg, len(request.prompt) + request.max_new_tokens
        if max(request.prompt) >= cfg.vocab_size:
            raise CourseError(f"Token ids must be below the vocabulary size {cfg.vocab_size}.")
        if total > cfg.max_position_embeddings:
            raise CourseError(f"{len(request.prompt)} prompt + {request.max_new_tokens} new tokens exceed the model's "
                              f"context of {cfg.max_position_embeddings}.")
        if capacity is not None and total > capacity:
            raise CourseError(f"This request needs {total} positions, more than the whole KV pool holds ({capacity}): "
                              "shorten it or make a pool with more blocks.")


def run_static(model, requests, max_batch: int = 8, cost=None, calls: list | None = None) -> list[Request]:
    """Request-level batching (see the module text); returns fresh copies of `requests` with outputs and times.
    calls: a list that receives every model call made (Call), as Engine.calls holds them."""
    engine = Engine(model, max_batch, cost)
    for r in requests:  # every request is checked before any is served
        engine.check(r)
    reqs = [r.fresh() for r in requests]
    for i, r in enumerate(reqs):
        r.id = i
    queue, device = deque(sorted(reqs, key=lambda r: r.arrival_s)), model.device
    while queue:
        engine.now = max(engine.now, queue[0].arrival_s)  # idle until the next arrival
        batch = []
        while queue and len(batch) < max_batch and queue[0].arrival_s <= engine.now:
            batch.append(queue.popleft())
        longest, steps = max(len(r.prompt) for r in batch), max(r.max_new_tokens for r in batch)
        ids, mask = left_pad([r.prompt for r in batch], device=device)  # [rows, longest] each
        cache = model.new_cache(len(batch), longest + steps)
        start = engine.now
        for r in batch:
            r.admitted_s = start
        out = engine.call("prefill", len(batch), len(batch) * longest,
                          lambda: prefill(model, ids, cache, attention_mask=mask))
        mask = padding_mask(mask)  # the padding, hidden at every step (None: there is none)
        for step in range(steps):
            if step:  # every row reads the whole padded rectangle so far
                mask = extend_mask(mask)  # [rows, longest + step]
                out = engine.call("decode", len(batch), len(batch),
                                  lambda: decode_step(model, nxt, cache, attention_mask=mask),
                                  context=len(batch) * (longest + step))
            logits = out.logits[:, -1]  # [rows, vocab]
            tokens = []
            for i, r in enumerate(batch):
                if r.done:  # a done row keeps computing (its slot is not given back until the batch ends): fed
                    tokens.append(int(logits[i].argmax()))  # its argmax, as before; nobody reads what it makes
                else:  # by the request's own params and generator (sampler.py), as the continuous scheduler does
                    tokens.append(sample(r, logits[i]))
                    engine.emit(r, tokens[-1])
            nxt = torch.tensor(tokens, device=device)[:, None]  # [rows, 1]
            if all(r.done for r in batch):
                break
        for slot, r in enumerate(batch):  # row i of the batch is slot i
            engine.leave(r, slot, start, retired=True)
    if calls is not None:
        calls.extend(engine.calls)
    return sorted(reqs, key=lambda r: r.id)
