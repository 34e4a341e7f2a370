"""Continuous (iteration-level) batching over a paged KV cache, with chunked prefill (claim C15).

Orca, vLLM and SGLang decide again at every iteration:
    1. admit waiting requests that have arrived, while a slot is free and the pool has blocks for their prompt;
    2. one decode step for every request whose tokens are all in the cache but the newest (one new token each);
    3. what is left of the token budget `max_batched_tokens` goes to prompts, in chunks (chunked prefill);
    4. retire finished requests and free their blocks.
So a short request leaves as soon as it is done and a new one takes its place at the next iteration.

While it runs, a request has an `Admission`, the scheduler's record of it: its batch slot, when it was admitted, its
block table in a PagedKVPool (paged_kv.py) and the positions computed. When the pool runs dry, the youngest request
is preempted: its admission ends, its blocks are freed, and it is recomputed after a new admission from its prompt
and the tokens it has produced, which it keeps (vLLM's "preemption by recompute"). Each admission is one span of
the request in a batch slot, from its admission to its retirement or preemption (`Request.spans`).

One iteration is four parts, each in its own file, as nano-vllm splits its engine:
    schedule()       decides: admission (`admit`), the rows (`plan`, a pure function), preemption; no model call
    BlockManager     books the blocks of what was decided, and keeps the prefix cache (block_manager.py)
    ModelRunner      runs the rows through the course's one forward pass: a padded decode call and a padded
                     prompt-chunk call, or with flatten=True one flattened call of both (model_runner.py)
    sample           picks each finished row's token by the request's own SamplingParams (sampler.py)
Every token of an iteration comes out when the iteration ends. The clock is batching.Engine's, or a server's wall
clock handed in as `clock`. `cancel` takes a request out, waiting or running, its blocks handed back at once, so the
next step can use them (notebook 11).

`step()` is nano-vllm's `LLMEngine.step`: schedule -> run -> sample -> post-process, and it returns what the step did
for each request it touched (a `RequestOutput`: the new tokens, whether it finished and why, whether it joined or was
preempted). A server consumes those outputs and `stats()`; it never reaches into the queues. When the model call of a
step fails, only that step's requests end (finish reason "error", their blocks freed); the others go on, and so does
the scheduler. Its logs (`history`, `events`, `calls`, `finished`) keep the last `keep_log` entries: a server runs for
days.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..errors import CourseError
from .batching import Engine, Request
from .block_manager import BlockManager
from .model_runner import ModelRunner
from .outputs import RequestOutput, SchedulerStats
from .paged_kv import PagedKVPool
from .sampler import sample


def admit(arrivals: list[float], blocks_needed: list[int], running: int, free_blocks: int, max_batch: int,
          now: float) -> int:
    """How many requests at the head of the waiting queue join the batch now (first come, first served).

    The next one joins when it has arrived (arrival <= now), a slot is free (running < max_batch) and the free
    blocks hold its prompt (blocks_needed, minus what the ones before it took). The first that cannot join stops
    the others behind it: no request overtakes an earlier one.
    """
    joined = 0
    for arrival, need in zip(arrivals, blocks_needed):
        if arrival > now or running + joined >= max_batch or need > free_blocks:
            break
        free_blocks -= need
        joined += 1
    return joined


@dataclass(eq=False)
class Admission:
    """The scheduler's record of a request while it holds a batch slot (from admission to retirement or preemption)."""

    request: Request
    slot: int  # which row of the batch it holds
    start_s: float  # when it was admitted: where its span in the slot starts
    blocks: list[int] = field(default_factory=list)  # its block table in the pool
    computed: int = 0  # positions whose K and V are in the cache

    @property
    def pending(self) -> int:
        """Tokens not yet in the cache: 1 for a decoding request (its newest token), more while prefilling."""
        return len(self.request.tokens) - self.computed


def plan(running: list[Admission], max_batched_tokens: int | None, prefill_first: bool) -> tuple[list, list]:
    """This iteration's rows, decided from the running admissions alone (a pure function: it books nothing).

    Returns (decoders, chunks): the admissions that decode one token, and (admission, tokens) prompt chunks from
    what is left of the token budget, in admission order. With prefill_first, an iteration that has prompt tokens
    runs only those.
    """
    ready = [a for a in running if a.pending == 1 and a.computed]  # one new token each
    prompts = [a for a in running if a not in ready]
    decoders = [] if prefill_first and prompts else ready
    budget = math.inf if max_batched_tokens is None else max_batched_tokens - len(decoders)
    chunks = []
    for a in prompts:
        if budget > 0:
            chunks.append((a, int(min(a.pending, budget))))
            budget -= chunks[-1][1]
    return decoders, chunks


class Plan(NamedTuple):
    """What one iteration does: who joined and who was preempted to make room (a request that joined can be preempted
    in the same iteration, and is then in both), then the rows it runs."""

    admitted: list[Request]
    preempted: list[Request]
    decoders: list[Admission]  # one new token each
    chunks: list[tuple[Admission, int]]  # (admission, prompt tokens) in this iteration

    @property
    def rows(self) -> list[tuple[Admission, int]]:
        return [(a, 1) for a in self.decoders] + self.chunks


class ContinuousScheduler(Engine):
    """Iteration-level batching over a paged KV cache, with chunked prefill and optional prefix caching.

    pool: a PagedKVPool for the model; max_batch: requests decoding together at most; max_batched_tokens: tokens
    per iteration (decodes first, then prompt chunks; None = whole prompts at once); prefix_cache: keep and reuse
    full prompt blocks (prefix_cache.py); flatten: one flattened model call per iteration (flat_step.py) instead of
    a padded decode call and a padded prompt-chunk call; prefill_first: an iteration with prompt tokens to run runs
    only those, and the decodes wait for the next (SGLang's default, and vLLM's before chunked prefill), so a new
    request's first token does not wait for the others' decode step. submit() requests, then step() or run() them.

    An iteration is nano-vllm's: schedule() decides (admission, rows, preemption) and books blocks through the
    BlockManager, the ModelRunner runs the rows, the sampler picks each finished row's token by the request's own
    SamplingParams, and postprocess() records it all and returns each request's RequestOutput.
    keep_log: how many entries each log keeps (history, events, calls, finished; None: all).
    """

    def __init__(self, model, pool: PagedKVPool, max_batch: int = 8, max_batched_tokens: int | None = None,
                 prefix_cache: bool = False, cost=None, flatten: bool = False, prefill_first: bool = False,
                 clock=None, keep_log: int | None = 10_000):
        super().__init__(model, max_batch, cost, clock, keep_log)
        for name, value in (("flatten", flatten), ("prefill_first", prefill_first)):
            if not isinstance(value, bool):
                raise CourseError(f"{name} must be True or False, not {value!r}.")
        self.prefill_first = prefill_first
        if max_batched_tokens is not None and (isinstance(max_batched_tokens, bool) or
                                               not isinstance(max_batched_tokens, int) or max_batched_tokens < 1):
            raise CourseError(f"max_batched_tokens must be None or a whole number >= 1, not {max_batched_tokens!r}.")
        self.pool, self.max_batched_tokens = pool, max_batched_tokens
        self.blocks = BlockManager(pool, prefix_cache)
        self.runner = ModelRunner(model, pool, self.call, flatten)
        self.waiting: deque[Request] = deque()  # arrival order
        self.running: list[Admission] = []  # admission order
        self.finished: deque[Request] = deque(maxlen=keep_log)  # the last retired requests
        self.steps, self._next_id, self._retired, self._preemptions = 0, 0, 0, 0
        # per iteration: (step, {id: block table}, cached blocks)
        self.history: deque[tuple[int, dict, list]] = deque(maxlen=keep_log)
        # (time, "admit"/"preempt"/"retire"/"cancel"/"error", id, slot)
        self.events: deque[tuple[float, str, int, int]] = deque(maxlen=keep_log)

    @property
    def prefix_cache(self):
        return self.blocks.prefix_cache

    @property
    def flatten(self) -> bool:
        return self.runner.flatten

    def admission_of(self, request: Request) -> Admission | None:
        """The running request's admission (slot, block table, positions computed), or None when it is not running."""
        return next((a for a in self.running if a.request is request), None)

    def submit(self, request: Request) -> Request:
        """Queue a request (checked first: a refused one changes nothing); returns it, with its id set."""
        self.check(request, self.pool.num_blocks * self.pool.block_size)
        if any(r is request for r in [*self.waiting, *(a.request for a in self.running), *self.finished]):
            raise CourseError(f"Request {request.id} was submitted already: submit request.fresh() to serve it again.")
        request.id, self._next_id = self._next_id, self._next_id + 1
        at = sum(1 for r in self.waiting if r.arrival_s <= request.arrival_s)
        self.waiting.insert(at, request)
        return request

    def run(self, requests) -> list[Request]:
        """Serve fresh copies of `requests` to the end; returns them in the order given, outputs and times recorded."""
        for r in requests:  # every request is checked before any is queued
            self.check(r, self.pool.num_blocks * self.pool.block_size)
        fresh = [r.fresh() for r in requests]
        for r in fresh:
            self.submit(r)
        while self.has_unfinished():
            self.step()
        return fresh

    def running_ids(self) -> list[int]:
        """The ids of the requests in the batch now, in admission order."""
        return [a.request.id for a in self.running]

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running (vLLM's has_unfinished_requests)."""
        return bool(self.running or self.waiting)

    def step(self) -> list[RequestOutput]:
        """One iteration: schedule -> run -> sample -> post-process. Returns a RequestOutput for every request the step
        touched (its rows, who joined, who was preempted); an empty list when there was nothing to do.

        A model call that fails ends this step's requests only (finish reason "error", blocks freed); the exception does
        not leave the step. A failure of the scheduler's own bookkeeping (a bug) is raised.
        """
        if not self.has_unfinished():
            return []
        if self.clock is not None:  # a server's wall clock: the time between steps counts too
            self.now = max(self.now, self.clock())
        if not self.running and self.waiting[0].arrival_s > self.now:
            self.now = self.waiting[0].arrival_s  # idle until the next arrival
        step = self.schedule()
        rows = step.rows
        try:
            logits = self.runner.run([a.request.tokens[a.computed:a.computed + n] for a, n in rows],
                                     [a.blocks for a, _ in rows], [a.computed for a, _ in rows],
                                     len(step.decoders)) if rows else None  # [rows, vocab]
        except Exception as err:  # this step's rows did not run: they end; the others are untouched
            failed = self.fail([a.request.id for a, _ in rows], err)
            return self._outputs(step, failed)
        return self.postprocess(step, logits)

    def schedule(self) -> Plan:
        """Decide this iteration: admit who can join, plan the rows, preempt the youngest while the pool cannot
        hold them; the BlockManager books the blocks of what was decided. No model call, no token drawn."""
        admitted = self._admit()
        preempted = []
        while True:
            step = Plan(admitted, preempted, *plan(self.running, self.max_batched_tokens, self.prefill_first))
            rows = [(a.blocks, a.computed + n) for a, n in step.rows]  # each table, grown to hold its new tokens
            if self.blocks.make_room(rows):
                break
            if len(self.running) == 1:  # cannot happen: submit() refuses a request the whole pool cannot hold
                raise CourseError("The KV pool cannot hold even one request: make a pool with more blocks.")
            preempted.append(self.running[-1].request)
            self._release(self.running[-1], finished=False)  # it is recomputed later
        self.blocks.grow(rows)
        return step

    def postprocess(self, step: Plan, logits: torch.Tensor | None) -> list[RequestOutput]:
        """Count the new cached positions; a row whose tokens are now all cached gets its next token from its logits
        row (the sampler); every token of the iteration comes out when it ends; finished requests retire. A row whose
        token cannot be drawn (its logits hold NaN, say) ends with an error, alone. Returns the step's outputs."""
        produced, failed = [], []
        for i, (a, new) in enumerate(step.rows):
            a.computed += new
            if a.pending == 0:
                if not a.request.output:  # the prompt is in: share its full blocks
                    self.blocks.keep(a.request.prompt, a.blocks)
                try:
                    produced.append((a.request, sample(a.request, logits[i])))
                except Exception as err:  # this request's draw failed: it ends; the others keep their tokens
                    failed.append((a.request.id, err))
        for request, token in produced:
            self.emit(request, token)
        outputs = []
        for request_id, err in failed:
            outputs += self.fail([request_id], err)
        for a in [a for a in self.running if a.request.done]:
            self._release(a, finished=True)
        return self._outputs(step, outputs, {id(r): t for r, t in produced})

    def _outputs(self, step: Plan, failed: list[RequestOutput], tokens: dict | None = None) -> list[RequestOutput]:
        """The step's RequestOutputs, one per request touched, in row order (then who joined without a row yet, and
        who was preempted); the step is counted and its block tables logged."""
        tokens = tokens or {}
        outputs = {id(out.request): out for out in failed}
        joined, preempted = {id(r) for r in step.admitted}, {id(r) for r in step.preempted}
        for r in [a.request for a, _ in step.rows] + list(step.admitted) + list(step.preempted):
            if id(r) not in outputs:
                done = r.done and id(r) not in preempted
                outputs[id(r)] = RequestOutput(r, [tokens[id(r)]] if id(r) in tokens else [], done,
                                               r.finish_reason if done else None)
        for out in outputs.values():
            out.admitted, out.preempted = id(out.request) in joined, id(out.request) in preempted
        self.steps += 1
        self.history.append((self.steps, {a.request.id: list(a.blocks) for a in self.running}, self.blocks.cached()))
        return list(outputs.values())

    def fail(self, request_ids: list[int], error: BaseException | str) -> list[RequestOutput]:
        """End these requests with an error (a step that ran them failed): out of the batch or the queue, their blocks
        freed, none of them kept in the prefix cache (a failed call may have written them half). Returns their
        outputs (finish reason "error"); requests that are not waiting or running are skipped."""
        message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        outputs = []
        for request_id in request_ids:
            request = self._take_out(request_id, "error")
            if request is not None:
                request.error = message
                outputs.append(RequestOutput(request, [], True, "error", error=message))
        return outputs

    def stats(self) -> SchedulerStats:
        """The scheduler's numbers now (what the server's metrics, the views and the widget read)."""
        alloc, pc = self.pool.allocator, self.prefix_cache
        return SchedulerStats(self.steps, self.now, len(self.running), len(self.waiting), self._retired,
                              self._preemptions, alloc.num_blocks, alloc.num_free,
                              pc.evictable() if pc is not None else 0, pc.query_tokens if pc is not None else 0,
                              pc.hit_tokens if pc is not None else 0)

    def cancel(self, request_id: int) -> Request | None:
        """Stop serving a request (its client went away, or a stop string was met): taken out of the queue, or its
        admission ended and its blocks handed back now, so the next step can give them to others. Call it between
        steps. Returns the request (`cancelled` set, its output kept), or None when it is neither waiting nor running
        (finished already, or never submitted)."""
        request = self._take_out(request_id, "cancel")
        if request is not None:
            request.cancelled = True
        return request

    def _take_out(self, request_id: int, why: str) -> Request | None:
        """Take a request out of the queue or the batch, its blocks handed back now (`why`: "cancel" or "error")."""
        for r in self.waiting:
            if r.id == request_id:
                self.waiting.remove(r)
                r.generator = None
                return r
        a = next((a for a in self.running if a.request.id == request_id), None)
        if a is None:
            return None
        self.blocks.release(a.blocks)  # blocks the prefix cache also holds stay cached; the others are free again
        self.running.remove(a)
        self.leave(a.request, a.slot, a.start_s, retired=True)
        self.events.append((self.now, why, request_id, a.slot))
        a.request.generator = None  # its draws are over
        return a.request

    def _admit(self) -> list[Request]:
        heads = [r for r in self.waiting if r.arrival_s <= self.now][:self.max_batch - len(self.running)]
        needed, free = self.blocks.admission_needs([r.tokens for r in heads])
        joined = heads[:admit([r.arrival_s for r in heads], needed, len(self.running), free, self.max_batch,
                              self.now)]
        for r in joined:
            self.waiting.popleft()
            blocks = self.blocks.take_prefix(r.tokens)
            slot = min(set(range(self.max_batch)) - {a.slot for a in self.running})
            self.running.append(Admission(r, slot, self.now, blocks, len(blocks) * self.pool.block_size))
            r.cached = len(blocks) * self.pool.block_size
            r.admitted_s = self.now if r.admitted_s is None else r.admitted_s
            self.events.append((self.now, "admit", r.id, slot))
        return joined

    def _release(self, a: Admission, finished: bool) -> None:
        """End an admission: the request retires when finished, else it is preempted (it keeps its output)."""
        r = a.request
        if finished:
            self.blocks.keep(r.tokens[:a.computed], a.blocks)
        self.blocks.release(a.blocks)
        self.running.remove(a)
        self.leave(r, a.slot, a.start_s, retired=finished)  # the span runs from this admission to now
        self.events.append((self.now, "retire" if finished else "preempt", r.id, a.slot))
        if finished:
            self.finished.append(r)
            self._retired += 1
            r.generator = None  # done drawing: a server keeps thousands of finished requests
        else:
            self._preemptions += 1
            r.cached, r.preempted = 0, r.preempted + 1
            self.waiting.appendleft(r)
