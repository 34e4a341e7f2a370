"""The logit lens: final norm + LM head on each layer's residual stream; the last layer is the real prediction."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy import CourseError
from llm_anatomy.model.logit_lens import lens_logits, logit_lens
from llm_anatomy.model.scratch import ScratchLlama

from llm_anatomy.weights.random import random_llama


def test_the_lens_on_the_last_layer_gives_the_models_logits():
    model = ScratchLlama.from_hf(random_llama())
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    out = model.trace(ids)
    lens = lens_logits(out.hidden_states, model.norm, model.lm_head, position=4)
    assert lens.shape == (3, 2, 128)  # embeddings + 2 layers
    assert torch.allclose(lens[-1], out.logits[:, 4], atol=1e-6)
    assert torch.allclose(lens[0], model.lm_head(model.norm(model.embed_tokens(ids[:, 4]))), atol=1e-6)
    with pytest.raises(CourseError, match="position must be"):
        lens_logits(out.hidden_states, model.norm, model.lm_head, position=9)
    with pytest.raises(CourseError, match="No hidden states"):
        lens_logits([], model.norm, model.lm_head)


def test_rows_end_with_the_models_answer():
    model = ScratchLlama.from_hf(random_llama())
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    rows = logit_lens(model, ids)
    assert [r.layer for r in rows] == [0, 1, 2]
    assert rows[-1].target_rank == 0 and rows[-1].top_token == str(int(model(ids)[0, -1].argmax()))
    assert all(0 <= r.target_probability <= r.top_probability <= 1 for r in rows)


def test_the_real_model_forms_paris_in_its_later_layers(real):
    model = ScratchLlama.from_hf(real.model)
    ids = torch.tensor([real.tokenizer.encode("The capital of France is")])
    rows = logit_lens(model, ids, real.tokenizer)
    assert len(rows) == 31 and rows[-1].top_token == " Paris"
    assert rows[0].target_rank > 0  # the embedding alone does not predict it
    assert rows[-1].target_probability > rows[5].target_probability


def test_the_lens_grid_reads_every_layer_at_every_position():
    from llm_anatomy.model.logit_lens import lens_grid

    model = ScratchLlama.from_hf(random_llama())
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(2))
    grid = lens_grid(model, ids)
    assert grid.top_probabilities.shape == (3, 7) and len(grid.top_tokens) == 3 and len(grid.top_tokens[0]) == 7
    out = model.trace(ids)
    for position in (0, 3, 6):
        probs = torch.softmax(lens_logits(out.hidden_states, model.norm, model.lm_head, position)[:, 0], dim=-1)
        assert torch.allclose(grid.top_probabilities[:, position], probs.max(-1).values, atol=1e-6)
        assert [row[position] for row in grid.top_tokens] == [str(int(i)) for i in probs.argmax(-1)]
    assert grid.top_tokens[-1] == [str(int(i)) for i in out.logits[0].argmax(-1)]  # the last row is the model
    with pytest.raises(CourseError, match="at most 4 positions"):
        lens_grid(model, ids, max_tokens=4)


def test_a_trace_already_made_gives_the_same_rows_and_a_wrong_one_is_refused():
    model = ScratchLlama.from_hf(random_llama())
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(1))
    assert logit_lens(model, ids, traced=model.trace(ids)) == logit_lens(model, ids)
    for wrong in (model.trace(ids, keep_hidden=False), model.trace(ids[:, :5]), model.trace(ids, logits_to_keep=1)):
        with pytest.raises(CourseError, match="traced must be model.trace"):
            logit_lens(model, ids, traced=wrong)
