"""One flattened call per iteration (serve/flat_step.py, ContinuousScheduler(flatten=True)): its logits equal the
padded view's, and the engine gives token for token what the padded engine and one request at a time give, with
chunked prefill, prefix caching, preemption and seeded sampling; bad input refused."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.decode import generate_greedy, left_pad, prefill
from llm_anatomy.generate.sampling import SamplingParams
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.serve.batching import Request
from llm_anatomy.serve.flat_step import flat_step
from llm_anatomy.serve.paged_kv import PagedKVPool, RaggedPagedView
from llm_anatomy.serve.scheduler import ContinuousScheduler
from llm_anatomy.serve.selective import flattened_prefill

COST = lambda tokens, rows, **_: 0.01 + 0.001 * tokens  # noqa: E731  a clock that does not depend on the machine


def _both_ways(model, tokens, cached, block_size=4):
    """Rows with `cached[i]` positions already in a pool and the rest of `tokens[i]` new: the flattened pass's logits
    and the padded view's `[rows, vocab]`, each on its own pool filled the same way."""
    out = []
    for flat in (True, False):
        pool = PagedKVPool.for_model(model, 64, block_size)
        tables = [pool.allocate(-(-len(t) // block_size)) for t in tokens]
        before = [(tb, t[:c]) for tb, t, c in zip(tables, tokens, cached) if c]
        ids, _ = left_pad([t for _, t in before])
        view = RaggedPagedView(pool, [tb for tb, _ in before], [0] * len(before), [len(t) for _, t in before])
        prefill(model, ids, view, positions=view.positions, attention_mask=view.mask)
        news = [t[c:] for t, c in zip(tokens, cached)]
        if flat:
            out.append(flat_step(model, pool, tables, cached, news))
        else:
            view = RaggedPagedView(pool, tables, cached, [len(n) for n in news])
            out.append(prefill(model, left_pad(news)[0], view, positions=view.positions,
                               attention_mask=view.mask).logits[:, -1])
    return out


def test_the_flattened_pass_equals_the_padded_view_and_each_row_alone(tiny):
    g = torch.Generator().manual_seed(0)
    tokens = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (9, 5, 12, 1, 8)]
    cached = [8, 0, 4, 0, 7]  # decodes (one new token after a cache), whole prompts and a chunk after a cache
    flat, padded = _both_ways(tiny, tokens, cached)
    assert flat.shape == (5, 128)
    torch.testing.assert_close(flat, padded, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        for row, t in enumerate(tokens):
            torch.testing.assert_close(flat[row], tiny(torch.tensor([t]))[0, -1], atol=1e-5, rtol=1e-5)


def _runs(model, requests, blocks=64, block_size=4, **kwargs):
    padded, flat = (ContinuousScheduler(model, PagedKVPool.for_model(model, blocks, block_size), flatten=f,
                                        cost=COST, **kwargs) for f in (False, True))
    return padded, padded.run(requests), flat, flat.run(requests)


@pytest.mark.parametrize("max_batch, budget, block_size, blocks, prefix_cache", [
    (4, None, 4, 64, False), (4, 3, 4, 64, False), (6, 1, 1, 64, False), (3, 16, 16, 64, False),
    (6, None, 4, 8, False),  # too few blocks for everyone: preemption by recompute
    (4, 5, 4, 24, True)])
def test_one_flattened_call_per_iteration_gives_the_padded_engines_tokens(tiny, trace, max_batch, budget,
                                                                          block_size, blocks, prefix_cache):
    padded, ours, flat, theirs = _runs(tiny, trace, blocks, block_size, max_batch=max_batch,
                                       max_batched_tokens=budget, prefix_cache=prefix_cache)
    alone = [generate_greedy(tiny, torch.tensor([r.prompt]), r.max_new_tokens).tokens[0].tolist() for r in trace]
    assert [r.output for r in theirs] == [r.output for r in ours] == alone
    assert [c.kind for c in flat.calls] == ["mixed"] * flat.steps  # exactly one call per iteration
    if budget != 1:  # the padded engine: a decode call and a prompt-chunk call in some iteration
        assert len(padded.calls) > padded.steps
    assert flat.pool.allocator.num_free + (len(flat.prefix_cache.blocks()) if prefix_cache else 0) == blocks
    if blocks == 8:
        assert sum(r.preempted for r in theirs) > 0
    if budget is not None:
        assert max(c.tokens for c in flat.calls) <= budget


def test_shared_prefixes_are_reused_by_the_flattened_engine(tiny):
    system = [7 + i % 50 for i in range(12)]
    requests = [Request(system + [60 + i, 61], 4, arrival_s=0.05 * i) for i in range(4)]
    _, ours, flat, theirs = _runs(tiny, requests, max_batch=2, prefix_cache=True)
    assert [r.output for r in theirs] == [r.output for r in ours]
    assert [r.cached for r in theirs] == [r.cached for r in ours] and max(r.cached for r in theirs) == 12


def test_seeded_sampling_draws_the_same_tokens_flattened(tiny):
    hot, cool = dict(temperature=1.5), dict(temperature=0.7, top_k=20, top_p=0.9)
    requests = [Request([5, 9, 11, 3], 12, params=SamplingParams(**hot, seed=1)), Request([7, 8], 12),
                Request([5, 9, 11, 3, 8, 8, 2], 10, params=SamplingParams(**hot, seed=2)),
                Request([40, 2, 6], 9, params=SamplingParams(**cool, seed=1))]
    _, ours, _, theirs = _runs(tiny, requests, max_batch=4, max_batched_tokens=3)
    assert [r.output for r in theirs] == [r.output for r in ours]


@pytest.mark.parametrize("tables, cached, new, words", [
    ([], [], [], "at least one row"),
    ([[0]], [0], [[]], "at least 1 new token"),
    ([[0], [1]], [0], [[5], [6]], "one block table"),
    ([[0]], [3], [[5, 6]], "needs 2 blocks"),
    ([[0]], [0], [[5, 500]], "token ids"),
])
def test_bad_rows_are_refused_before_anything_is_written(tiny, tables, cached, new, words):
    pool = PagedKVPool.for_model(tiny, 4, 4)
    with pytest.raises(CourseError, match=words):
        flat_step(tiny, pool, tables, cached, new)
    assert all(not k.any() for k in pool.keys)
    with pytest.raises(CourseError, match="True or False"):
        ContinuousScheduler(tiny, pool, flatten="yes")


def test_real_model_flattened_logits_equal_the_padded_views(real):
    model = ScratchLlama.from_hf(real.model)
    tokens = [real.tokenizer(p).input_ids for p in ["The capital of France is", "def fibonacci(n):",
                                                    "Once upon a time, in a small village, there lived"]]
    flat, padded = _both_ways(model, tokens, [len(tokens[0]) - 1, 0, 5], block_size=8)
    torch.testing.assert_close(flat, padded, atol=1e-4, rtol=1e-4)
    assert flat.argmax(-1).tolist() == padded.argmax(-1).tolist()


# --------------------------------------------------------------------------- bug 1: the context is each row's


@pytest.fixture(scope="module")
def short():
    """A tiny model whose context is 16 positions: three prompts of 8 each fit it, their 24 tokens together do not."""
    from llm_anatomy.weights.random import random_llama

    return ScratchLlama.from_hf(random_llama(max_position_embeddings=16))


def test_rows_that_each_fit_the_context_are_served_flattened_whatever_their_total(short):
    """Issue 45 bug 1: a flattened batch told the model it was one row of all its tokens, so the context was checked
    against their sum and this iteration (3 prompts of 8, a context of 16) was refused."""
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 128, (8,), generator=g).tolist() for _ in range(3)]
    pool = PagedKVPool.for_model(short, 16, 4)
    tables = [pool.allocate(2) for _ in prompts]
    logits = flat_step(short, pool, tables, [0, 0, 0], prompts)  # 24 tokens in one call
    flat = flattened_prefill(short, prompts)
    with torch.no_grad():
        for row, p in enumerate(prompts):
            alone = short(torch.tensor([p]))[0]  # [8, vocab]
            torch.testing.assert_close(logits[row], alone[-1], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(flat[row], alone, atol=1e-5, rtol=1e-5)
    requests = [Request(p, 6) for p in prompts]  # each row reaches 14 positions of 16
    padded, ours, flat_engine, theirs = _runs(short, requests, max_batch=3)  # max_batched_tokens=None
    alone = [generate_greedy(short, torch.tensor([r.prompt]), 6).tokens[0].tolist() for r in requests]
    assert [r.output for r in theirs] == [r.output for r in ours] == alone
    assert flat_engine.calls[0].tokens == 24  # the whole iteration, 24 tokens, in one flattened call


def test_a_row_past_the_context_is_still_refused_flattened(short):
    pool = PagedKVPool.for_model(short, 16, 4)
    tables = [pool.allocate(5), pool.allocate(1)]
    with pytest.raises(CourseError, match="17 positions exceed the model's context of 16"):
        flat_step(short, pool, tables, [16, 0], [[5], [6]])
    assert all(not k.any() for k in pool.keys)  # refused before anything was written
    with pytest.raises(CourseError, match="17 positions exceed the model's context of 16"):
        flattened_prefill(short, [list(range(3, 20)), [5]])
