"""The model runner: planned rows (prompt chunks and decodes over a paged pool) give each row's last-token logits as
the model gives them on the whole sequence, padded or flattened, in the calls the module text promises."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.serve.model_runner import ModelRunner
from llm_anatomy.serve.paged_kv import PagedKVPool, blocks_for

PROMPTS = [[5, 9, 11, 3, 8], [7, 8], [40, 2, 6, 6, 1, 9, 12]]


def _runner(model, flatten):
    calls = []

    def call(kind, rows, tokens, fn, context=0):
        calls.append((kind, rows, tokens, context))
        return fn()

    return ModelRunner(model, PagedKVPool.for_model(model, 32, 4), call, flatten), calls


@pytest.mark.parametrize("flatten", [False, True])
def test_rows_give_the_models_own_last_token_logits(tiny, flatten):
    runner, calls = _runner(tiny, flatten)
    tables = [runner.pool.allocate(blocks_for(len(p) + 1, 4)) for p in PROMPTS]
    first = runner.run(PROMPTS, tables, [0, 0, 0], decodes=0)  # [rows, vocab]: every prompt whole
    nxt = [[int(t)] for t in first.argmax(-1)]
    # an iteration of two decodes and one prompt chunk: rows 0 and 1 decode, row 2 is a new prompt's first 3 tokens
    fresh = runner.pool.allocate(1)
    second = runner.run(nxt[:2] + [PROMPTS[2][:3]], tables[:2] + [fresh], [5, 2, 0], decodes=2)
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            assert torch.allclose(first[i], tiny(torch.tensor([p]))[0, -1], atol=1e-5)
        for i in range(2):
            assert torch.allclose(second[i], tiny(torch.tensor([PROMPTS[i] + nxt[i]]))[0, -1], atol=1e-5)
        assert torch.allclose(second[2], tiny(torch.tensor([PROMPTS[2][:3]]))[0, -1], atol=1e-5)
    if flatten:
        assert [c[0] for c in calls] == ["mixed", "mixed"] and calls[1] == ("mixed", 3, 5, 7)
    else:
        assert [c[0] for c in calls] == ["prefill", "decode", "prefill"]
        assert calls[1] == ("decode", 2, 2, 7) and calls[2] == ("prefill", 1, 3, 0)
