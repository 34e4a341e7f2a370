"""Prefix caching (claim C16): chained block keys, reference counts and eviction, and identical outputs with it on."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.device import torch_threads
from llm_anatomy.serve.batching import Request
from llm_anatomy.generate.decode import generate_greedy
from llm_anatomy.errors import CourseError
from llm_anatomy.serve.paged_kv import BlockAllocator, PagedKVPool
from llm_anatomy.claims import ClaimFailed
from llm_anatomy.serve.prefix_cache import (PrefixCache, block_keys, claim_hits_skip_work,
                                            claim_same_tokens_less_prefill)
from llm_anatomy.serve.scheduler import ContinuousScheduler

COST = lambda tokens, rows, **_: 0.01 + 0.001 * tokens  # noqa: E731


def test_keys_name_the_whole_prefix_up_to_their_block():
    a = list(range(10))
    keys = block_keys(a, 4)
    assert len(keys) == 2 and len(set(keys)) == 2  # two full blocks; the last 2 tokens make no key
    assert block_keys(a[:8] + [99, 98, 97], 4) == keys  # the partial block does not matter
    assert block_keys(a[:4] + [50, 51, 52, 53], 4)[0] == keys[0]  # same first block, same first key
    assert block_keys(a[:4] + [50, 51, 52, 53], 4)[1] != keys[1]
    moved = [7, 7, 7, 7] + a[4:]  # block 1 has the same tokens, after a different start
    assert block_keys(moved, 4)[1] != keys[1]
    assert block_keys(a, 4) == keys and block_keys([], 4) == [] and block_keys(a[:3], 4) == []
    assert block_keys(a, 1)[3] == block_keys(a[:4], 1)[3]
    for bad in (0, -1, 2.0, True):
        with pytest.raises(CourseError):
            block_keys(a, bad)


def test_insert_match_acquire_and_evict_through_reference_counts():
    alloc = BlockAllocator(6)
    cache = PrefixCache(alloc, 4)
    prompt = list(range(11))  # two full blocks and 3 tokens
    table = [alloc.allocate() for _ in range(3)]
    assert cache.insert(prompt, table) == 2 and len(cache) == 2  # only the full blocks
    assert [alloc.refcount(b) for b in table] == [2, 2, 1]  # the request and the cache hold the full ones
    assert cache.insert(prompt, [alloc.allocate() for _ in range(3)]) == 0  # the same prefix again: kept once
    assert cache.match(prompt) == table[:2]
    assert cache.match(prompt[:8]) == table[:1]  # at most len - 1 positions: the last token must still run
    assert cache.match(prompt[:9]) == table[:2]
    assert cache.match([1] + prompt[1:]) == []
    assert cache.evictable() == 0  # the first request still holds both
    for b in table:
        alloc.decref(b)  # the first request finishes
    assert cache.evictable() == 2 and cache.evictable(keep=table[:1]) == 1
    got = cache.acquire(prompt[:9] + [77, 78])  # a new request with the same 8-token prefix
    assert got == table[:2] and [alloc.refcount(b) for b in got] == [2, 2]
    assert cache.hit_tokens == 8 and cache.query_tokens == 11 and cache.hit_rate == pytest.approx(8 / 11)
    assert cache.evict(5) == 0  # blocks in use are never evicted
    for b in got:
        alloc.decref(b)
    free_before = alloc.num_free
    assert cache.evict(1) == 1 and alloc.num_free == free_before + 1 and len(cache) == 1
    cache.clear()
    assert len(cache) == 0 and cache.blocks() == set()
    with pytest.raises(CourseError, match="block table"):
        cache.insert(prompt, table[:1])


def test_identical_outputs_with_and_without_prefix_caching_and_less_prefill(tiny):
    g = torch.Generator().manual_seed(0)
    system = torch.randint(3, 128, (22,), generator=g).tolist()  # 5 full blocks of 4, then 2 tokens
    reqs = [Request(system + torch.randint(3, 128, (k,), generator=g).tolist(), 4, arrival_s=0.3 * i)
            for i, k in enumerate([3, 1, 6, 4, 2])]
    alone = [generate_greedy(tiny, torch.tensor([r.prompt]), 4).tokens[0].tolist() for r in reqs]
    runs = {}
    for on in (False, True):
        sched = ContinuousScheduler(tiny, PagedKVPool.for_model(tiny, 40, 4), max_batch=2, prefix_cache=on, cost=COST)
        out = sched.run(reqs)
        assert [r.output for r in out] == alone
        runs[on] = (out, sum(c.tokens for c in sched.calls if c.kind == "prefill"), sched)
    out, prefilled_with, sched = runs[True]
    assert [r.cached for r in out] == [0, 20, 20, 20, 20]  # every later request finds the 5 system blocks
    assert prefilled_with == runs[False][1] - 4 * 20
    assert sched.prefix_cache.hit_rate == pytest.approx(80 / sum(len(r.prompt) for r in reqs))
    assert all(o.ttft_s < runs[False][0][i].ttft_s for i, o in enumerate(out) if i)  # less to prefill, sooner


def test_shared_blocks_show_in_two_tables_and_cached_blocks_survive_their_request(tiny):
    system = list(range(3, 3 + 16))  # exactly 4 blocks of 4
    sched = ContinuousScheduler(tiny, PagedKVPool.for_model(tiny, 24, 4), max_batch=3, prefix_cache=True, cost=COST)
    first = sched.submit(Request(system + [40, 41], 6))
    sched.step()  # the first prompt is prefilled; its full blocks go into the cache
    second = sched.submit(Request(system + [50], 3, arrival_s=sched.now))
    sched.step()
    tables = [sched.admission_of(r).blocks for r in (first, second)]
    assert second.cached == 16 and tables[1][:4] == tables[0][:4]
    assert all(sched.pool.allocator.refcount(b) == 3 for b in tables[0][:4])  # two requests and the cache
    while sched.step():
        pass
    kept = sched.prefix_cache.blocks()
    assert sched.admission_of(first) is sched.admission_of(second) is None  # finished requests hold nothing
    assert all(sched.pool.allocator.refcount(b) == 1 for b in kept)  # only the cache holds them
    assert sched.pool.allocator.num_free == 24 - len(kept)


def test_a_full_pool_evicts_cached_blocks_before_preempting(tiny):
    sched = ContinuousScheduler(tiny, PagedKVPool.for_model(tiny, 8, 4), max_batch=2, prefix_cache=True, cost=COST)
    sched.run([Request(list(range(3, 3 + 20)), 2)])  # leaves 5 cached blocks behind
    assert len(sched.prefix_cache) == 5
    old_keys = set(sched.prefix_cache._blocks)
    out = sched.run([Request(list(range(60, 60 + 20)), 8)])  # needs 7 of 8 blocks: the cache must give 4 up
    assert out[0].preempted == 0 and len(out[0].output) == 8
    assert len(old_keys & set(sched.prefix_cache._blocks)) <= 1


# --------------------------------------------------------------------------- C16: TTFT against the hit rate


class RecomputingHits(ContinuousScheduler):
    """A prefix cache that finds and reports its hits (the blocks are shared, `cached` is set) but prefills the whole
    prompt all the same: the work skipped is not the tokens cached."""

    def _admit(self):
        joined = super()._admit()
        for a in self.running:
            if a.request in joined:
                a.computed = 0
        return joined


def _hit_sweep(tiny, prefix_cache=True, scheduler_class=ContinuousScheduler):
    from llm_anatomy.serve.cost import StepCost

    cost = StepCost(0.05, 0.002, 0.06, 0.001, 1e-6)
    g = torch.Generator().manual_seed(1)
    system = torch.randint(3, 128, (32,), generator=g).tolist()
    other = torch.randint(3, 128, (32,), generator=g).tolist()
    sched = scheduler_class(tiny, PagedKVPool.for_model(tiny, 40, 4), 1, prefix_cache=prefix_cache, cost=cost)
    sched.run([Request(system + [7, 8], 1)])  # warm the cache
    rates, ttfts, prefilled, cached, lengths = [], [], [], [], []
    for share in (0.0, 0.5, 1.0):
        keep = int(share * 32)
        calls = len(sched.calls)
        r = sched.run([Request(system[:keep] + other[keep:] + [9, 10], 1, arrival_s=sched.now)])[0]
        rates.append(r.cached / len(r.prompt))
        ttfts.append(r.ttft_s)
        prefilled.append(sum(c.tokens for c in list(sched.calls)[calls:] if c.kind == "prefill"))
        cached.append(r.cached)
        lengths.append(len(r.prompt))
    return rates, ttfts, prefilled, cached, lengths


def test_c16_holds_on_a_hit_rate_sweep(tiny):
    rates, ttfts, prefilled, cached, lengths = _hit_sweep(tiny)
    assert rates == sorted(rates) and rates[-1] > 0.9
    assert "C16 holds" in str(claim_hits_skip_work(rates, ttfts, prefilled, cached, lengths))


@pytest.mark.counterfactual("C16", "the prefix cache is off: every hit rate is 0")
def test_c16_fails_when_the_cache_is_off_or_a_hit_still_costs_its_prefill(tiny):
    with pytest.raises(ClaimFailed, match="C16 FAILED"):  # no cache: every hit rate 0, nothing to compare
        claim_hits_skip_work(*_hit_sweep(tiny, prefix_cache=False))
    rates, ttfts, prefilled, cached, lengths = _hit_sweep(tiny)
    with pytest.raises(ClaimFailed, match="C16 FAILED"):  # cached blocks prefilled again all the same
        claim_hits_skip_work(rates, ttfts, lengths, cached, lengths)
    with pytest.raises(ClaimFailed, match="C16 FAILED"):  # TTFT that does not fall with the hit rate
        claim_hits_skip_work(rates, ttfts[::-1], prefilled, cached, lengths)


@pytest.mark.counterfactual("C16", "a prefix cache that reports its hits but prefills the whole prompt again")
def test_c16_fails_on_an_engine_that_recomputes_its_hits(tiny):
    rates, ttfts, prefilled, cached, lengths = _hit_sweep(tiny, scheduler_class=RecomputingHits)
    assert rates[-1] > 0.9 and prefilled == lengths  # hits reported, every prompt token prefilled
    with pytest.raises(ClaimFailed, match="C16 FAILED.*every request False"):
        claim_hits_skip_work(rates, ttfts, prefilled, cached, lengths)


# --------------------------------------------------------------------------- C16: the same tokens, less prefill


def _served_both_ways(tiny, prompts, scheduler_class=ContinuousScheduler):
    out = {}
    for on in (False, True):
        sched = scheduler_class(tiny, PagedKVPool.for_model(tiny, 40, 4), max_batch=2, prefix_cache=on, cost=COST)
        served = sched.run([Request(p, 4, arrival_s=float(i)) for i, p in enumerate(prompts)])
        out[on] = (served, sum(c.tokens for c in sched.calls if c.kind == "prefill"))
    return out[False][0], out[True][0], out[False][1], out[True][1]


g = torch.Generator().manual_seed(2)
SYSTEM = torch.randint(3, 128, (12,), generator=g).tolist()
QUESTIONS = [SYSTEM + torch.randint(3, 128, (k,), generator=g).tolist() for k in (3, 5, 2)]


def test_c16_same_tokens_less_prefill_holds(tiny):
    verdict = str(claim_same_tokens_less_prefill(*_served_both_ways(tiny, QUESTIONS)))
    assert "C16 holds" in verdict and "(24 found in the cache)" in verdict  # 3 blocks of 4, by the 2nd and 3rd


@pytest.mark.counterfactual("C16", "block keys that hash a block's tokens alone, not chained to the block before")
def test_c16_fails_when_keys_are_not_chained(real, monkeypatch):
    import hashlib

    import llm_anatomy.serve.prefix_cache as pc
    from llm_anatomy.model.scratch import ScratchLlama

    model, tok = ScratchLlama.from_hf(real.model), real.tokenizer
    block = tok(" one two three four").input_ids  # 4 tokens: one block of 4, three times over in each prompt
    prompts = [block * 3 + tok(" five").input_ids, block * 3 + tok(" and").input_ids]

    def unchained(tokens, block_size):  # the bug: a block's key forgets what came before it
        return [hashlib.sha256(str(list(tokens[i:i + block_size])).encode()).hexdigest()
                for i in range(0, len(tokens) - block_size + 1, block_size)]

    with torch_threads(1):
        assert "C16 holds" in str(claim_same_tokens_less_prefill(*_served_both_ways(model, prompts)))
        monkeypatch.setattr(pc, "block_keys", unchained)
        plain, reused, before, after = _served_both_ways(model, prompts)
    assert reused[1].cached == 12  # all three of its blocks "found" in block 0 of the first prompt: positions 0-3
    with pytest.raises(ClaimFailed, match="C16 FAILED.*identical outputs with and without prefix caching: False"):
        claim_same_tokens_less_prefill(plain, reused, before, after)


@pytest.mark.counterfactual("C16", "a prefix cache that reports hits but prefills every prompt token again")
def test_c16_same_tokens_fails_when_hits_are_recomputed(tiny):
    with pytest.raises(ClaimFailed, match="C16 FAILED.*24 found in the cache"):
        claim_same_tokens_less_prefill(*_served_both_ways(tiny, QUESTIONS, RecomputingHits))


@pytest.mark.counterfactual("C16", "a prefix cache that never hits (a key that changes with every request)")
def test_c16_same_tokens_fails_when_the_cache_never_hits(tiny, monkeypatch):
    import itertools

    import llm_anatomy.serve.prefix_cache as pc

    fresh = itertools.count()
    real_keys = pc.block_keys
    monkeypatch.setattr(pc, "block_keys", lambda tokens, size: [f"{k}-{next(fresh)}" for k in real_keys(tokens, size)])
    with pytest.raises(ClaimFailed, match="C16 FAILED.*0 found in the cache"):
        claim_same_tokens_less_prefill(*_served_both_ways(tiny, QUESTIONS))


def test_a_salt_keeps_tenants_apart_and_no_salt_keeps_the_keys():
    tokens = list(range(40))
    plain = block_keys(tokens, 8)
    assert block_keys(tokens, 8, salt="") == plain  # no salt: the keys as before
    alice, bob = block_keys(tokens, 8, salt="tenant-a"), block_keys(tokens, 8, salt="tenant-b")
    assert alice == block_keys(tokens, 8, salt="tenant-a")  # one tenant shares its own blocks
    assert all(x != y for x, y in zip(alice, bob)) and all(x != y for x, y in zip(alice, plain))  # every block differs
    assert all(len(k) == 64 for k in alice)  # the whole SHA-256 digest
    with pytest.raises(CourseError, match="salt must be a string"):
        block_keys(tokens, 8, salt=7)
