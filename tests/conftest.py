"""Shared fixtures: a tiny random-weight Llama for fast tests, the real model for integration tests."""

from __future__ import annotations

import pytest
import torch


def tiny_llama_config(**overrides):
    """A small Llama config (random weights) with the default model's layout: GQA, tied embeddings."""
    from transformers import LlamaConfig

    settings = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                    rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                    bos_token_id=1, eos_token_id=2, pad_token_id=2)
    settings.update(overrides)
    return LlamaConfig(**settings)


def tiny_llama(seed: int = 0, **overrides):
    """A random-weight LlamaForCausalLM in fp32 eval mode, reproducible from `seed`."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(**overrides))
    return model.eval()


@pytest.fixture
def tiny_model():
    return tiny_llama()


@pytest.fixture(scope="session")
def real():
    """The real default model on the CPU in fp32 (fetched and converted once into the cache)."""
    from llm_anatomy import load_model

    return load_model(device="cpu", verbose=False)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "real" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True, scope="session")
def _no_model_hub():
    """No test may need a model hub: make any attempt fail fast instead of hanging."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    yield
