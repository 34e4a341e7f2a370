"""Tiny random-weight Llama models for fast tests (import: `from tiny_models import tiny_llama`).

Kept out of conftest.py: tests/browser/ has a conftest of its own, so `from conftest import ...`
would be ambiguous when the whole tree runs.
"""

from __future__ import annotations

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
