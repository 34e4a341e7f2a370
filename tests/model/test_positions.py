"""Positions passed in (issue 45 item 2): the model checks the context once, against the positions of the new
tokens, by one rule for every cache: the largest must be below max_position_embeddings. Each of the course's six
caches (and views) accepts the last position and refuses the next one, with the same sentence."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.decode import SlotWriter, StaticDecoder, decode_step, extend_mask, left_pad, prefill
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.serve.flat_step import FlatPagedBatch, flat_step
from llm_anatomy.serve.paged_kv import PagedKVPool, RaggedPagedView
from llm_anatomy.serve.selective import FlatBatch, flat_positions
from llm_anatomy.weights.random import random_llama

CONTEXT = 8
REFUSED = "9 positions exceed the model's context of 8 tokens"


@pytest.fixture(scope="module")
def short():
    return ScratchLlama.from_hf(random_llama(max_position_embeddings=CONTEXT))


def _ids(n):
    return torch.arange(3, 3 + n)[None]  # [1, n]


def _refusal(call) -> str:
    with pytest.raises(CourseError) as err:
        call()
    return str(err.value)


def test_each_cache_accepts_the_last_position_and_refuses_the_next_the_same_way(short):
    pool = PagedKVPool.for_model(short, 16, 4)
    messages = []
    # KVCache and PagedSequenceCache count their positions: the new tokens follow their length
    for cache in (short.new_cache(1, 12), pool.new_cache(1)):
        prefill(short, _ids(CONTEXT), cache)  # positions 0 .. 7: the last one fits
        messages.append(_refusal(lambda: decode_step(short, _ids(1), cache)))  # position 8
        assert cache.length == CONTEXT  # the refusal changed nothing
    # RaggedPagedView: the view computes its rows' positions, the caller passes them
    table = pool.allocate(3)
    for past, fits in ((CONTEXT - 1, True), (CONTEXT, False)):
        view = RaggedPagedView(pool, [table], [past], [1])
        call = lambda: short.trace(_ids(1), view, view.mask, positions=view.positions)  # noqa: E731
        call() if fits else messages.append(_refusal(call))
    # FlatBatch: each token at its own row's position, whatever the stream's total
    for news, fits in (([CONTEXT, CONTEXT], True), ([CONTEXT, CONTEXT + 1], False)):
        call = lambda: short.trace(_ids(sum(news)), FlatBatch(news), positions=flat_positions([0, 0], news))  # noqa
        call() if fits else messages.append(_refusal(call))
    # FlatPagedBatch, through the model and through flat_step (which checks on the host before writing)
    tables = [pool.allocate(3)]
    for past, fits in ((CONTEXT - 1, True), (CONTEXT, False)):
        batch = FlatPagedBatch(pool, tables, [past], [1])
        call = lambda: short.trace(_ids(1), batch, positions=flat_positions([past], [1]))  # noqa: E731
        call() if fits else messages.append(_refusal(call))
    flat_step(short, pool, tables, [CONTEXT - 1], [[5]])
    messages.append(_refusal(lambda: flat_step(short, pool, tables, [CONTEXT], [[5]])))
    # SlotWriter: the fixed-shape step passes pos and the written slots
    cache = short.new_cache(1, CONTEXT + 1)
    for pos, fits in ((CONTEXT - 1, True), (CONTEXT, False)):
        at = torch.tensor([pos])
        mask = (torch.arange(CONTEXT + 1) <= at)[None]  # [1, max_len]
        call = lambda: short.trace(_ids(1), SlotWriter(cache, at.clone()), mask, positions=at)  # noqa: E731
        call() if fits else messages.append(_refusal(call))
    assert len(messages) == 7 and all(REFUSED in m for m in messages) and len(set(messages)) == 1, messages


def test_the_fixed_shape_decoder_refuses_slots_beyond_the_context_at_the_start(short):
    """Its step reads no position back (that would break the CUDA graph): the decoder itself refuses a max_len that
    would take a position past the context, and serves one that reaches the last position."""
    with pytest.raises(CourseError, match=REFUSED):
        StaticDecoder(short, 1, CONTEXT + 1)
    decoder = StaticDecoder(short, 1, CONTEXT)
    prompt = _ids(3)
    tokens = decoder.generate(prompt, CONTEXT - 3)  # the last token sits at position 7
    assert tokens.tolist() == [prefill_greedy(short, prompt, CONTEXT - 3)]


def prefill_greedy(model, prompt, n):
    from llm_anatomy.generate.decode import generate_greedy

    return generate_greedy(model, prompt, n).tokens[0].tolist()


def test_a_cache_that_counts_no_positions_needs_them_given(short):
    pool = PagedKVPool.for_model(short, 4, 4)
    view = RaggedPagedView(pool, [pool.allocate(1)], [0], [2])
    with pytest.raises(CourseError, match="pass positions="):
        short.trace(_ids(2), view)
    with pytest.raises(CourseError, match=r"positions must be whole numbers of shape \[seq\]"):
        short.trace(_ids(2), view, positions=torch.tensor([0, 1, 2]))
    with pytest.raises(CourseError, match="positions must be whole numbers"):
        short.trace(_ids(2), view, positions=torch.tensor([0.0, 1.0]))


def test_positions_given_are_the_ones_used(short):
    """positions act as transformers' position_ids: the default equals them passed, and other distances between the
    tokens move the logits."""
    ids = _ids(5)
    default = short(ids)
    assert torch.equal(short(ids, positions=torch.arange(5)), default)
    assert torch.equal(short(ids, positions=torch.arange(5)[None]), default)
    assert torch.allclose(short(ids, positions=torch.arange(1, 6)), default, atol=1e-5)  # RoPE sees distances only
    assert not torch.allclose(short(ids, positions=torch.tensor([0, 1, 2, 3, 7])), default, atol=1e-3)


def test_a_mask_whose_width_is_not_the_keys_is_refused(short):
    cache = short.new_cache(1, 8)
    with pytest.raises(CourseError, match="attention_mask must be"):
        short(_ids(3), cache, torch.ones(1, 4))  # 3 keys, 4 columns
    assert cache.length == 0
    view = RaggedPagedView(PagedKVPool.for_model(short, 4, 4), [[0]], [0], [2])
    with pytest.raises(CourseError, match="one column per key attention reads: 2 keys, not 3"):
        short.trace(_ids(2), view, torch.ones(1, 3, dtype=torch.bool), positions=view.positions)
    with pytest.raises(CourseError, match="logits_at"):
        short.trace(_ids(2), logits_to_keep=torch.tensor([1]))


def test_padded_generation_with_the_mask_helper_gives_each_row_its_own_tokens(short):
    """The decode loop keeps the batch's mask and extends it each step (as transformers' generate does): each row of a
    left-padded batch gets the tokens it gets alone."""
    prompts = [[5, 6, 7, 8], [9], [10, 11]]
    ids, mask = left_pad(prompts, pad_id=2)
    cache = short.new_cache(3, 8)
    token = prefill(short, ids, cache, attention_mask=mask).logits[:, -1].argmax(-1, keepdim=True)  # [3, 1]
    out = [token]
    for _ in range(3):
        mask = extend_mask(mask)
        token = decode_step(short, token, cache, attention_mask=mask).logits[:, -1].argmax(-1, keepdim=True)
        out.append(token)
    got = torch.cat(out, 1).tolist()
    assert got == [prefill_greedy(short, torch.tensor([p]), 4) for p in prompts]
    assert extend_mask(None) is None and extend_mask(torch.ones(2, 3, dtype=torch.long), 2).tolist() == [[1] * 5] * 2
