"""The engine loop: one thread that owns the course's continuous-batching scheduler and serves every request together.

The web server (app.py) runs on an asyncio event loop; the model runs here, on a thread of its own, so that a step of
the model never blocks the event loop from reading new requests or writing tokens out (PyTorch lets other threads run
while it computes). The two talk through queues:

    HTTP handler --submit/cancel--> inbox --> engine thread: apply them, then scheduler.step() (one iteration)
    HTTP handler <--tokens, finish-- each request's asyncio.Queue <-- the engine thread, after every step

Before its loop admits anything, a handler asks `admission`: with `max_waiting` requests already queued the answer is
429 at once, with a Retry-After from how fast the queue has been draining, instead of a place at the end of a queue that
only grows (claim C25). Every token is turned into text as it comes (generate/stops.py: StreamingDetokenizer shows no
half character, StopMatcher holds back what could still become a stop string), and a request that meets a stop string
or the end of its turn, or whose client went away, is cancelled in the scheduler, its blocks free for the next step.

The scheduler's clock is set to the wall clock (seconds since the engine started) before every step and again when
the step's tokens come out, so that a request's times (arrival, admission, each token) are real times, and its
engine TTFT is measure/timing's: from its arrival at the engine to the instant its first token came out of a step,
queueing, prefill and the scheduler's own bookkeeping included. What the client sees beyond that (HTTP, JSON, the
chat template, the hand-over to the event loop, the network, the client's own work) is the server's own latency.

The hand-over: the engine thread and the event loop share one interpreter lock, and a thread that goes straight into
the next step keeps the event loop from writing the tokens of the last one out (a decode step is thousands of short
Python calls). So after a step that handed out tokens the engine waits, at most HAND_OVER_S, until the event loop
has run the handlers that send them (`flush`, set by app.py): the tokens go out now, not a step later.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ..generate.chat import end_of_turn_ids
from ..generate.stops import StopMatcher, StreamingDetokenizer
from ..serve.batching import Request
from ..serve.paged_kv import PagedKVPool
from ..generate.sampling import SamplingParams
from ..serve.scheduler import ContinuousScheduler
from .schemas import APIError
from .sizing import QueueSizer, check_max_waiting

HAND_OVER_S = 0.005  # the longest the engine waits for the event loop to send a step's tokens (seconds)


def admission(waiting: int, limit: int | None, seconds_per_admission: float) -> tuple[bool, int]:
    """Queue a new request, or refuse it: (True, 0) to queue it, (False, retry_after_s) for a 429.

    waiting: requests already queued and not yet admitted; limit: how many may wait (None: no limit, 0: none);
    seconds_per_admission: how long the queue has taken to let one request in. A refused client should come back
    when the queue has room for one more: once waiting - limit + 1 requests have been admitted, in whole seconds
    rounded up, at least 1 (HTTP's Retry-After counts whole seconds; 0 would invite it back at once).
    """
    if limit is None or waiting < limit:
        return True, 0
    return False, max(1, math.ceil((waiting - limit + 1) * seconds_per_admission))


@dataclass(eq=False)
class Live:
    """A request in flight as the server sees it: the scheduler's Request, the text so far, where its events go."""

    request: Request
    put: object  # put(event): hands an event to the request's handler (thread-safe)
    detok: StreamingDetokenizer
    stops: StopMatcher
    name: str = ""  # the id its client sees ("chatcmpl-...")
    sent: int = 0  # output tokens turned into events so far
    finish: str | None = None  # "stop", "length", "cancelled", "error"
    admitted: bool = False  # counted out of the waiting requests
    pending: list = field(default_factory=list)  # logprob entries of tokens whose text is held back
    received_s: float | None = None  # when its HTTP handler had the whole body (engine clock): before checking it
    first_sent_s: float | None = None  # when its handler gave the first chunk with text to the web server


class EngineLoop:
    """The scheduler on its own thread: submit() and cancel() from any thread, events back through `put`.

    model: a ScratchLlama; tokenizer: its transformers tokenizer (the chat template, decode). The pool holds
    kv_blocks blocks of block_size positions; prefix_cache keeps and reuses full prompt blocks (notebook 08).
    max_waiting: requests that may wait for a slot (None: no limit; "auto": sized from ttft_objective_s, seconds, or
    by default 3x the shortest recent prefill, by the expected wait W = (q + 1) / mu: sizing.py); metrics: a
    server.metrics.Metrics, or None.
    prefill_first: a step with prompt tokens to run runs only those (serve/scheduler.py), so that a new request's
    first token does not also wait for the running requests' decode step; they wait that one step instead.
    """

    def __init__(self, model, tokenizer, *, max_batch: int = 8, kv_blocks: int = 512, block_size: int = 16,
                 max_batched_tokens: int | None = 256, prefix_cache: bool = True,
                 max_waiting: int | str | None = None, ttft_objective_s: float | None = None,
                 metrics=None, keep_records: int = 2000, prefill_first: bool = True):
        check_max_waiting(max_waiting)
        self.sizer = QueueSizer(ttft_objective_s)  # max_waiting "auto": the limit sized from the TTFT objective
        pool = PagedKVPool.for_model(model, kv_blocks, block_size)
        self.scheduler = ContinuousScheduler(model, pool, max_batch, max_batched_tokens, prefix_cache=prefix_cache,
                                             prefill_first=prefill_first, clock=self.clock,
                                             keep_log=keep_records)  # tokens on the wall clock
        self.model, self.tokenizer, self.metrics, self.max_waiting = model, tokenizer, metrics, max_waiting
        self.context = model.cfg.max_position_embeddings
        self.capacity = kv_blocks * block_size  # positions the whole pool holds
        self.end_ids = set(end_of_turn_ids(tokenizer))
        self.records: deque[dict] = deque(maxlen=keep_records)  # finished requests, as the engine timed them
        self.admissions: deque[float] = deque(maxlen=32)  # when the last requests were admitted (engine clock)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._unadmitted = 0  # submitted, not yet admitted (in the inbox or the scheduler's queue)
        # submitted, not yet ended: counted here, under the lock, not read from the scheduler, which the engine thread
        # changes meanwhile (a request it has just admitted would be counted as running and as waiting)
        self._in_flight = 0
        self._live: dict[int, Live] = {}  # request id -> Live (engine thread only)
        self._stop = threading.Event()
        self.flush = None  # flush(timeout_s): returns once the event loop has sent what was handed out (app.py)
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def warm_up(self) -> None:
        """Serve one small request before any client (the first model calls pay for allocation); it is not counted:
        the finished log forgets it and the metrics start from the scheduler's numbers after it."""
        self.scheduler.run([Request([1, 2, 3, 4, 5], 3)])
        self.scheduler.finished.clear()
        if self.metrics is not None:
            self.metrics.start_from(self.scheduler.stats())

    def describe(self) -> str:
        """How the engine is set up, in words (the server's first log line)."""
        s = self.scheduler
        return (f"max batch {s.max_batch}, {s.pool.num_blocks} KV blocks of {s.pool.block_size}, "
                f"{'prefill first' if s.prefill_first else 'prompts and decodes mixed'}")

    def start(self) -> "EngineLoop":
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        self.thread.join(timeout_s)

    def clock(self) -> float:
        """Seconds since the engine started: the clock every time of the engine is on. A point in time (when a request
        arrived), shared by two threads; the model calls themselves are timed by the scheduler (device.timed), whose
        clock `now` is set to this one before each step and advances by what its calls took."""
        return time.monotonic() - self.t0

    # ---- the handlers' side (the event loop's thread) ------------------------------------------------------------
    def seconds_per_admission(self) -> float:
        """How long the queue has recently taken to let one request in (1 s until it has admitted a few)."""
        times = list(self.admissions)
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) >= 4 and times[-1] > times[0] else 1.0

    def queue_limit(self) -> int | None:
        """The queue's limit now: max_waiting, or with "auto" the one sized from the TTFT objective (sizing.py)."""
        return self.sizer.limit(self.seconds_per_admission()) if self.max_waiting == "auto" else self.max_waiting

    def submit(self, prompt: list[int], params: SamplingParams, put, name: str = "",
               received_s: float | None = None, constraint=None) -> Live:
        """Queue a request (or raise APIError 429 when the queue is full); returns its Live; its events go to put().
        params: how its tokens are picked and when it stops (generate.sampling.SamplingParams: max_tokens, stop strings,
        stop token ids); the end-of-turn tokens of the chat template join its stop token ids, so the scheduler ends the
        turn by the one stop rule. received_s: when its handler had the whole body (engine clock), for the record of
        where the server's time went. constraint: its response_format's RowMask (server/structured.py), its own
        grammar state, applied by the sampler to its row only; None for a free answer."""
        stop_ids = tuple(dict.fromkeys([*params.stop_token_ids, *sorted(self.end_ids)]))
        request = Request(list(prompt), params=dataclasses.replace(params, stop_token_ids=stop_ids),
                          constraint=constraint)
        self.scheduler.check(request, self.capacity)  # reads only the model's configuration: safe from here
        with self._lock:  # requests in flight beyond the batch slots wait; one that a free slot will take does not
            queued = max(0, self._in_flight - self.scheduler.max_batch)
            ok, retry_after = (True, 0) if self._in_flight < self.scheduler.max_batch else \
                admission(queued, self.queue_limit(), self.seconds_per_admission())
            if not ok:
                if self.metrics is not None:
                    self.metrics.rejected.inc()
                raise APIError(429, f"The server is busy: its {self.scheduler.max_batch} batch slots are taken "
                                    f"and {queued} requests wait for one, the most it queues. Retry after "
                                    f"{retry_after} s.", "requests", code="rate_limit_exceeded",
                               headers={"Retry-After": str(retry_after)})
            self._unadmitted += 1
            self._in_flight += 1
        request.arrival_s = self.clock()
        live = Live(request, put, StreamingDetokenizer(self.tokenizer), StopMatcher(params.stop), name,
                    received_s=received_s)
        self._inbox.put(("submit", live))
        return live

    def cancel(self, live: Live) -> None:
        """Cancel a request (its client went away): done by the engine thread before its next step."""
        self._inbox.put(("cancel", live))

    @property
    def waiting(self) -> int:
        return self._unadmitted

    # ---- the engine thread ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        sched = self.scheduler
        while not self._stop.is_set():
            # idle: sleep until a command comes; busy: take what has come and step
            commands = [] if sched.has_unfinished() else [self._inbox.get()]
            while True:
                try:
                    commands.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for kind, live in commands:
                if kind == "submit":
                    sched.submit(live.request)  # gives it its id
                    self._live[live.request.id] = live
                elif kind == "cancel" and live.finish is None:
                    self._end(live, "cancelled")
            if sched.has_unfinished():
                try:  # a failed model call ends its own step's requests inside step(): their outputs say "error"
                    outputs = sched.step()
                except Exception as err:  # the scheduler's own bookkeeping failed: end the running, keep the waiting
                    outputs = sched.fail(sched.running_ids(), err)
                if self._hand_out(outputs) and self.flush is not None:
                    self.flush(HAND_OVER_S)  # let the handlers send this step's tokens before the next step
            self._tidy()

    def _hand_out(self, outputs) -> int:
        """Turn what this step did for each request (the scheduler's RequestOutputs) into events: text as it becomes
        final, the end of those that finished. Returns how many requests got an event."""
        handed = 0
        for out in outputs:
            live = self._live.get(out.request.id)
            if live is None or live.finish is not None:
                continue
            r = out.request
            if out.admitted and not live.admitted:
                self.admissions.append(r.admitted_s)
                self._admitted(live)
            if out.finish_reason == "error":
                live.put(("error", f"the engine failed: {out.error}"))
                self._end(live, "error")
                handed += 1
                continue
            handed += bool(out.new_tokens) or out.finished
            for token in out.new_tokens:
                i, live.sent = live.sent, live.sent + 1
                if i == 0:
                    if r.admitted_s is not None:
                        self.sizer.prefilled(r.token_times[0] - r.admitted_s)
                    if self.metrics is not None:
                        self.metrics.first_token(r)
                if out.finish_reason == "stop" and i == len(r.output) - 1:  # its stop token (the end of the turn)
                    live.sent = i  # is not shown, nor counted as an answer's token
                    break
                if r.params.top_logprobs is not None and i < len(r.logprobs):
                    live.pending.append((token, *r.logprobs[i]))  # the API's JSON is the handler's (schemas.py)
                text = live.stops.feed(live.detok.push(token))
                self._emit(live, text, last=live.stops.stopped)
                if live.stops.stopped:
                    self._end(live, "stop")
                    break
            if live.finish is None and out.finished:
                self._emit(live, self._rest(live), last=True)
                self._end(live, out.finish_reason)
        return handed

    def _admitted(self, live: Live) -> None:
        live.admitted = True
        with self._lock:
            self._unadmitted -= 1

    @staticmethod
    def _rest(live: Live) -> str:
        """What the detokenizer and the stop matcher still hold, at the end of an answer that met no stop string."""
        text = live.stops.feed(live.detok.flush())
        return text + live.stops.flush() if not live.stops.stopped else text

    def _emit(self, live: Live, text: str, last: bool = False) -> None:
        if text or (last and live.pending):
            live.put(("text", text, live.pending))
            live.pending = []

    def _end(self, live: Live, reason: str) -> None:
        """The request is done for the server: out of the scheduler (its blocks free now), its last event sent."""
        r = live.request
        if reason in ("cancelled", "stop") and not r.done:  # the client went away, or a stop string was met
            self.scheduler.cancel(r.id)  # out of the batch or the queue now: its blocks are free for the next step
        if not live.admitted:  # it ends before it was admitted (cancelled while it waited)
            self._admitted(live)
        with self._lock:
            self._in_flight -= 1
        live.finish = reason
        self._live.pop(r.id, None)
        record = {"id": r.id, "name": live.name, "arrival_s": r.arrival_s, "admitted_s": r.admitted_s,
                  "finish_reason": reason,
                  "first_token_s": r.token_times[0] if r.token_times else None,
                  "ttft_s": r.ttft_s if r.token_times else None, "last_token_s": r.token_times[-1] if r.token_times
                  else None, "prompt_tokens": len(r.prompt), "completion_tokens": live.sent,
                  "cached_tokens": r.cached, "preempted": r.preempted, "received_s": live.received_s,
                  "first_sent_s": live.first_sent_s,  # the handler fills first_sent_s in if it is still to come
                  "token_times_s": list(r.token_times)}  # when each token came out of a step (the end of turn too)
        self.records.append(record)
        if self.metrics is not None:
            self.metrics.finished(r, reason)
        if reason != "error":
            live.put(("finish", reason, record))

    def _tidy(self) -> None:
        """Update the gauges (the scheduler keeps its own logs short: keep_log)."""
        if self.metrics is not None:
            self.metrics.update(self)
