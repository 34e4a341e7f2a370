"""Continuous (iteration-level) batching over a paged KV cache, with chunked prefill (claim C15).

Orca, vLLM and SGLang decide again at every iteration:
    1. admit waiting requests that have arrived, while a slot is free and the pool has blocks for their prompt;
    2. one decode step for every request whose tokens are all in the cache but the newest (one new token each);
    3. what is left of the token budget `max_batched_tokens` goes to prompts, in chunks (chunked prefill);
    4. retire finished requests and free their blocks.
So a short request leaves as soon as it is done and a new one takes its place at the next iteration.

Each request holds a block table in a PagedKVPool (paged_kv.py). When the pool runs dry, the youngest request is
preempted: its blocks are freed and it is recomputed later from its prompt and the tokens it has produced, which it
keeps (vLLM's "preemption by recompute"). A real engine packs the decodes and prompt chunks of an iteration into
one call of concatenated sequences; our model takes rectangles, so an iteration makes one decode call and one call
for all prompt chunks (left-padded to the longest), through the course's one decoding loop (`prefill`,
`decode_step`). Every token of an iteration comes out when the iteration ends. The clock is batching.Engine's.
"""

from __future__ import annotations

import math
from collections import deque

import torch

from .batching import Engine, Request
from ..generate.decode import decode_step, left_pad, prefill
from ..errors import CourseError
from .paged_kv import PagedKVPool
from .prefix_cache import PrefixCache


def blocks_for(positions: int, block_size: int) -> int:
    """Blocks that hold `positions` positions: ceil(positions / block_size)."""
    return -(-positions // block_size)


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


class RaggedPagedView:
    """One model call over rows of different lengths in a PagedKVPool: a KVCacheInterface (model/kv_cache.py).

    Row i has `lengths[i]` positions cached (in the blocks of `tables[i]`) and adds `news[i]` new ones (a decode: 1;
    a prompt chunk: more). Each row's positions are right-aligned in one rectangle and its front is padding, which
    the key mask hides; the model's per-row RoPE positions (a running count of real keys) then put every token at
    its own position. A row with fewer new tokens than the widest is fed pad tokens in front of them: their
    queries are computed and ignored, and their keys are replaced by the row's cached ones. update() writes each
    row's real new K and V into its blocks and gathers every row's keys and values back through its block table.
    """

    def __init__(self, pool: PagedKVPool, tables: list[list[int]], lengths: list[int], news: list[int]):
        self.pool, self.batch_size = pool, len(tables)
        device, size = pool.keys[0].device, pool.block_size
        news_t, ends = torch.tensor(news, device=device), torch.tensor([a + b for a, b in zip(lengths, news)],
                                                                       device=device)
        width, self.new = int(ends.max()), max(news)
        self.length = width - self.new  # "past" positions of the rectangle, as the model sees it
        cols = torch.arange(width, device=device)  # [width]
        pos = cols - (width - ends)[:, None]  # [rows, width] each row's position in each column; < 0 = padding
        self.mask = (pos >= 0) if bool((pos < 0).any()) else None  # [rows, width] False = padding
        table_width = max(len(t) for t in tables)
        table = torch.tensor([t + t[:1] * (table_width - len(t)) for t in tables], device=device)  # [rows, blocks]
        pos = pos.clamp(min=0)
        self.block_ids, self.slots = table.gather(1, pos // size), pos % size  # [rows, width] each
        real_new = cols[self.length:][None] >= (width - news_t)[:, None]  # [rows, new] True: a real new token
        self.write_rows, self.write_cols = real_new.nonzero(as_tuple=True)  # [written] each
        self.write_blocks = self.block_ids[:, self.length:][real_new]  # [written]
        self.write_slots = self.slots[:, self.length:][real_new]  # [written]

    def key_mask(self, new: int, attention_mask=None):
        if attention_mask is not None:
            raise CourseError("RaggedPagedView makes its own padding mask: give no attention_mask.")
        return self.mask

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write `k`, `v` `[rows, kv_heads, new, head_dim]`; return every position `[rows, kv_heads, width, d]`."""
        keys, values = self.pool.keys[layer], self.pool.values[layer]  # [blocks, kv_heads, block_size, d]
        rows, cols = self.write_rows, self.write_cols
        keys[self.write_blocks, :, self.write_slots] = k.transpose(1, 2)[rows, cols]  # [written, kv_heads, d]
        values[self.write_blocks, :, self.write_slots] = v.transpose(1, 2)[rows, cols]
        # contiguous(): the same memory layout as KVCache's tensor, so attention adds in the same order
        return (keys[self.block_ids, :, self.slots].transpose(1, 2).contiguous(),
                values[self.block_ids, :, self.slots].transpose(1, 2).contiguous())

    def advance(self, new: int) -> None:
        """Nothing to do: the scheduler counts each request's positions itself."""


class ContinuousScheduler(Engine):
    """Iteration-level batching over a paged KV cache, with chunked prefill and optional prefix caching.

    pool: a PagedKVPool for the model; max_batch: requests decoding together at most; max_batched_tokens: tokens
    per iteration (decodes first, then prompt chunks; None = whole prompts at once); prefix_cache: keep and reuse
    full prompt blocks (prefix_cache.py). submit() requests, then step() (one iteration) or run() them all.
    """

    def __init__(self, model, pool: PagedKVPool, max_batch: int = 8, max_batched_tokens: int | None = None,
                 prefix_cache: bool = False, cost=None):
        super().__init__(model, max_batch, cost)
        if max_batched_tokens is not None and (isinstance(max_batched_tokens, bool) or
                                               not isinstance(max_batched_tokens, int) or max_batched_tokens < 1):
            raise CourseError(f"max_batched_tokens must be None or a whole number >= 1, not {max_batched_tokens!r}.")
        self.pool, self.max_batched_tokens = pool, max_batched_tokens
        self.prefix_cache = PrefixCache(pool.allocator, pool.block_size) if prefix_cache else None
        self.waiting: deque[Request] = deque()  # arrival order
        self.running: list[Request] = []  # admission order
        self.finished: list[Request] = []
        self.steps, self._next_id = 0, 0
        self.history: list[tuple[int, dict, list]] = []  # per iteration: (step, {id: block table}, cached blocks)

    def submit(self, request: Request) -> Request:
        """Queue a request (checked first: a refused one changes nothing); returns it, with its id set."""
        self._check(request, self.pool.num_blocks * self.pool.block_size)
        if any(r is request for r in [*self.waiting, *self.running, *self.finished]):
            raise CourseError(f"Request {request.id} was submitted already: submit request.fresh() to serve it again.")
        request.id, self._next_id = self._next_id, self._next_id + 1
        at = sum(1 for r in self.waiting if r.arrival_s <= request.arrival_s)
        self.waiting.insert(at, request)
        return request

    def run(self, requests) -> list[Request]:
        """Serve fresh copies of `requests` to the end; returns them in the order given, outputs and times recorded."""
        for r in requests:  # every request is checked before any is queued
            self._check(r, self.pool.num_blocks * self.pool.block_size)
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
        produced, device = [], self.model.device
        if decoders:  # one token for every request whose tokens are all cached but the newest
            ids = torch.tensor([[r.tokens[r.computed]] for r in decoders], device=device)  # [rows, 1]
            view = RaggedPagedView(self.pool, [r.blocks for r in decoders], [r.computed for r in decoders],
                                   [1] * len(decoders))
            out = self._call("decode", len(decoders), len(decoders), lambda: decode_step(self.model, ids, view))
            produced += self._advance(decoders, [1] * len(decoders), out)
        if chunks:  # every prompt chunk of the iteration in one call, each left-padded to the longest
            rows, news = [r for r, _ in chunks], [n for _, n in chunks]
            ids, _ = left_pad([r.tokens[r.computed:r.computed + n] for r, n in chunks], device=device)  # [rows, width]
            view = RaggedPagedView(self.pool, [r.blocks for r in rows], [r.computed for r in rows], news)
            out = self._call("prefill", len(rows), sum(news), lambda: prefill(self.model, ids, view))
            produced += self._advance(rows, news, out)
        for r, token in produced:  # every token of the iteration comes out when it ends
            r.output.append(token)
            r.token_times.append(self.now)
        for r in [r for r in self.running if r.done]:
            self._release(r, finished=True)
        self.steps += 1
        cached = sorted(self.prefix_cache.blocks()) if self.prefix_cache is not None else []
        self.history.append((self.steps, {r.id: list(r.blocks) for r in self.running}, cached))
        return True

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
            r.blocks = pc.acquire(r.tokens) if pc is not None else []
            r.computed = len(r.blocks) * size
            r.cached = r.computed
            r.slot = min(set(range(self.max_batch)) - {q.slot for q in self.running})
            r.admitted_s = self.now if r.admitted_s is None else r.admitted_s
            self.running.append(r)

    def _plan(self):
        """This iteration's decoders and prompt chunks, their blocks allocated (preempting if the pool is short)."""
        size, alloc = self.pool.block_size, self.pool.allocator
        while True:
            decoders = [r for r in self.running if len(r.tokens) - r.computed == 1 and r.computed]
            budget = math.inf if self.max_batched_tokens is None else self.max_batched_tokens - len(decoders)
            chunks = []
            for r in self.running:
                pending = len(r.tokens) - r.computed
                if r not in decoders and budget > 0:
                    chunks.append((r, int(min(pending, budget))))
                    budget -= chunks[-1][1]
            need = {r: blocks_for(r.computed + n, size) - len(r.blocks) for r, n in [(d, 1) for d in decoders] + chunks}
            short = sum(need.values()) - alloc.num_free
            if short > 0 and self.prefix_cache is not None:
                short -= self.prefix_cache.evict(short)
            if short <= 0:
                break
            if len(self.running) == 1:  # cannot happen: submit() refuses a request the whole pool cannot hold
                raise CourseError("The KV pool cannot hold even one request: make a pool with more blocks.")
            self._release(self.running[-1], finished=False)  # preempt the youngest; it is recomputed later
        for r, count in need.items():
            r.blocks += [alloc.allocate() for _ in range(count)]
        return decoders, chunks

    def _advance(self, rows, news: list[int], out) -> list:
        """Count the new cached positions; a row whose tokens are now all cached gets its next token."""
        produced = []
        for i, (r, new) in enumerate(zip(rows, news)):
            r.computed += new
            if r.computed == len(r.tokens):
                if self.prefix_cache is not None and not r.output:  # the prompt is in: share its full blocks now
                    self.prefix_cache.insert(r.prompt, r.blocks)
                produced.append((r, int(out.logits[i, -1].argmax())))
        return produced

    def _release(self, r: Request, finished: bool) -> None:
        """Give back the request's slot and blocks: retired when finished, else preempted (it keeps its output)."""
        if finished and self.prefix_cache is not None:
            self.prefix_cache.insert(r.tokens[:r.computed], r.blocks)
        for block in r.blocks:
            self.pool.allocator.decref(block)
        r.spans.append((r.slot, r.admitted_s if not r.spans else r.spans[-1][2], self.now))
        r.blocks, self.running = [], [q for q in self.running if q is not r]
        if finished:
            r.finished_s = r.released_s = self.now
            self.finished.append(r)
        else:
            r.computed, r.cached, r.preempted, r.slot = 0, 0, r.preempted + 1, -1
            self.waiting.appendleft(r)
