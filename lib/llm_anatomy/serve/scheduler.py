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

By default (flatten=False) an iteration makes one decode call and one call for all prompt chunks (left-padded to the
longest), each through the pool's one reader (paged_kv.RaggedPagedView) and the course's one decoding loop
(`prefill`, `decode_step`). A real engine packs the decodes and prompt chunks of an iteration into one call of
concatenated sequences: with flatten=True, step() makes exactly that one call, flat_step.flat_step (kind "mixed"),
with no padding and the decode rows' K and V read in place. Every token of an iteration comes out when the
iteration ends. The clock is batching.Engine's.

What a server adds (notebook 11), without changing a greedy run: `choose` picks each request's token, greedy or
drawn from its own SamplingSettings with its own seeded generator (and records its logprobs when asked), and
`cancel` takes a request out, waiting or running, its blocks handed back at once, so the next step can use them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch

from ..errors import CourseError
from ..generate.decode import decode_step, left_pad, prefill
from ..generate.sampling import sample_with, seeded_generator, token_logprobs
from .batching import Engine, Request
from .flat_step import flat_step
from .paged_kv import PagedKVPool, RaggedPagedView, blocks_for
from .prefix_cache import PrefixCache


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


class ContinuousScheduler(Engine):
    """Iteration-level batching over a paged KV cache, with chunked prefill and optional prefix caching.

    pool: a PagedKVPool for the model; max_batch: requests decoding together at most; max_batched_tokens: tokens
    per iteration (decodes first, then prompt chunks; None = whole prompts at once); prefix_cache: keep and reuse
    full prompt blocks (prefix_cache.py); flatten: one flattened model call per iteration (flat_step.py) instead of
    a padded decode call and a padded prompt-chunk call; prefill_first: an iteration with prompt tokens to run runs
    only those, and the decodes wait for the next (SGLang's default, and vLLM's before chunked prefill), so a new
    request's first token does not wait for the others' decode step. submit() requests, then step() or run() them.
    """

    def __init__(self, model, pool: PagedKVPool, max_batch: int = 8, max_batched_tokens: int | None = None,
                 prefix_cache: bool = False, cost=None, flatten: bool = False, prefill_first: bool = False,
                 clock=None):
        super().__init__(model, max_batch, cost, clock)
        for name, value in (("flatten", flatten), ("prefill_first", prefill_first)):
            if not isinstance(value, bool):
                raise CourseError(f"{name} must be True or False, not {value!r}.")
        self.flatten, self.prefill_first = flatten, prefill_first
        if max_batched_tokens is not None and (isinstance(max_batched_tokens, bool) or
                                               not isinstance(max_batched_tokens, int) or max_batched_tokens < 1):
            raise CourseError(f"max_batched_tokens must be None or a whole number >= 1, not {max_batched_tokens!r}.")
        self.pool, self.max_batched_tokens = pool, max_batched_tokens
        self.prefix_cache = PrefixCache(pool.allocator, pool.block_size) if prefix_cache else None
        self.waiting: deque[Request] = deque()  # arrival order
        self.running: list[Admission] = []  # admission order
        self.finished: list[Request] = []
        self.steps, self._next_id = 0, 0
        self.history: list[tuple[int, dict, list]] = []  # per iteration: (step, {id: block table}, cached blocks)
        self.events: list[tuple[float, str, int, int]] = []  # (time, "admit"/"preempt"/"retire"/"cancel", id, slot)

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
        while self.step():
            pass
        return fresh

    def step(self) -> bool:
        """One iteration: admit, decode, prompt chunks, retire. Returns False when there was nothing to do."""
        if not self.running and not self.waiting:
            return False
        if not self.running and self.waiting[0].arrival_s > self.now:
            self.now = self.waiting[0].arrival_s  # idle until the next arrival
        self._admit()
        decoders, chunks = self._plan()
        produced = self._flat_call(decoders, chunks) if self.flatten else self._padded_calls(decoders, chunks)
        for a, token in produced:  # every token of the iteration comes out when it ends
            self.emit(a.request, token)
        for a in [a for a in self.running if a.request.done]:
            self._release(a, finished=True)
        self.steps += 1
        cached = sorted(self.prefix_cache.blocks()) if self.prefix_cache is not None else []
        self.history.append((self.steps, {a.request.id: list(a.blocks) for a in self.running}, cached))
        return True

    def choose(self, request: Request, logits: torch.Tensor) -> int:
        """The next token of `request` from its logits `[vocab]`: the highest (greedy, request.sampling None or
        temperature 0), else drawn from request.sampling with the request's own generator, seeded with request.seed,
        so that its draws do not depend on the other requests of the batch. Records the token's logprob (and
        request.top_logprobs alternatives) in request.logprobs when the request asks for them."""
        if request.penalties is not None:  # as GenerationSession applies them: its logprobs are the penalized ones
            logits = request.penalties.apply(logits, request.prompt, request.output)
        settings = request.sampling
        if settings is None or settings.greedy:
            token = int(logits.argmax())
        else:
            if request.generator is None:  # its own, carried on the request: no table of them here
                request.generator = seeded_generator(request.seed, logits.device)
            token = int(sample_with(logits, settings, request.generator)[0])
        if request.top_logprobs is not None:
            request.logprobs.append(token_logprobs(logits, token, request.top_logprobs))
        return token

    def cancel(self, request_id: int) -> Request | None:
        """Stop serving a request (its client went away, or a stop string was met): taken out of the queue, or its
        admission ended and its blocks handed back now, so the next step can give them to others. Call it between
        steps. Returns the request (`cancelled` set, its output kept), or None when it is neither waiting nor running
        (finished already, or never submitted)."""
        for r in self.waiting:
            if r.id == request_id:
                self.waiting.remove(r)
                r.cancelled, r.generator = True, None
                return r
        a = next((a for a in self.running if a.request.id == request_id), None)
        if a is None:
            return None
        for block in a.blocks:  # blocks the prefix cache also holds stay cached; the others are free again
            self.pool.allocator.decref(block)
        self.running.remove(a)
        self.leave(a.request, a.slot, a.start_s, retired=True)
        self.events.append((self.now, "cancel", request_id, a.slot))
        a.request.cancelled, a.request.generator = True, None  # its draws are over
        return a.request

    def _admit(self) -> None:
        size, pc = self.pool.block_size, self.prefix_cache
        heads = [r for r in self.waiting if r.arrival_s <= self.now][:self.max_batch - len(self.running)]
        matched = [pc.match(r.tokens) if pc is not None else [] for r in heads]
        keep = {b for m in matched for b in m}
        free = self.pool.allocator.num_free + (pc.evictable(keep) if pc is not None else 0)
        needed = [blocks_for(len(r.tokens), size) - len(m) for r, m in zip(heads, matched)]
        for r in heads[:admit([r.arrival_s for r in heads], needed, len(self.running), free, self.max_batch,
                              self.now)]:
            self.waiting.popleft()
            blocks = pc.acquire(r.tokens) if pc is not None else []
            slot = min(set(range(self.max_batch)) - {a.slot for a in self.running})
            self.running.append(Admission(r, slot, self.now, blocks, len(blocks) * size))
            r.cached = len(blocks) * size
            r.admitted_s = self.now if r.admitted_s is None else r.admitted_s
            self.events.append((self.now, "admit", r.id, slot))

    def _plan(self):
        """This iteration's decoders and prompt chunks, their blocks allocated (preempting if the pool is short)."""
        while True:
            ready = [a for a in self.running if a.pending == 1 and a.computed]  # one new token each
            prompts = [a for a in self.running if a not in ready]
            decoders = [] if self.prefill_first and prompts else ready
            budget = math.inf if self.max_batched_tokens is None else self.max_batched_tokens - len(decoders)
            chunks = []
            for a in prompts:
                if budget > 0:
                    chunks.append((a, int(min(a.pending, budget))))
                    budget -= chunks[-1][1]
            rows = [(a, 1) for a in decoders] + chunks
            short = sum(self.pool.missing(a.blocks, a.computed + n) for a, n in rows) - self.pool.allocator.num_free
            if short > 0 and self.prefix_cache is not None:
                short -= self.prefix_cache.evict(short)
            if short <= 0:
                break
            if len(self.running) == 1:  # cannot happen: submit() refuses a request the whole pool cannot hold
                raise CourseError("The KV pool cannot hold even one request: make a pool with more blocks.")
            self._release(self.running[-1], finished=False)  # preempt the youngest; it is recomputed later
        self.pool.extend([a.blocks for a, _ in rows], [a.computed + n for a, n in rows])
        return decoders, chunks

    def _padded_calls(self, decoders: list[Admission], chunks: list) -> list:
        """The iteration as a padded decode call and a padded prompt-chunk call; returns the (admission, token)s."""
        produced, device = [], self.model.device
        if decoders:  # one token for every request whose tokens are all cached but the newest
            ids = torch.tensor([[a.request.tokens[a.computed]] for a in decoders], device=device)  # [rows, 1]
            view = RaggedPagedView(self.pool, [a.blocks for a in decoders], [a.computed for a in decoders],
                                   [1] * len(decoders))
            out = self.call("decode", len(decoders), len(decoders), lambda: decode_step(self.model, ids, view),
                            context=sum(a.computed for a in decoders))
            produced += self._advance(decoders, [1] * len(decoders), out.logits[:, -1])
        if chunks:  # every prompt chunk of the iteration in one call, each left-padded to the longest
            rows, news = [a for a, _ in chunks], [n for _, n in chunks]
            ids, _ = left_pad([a.request.tokens[a.computed:a.computed + n] for a, n in chunks],
                              device=device)  # [rows, width]
            view = RaggedPagedView(self.pool, [a.blocks for a in rows], [a.computed for a in rows], news)
            out = self.call("prefill", len(rows), sum(news), lambda: prefill(self.model, ids, view),
                            context=sum(a.computed for a in rows))
            produced += self._advance(rows, news, out.logits[:, -1])
        return produced

    def _flat_call(self, decoders: list[Admission], chunks: list) -> list:
        """The iteration as one flattened call (flat_step.py): decodes and prompt chunks end to end, no padding;
        returns the (admission, token)s."""
        rows, news = decoders + [a for a, _ in chunks], [1] * len(decoders) + [n for _, n in chunks]
        if not rows:
            return []
        tokens = [a.request.tokens[a.computed:a.computed + n] for a, n in zip(rows, news)]
        logits = self.call("mixed", len(rows), sum(news), lambda: flat_step(
            self.model, self.pool, [a.blocks for a in rows], [a.computed for a in rows], tokens),
            context=sum(a.computed for a in rows))  # [rows, vocab]
        return self._advance(rows, news, logits)

    def _advance(self, rows: list[Admission], news: list[int], logits: torch.Tensor) -> list:
        """Count the new cached positions; a row whose tokens are now all cached gets its next token from its
        logits (`logits[i]`, `[vocab]`: the row's last new token)."""
        produced = []
        for i, (a, new) in enumerate(zip(rows, news)):
            a.computed += new
            if a.pending == 0:
                if self.prefix_cache is not None and not a.request.output:  # the prompt is in: share its full blocks
                    self.prefix_cache.insert(a.request.prompt, a.blocks)
                produced.append((a, self.choose(a.request, logits[i])))
        return produced

    def _release(self, a: Admission, finished: bool) -> None:
        """End an admission: the request retires when finished, else it is preempted (it keeps its output)."""
        r = a.request
        if finished and self.prefix_cache is not None:
            self.prefix_cache.insert(r.tokens[:a.computed], a.blocks)
        for block in a.blocks:
            self.pool.allocator.decref(block)
        self.running.remove(a)
        self.leave(r, a.slot, a.start_s, retired=finished)  # the span runs from this admission to now
        self.events.append((self.now, "retire" if finished else "preempt", r.id, a.slot))
        if finished:
            self.finished.append(r)
            r.generator = None  # done drawing: a server keeps thousands of finished requests
        else:
            r.cached, r.preempted = 0, r.preempted + 1
            self.waiting.appendleft(r)
