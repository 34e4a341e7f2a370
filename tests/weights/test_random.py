"""Random-weight Llama shapes (weights/random.py): each builds the model it is named after, reproducibly."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.model.config import ScratchConfig
from llm_anatomy.weights.random import RANDOM_SHAPES, random_config, random_llama


def _parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied embeddings counted once


@pytest.mark.parametrize("size, published", [
    ("1b", 1_235_814_400),  # Llama-3.2-1B, as its model card counts it (1.24B)
    ("360m", 361_821_120),  # SmolLM2-360M
    ("135m", 134_515_008),  # SmolLM2-135M
])
def test_each_shape_has_the_parameter_count_of_the_model_it_follows(size, published):
    assert _parameters(random_llama(size, device="meta")) == published  # meta: shapes only, no memory


def test_the_135m_shape_is_the_default_models_own(real):
    import dataclasses

    ours, theirs = ScratchConfig.from_hf(random_config("135m")), ScratchConfig.from_hf(real.config)
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps)  # the GGUF file stores it as a float32
    assert ours == dataclasses.replace(theirs, rms_norm_eps=ours.rms_norm_eps)
    assert _parameters(real.model) == _parameters(random_llama("135m", device="meta"))


def test_the_same_seed_gives_the_same_weights_and_changes_apply():
    a, b, c = random_llama(seed=1), random_llama(seed=1), random_llama(seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.model.layers[0].mlp.up_proj.weight, c.model.layers[0].mlp.up_proj.weight)
    mqa = random_llama(num_key_value_heads=1, tie_word_embeddings=False)
    assert mqa.model.layers[0].self_attn.k_proj.weight.shape[0] == mqa.config.head_dim  # one KV head
    assert mqa.lm_head.weight.data_ptr() != mqa.model.embed_tokens.weight.data_ptr()


def test_a_random_model_runs_frozen_in_the_dtype_asked():
    model = random_llama(dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16 and not model.training
    assert not any(p.requires_grad for p in model.parameters())  # inference: no autograd graph is recorded
    assert torch.get_default_dtype() == torch.float32  # put back after building
    ids = torch.tensor([[1, 5, 9]])
    assert model(ids).logits.shape == (1, 3, RANDOM_SHAPES["tiny"]["vocab_size"])


def test_an_unknown_size_is_refused_clearly():
    with pytest.raises(CourseError, match="Unknown model size '7b'"):
        random_llama("7b")
