"""Selective batching (serve/selective.py): the flattened stream's logits equal the padded batch's at every real
position, and each prompt's alone, on the tiny random model."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.decode import left_pad
from llm_anatomy.serve.selective import flattened_prefill, padded_tokens


def test_the_flattened_stream_equals_the_padded_batch_and_each_prompt_alone(tiny):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (7, 2, 11, 1)]
    with torch.no_grad():
        flat = flattened_prefill(tiny, prompts)
        ids, mask = left_pad(prompts)  # [rows, longest] each
        padded = tiny(ids, attention_mask=mask)  # [rows, longest, vocab]
        for row, (p, logits) in enumerate(zip(prompts, flat)):
            assert logits.shape == (len(p), 128)
            torch.testing.assert_close(logits, padded[row, -len(p):], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(logits, tiny(torch.tensor([p]))[0], atol=1e-5, rtol=1e-5)
    assert padded_tokens(prompts) == 44 and sum(map(len, prompts)) == 21


def test_no_prompt_or_an_empty_one_is_refused(tiny):
    with pytest.raises(CourseError):
        flattened_prefill(tiny, [])
    with pytest.raises(CourseError):
        flattened_prefill(tiny, [[5], []])


def test_the_flattened_batch_is_one_more_cache_for_the_models_own_forward(tiny):
    from llm_anatomy.serve.selective import FlatBatch, flat_positions

    batch = FlatBatch([3, 1, 2])
    assert flat_positions([0, 5, 2], [3, 1, 2]).tolist() == [0, 1, 2, 5, 2, 3]  # each token at its own row's position
    assert batch.spans == [(0, 3), (3, 4), (4, 6)] and batch.last.tolist() == [2, 3, 5]
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with pytest.raises(CourseError, match="positions"):  # the builder's to give: the batch counts none
        tiny(ids, batch)
    with pytest.raises(CourseError, match="attention_mask"):  # a row's keys are its own stretch, not the stream
        tiny(ids, batch, torch.ones(1, 6), positions=flat_positions([0, 0, 0], [3, 1, 2]))
    calls = []
    original = tiny.layers[0].self_attn.kernel
    tiny.layers[0].self_attn.kernel = lambda q, k, v, **kw: (calls.append(q.shape[2]), original(q, k, v, **kw))[1]
    try:
        flattened_prefill(tiny, [[5, 6, 7], [8], [9, 10]])
    finally:
        del tiny.layers[0].self_attn.kernel
    assert calls == [3, 1, 2]  # the layer's own attention, once per row over that row only
    with pytest.raises(CourseError, match="token ids from 0"):
        flattened_prefill(tiny, [[5, 6], [10**6]])  # the model's own checks apply
