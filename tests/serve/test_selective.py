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
