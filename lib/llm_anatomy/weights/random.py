"""Llama-shaped models with random weights: for timing at realistic sizes, and for fast tests.

Speed does not depend on the weight values, so a 1B-shaped model with random weights is an honest
stand-in for timing when no such checkpoint can be downloaded (CI, a GPU machine with no network).
The "tiny" shape has the default model's layout (grouped-query attention, tied embeddings) at a size that runs in
milliseconds: every test and exercise that needs a model but not the real one builds it here.
"""

from __future__ import annotations

import torch

from ..errors import CourseError

# "1b" follows Llama-3.2-1B, "360m" SmolLM2-360M, "135m" SmolLM2-135M; "tiny" is for tests and exercises.
RANDOM_SHAPES = {
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=8192,
               rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                 rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "360m": dict(vocab_size=49152, hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
                 num_attention_heads=15, num_key_value_heads=5, head_dim=64, max_position_embeddings=8192,
                 rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "tiny": dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                 rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
}
SPECIAL_IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)


def random_config(size: str = "tiny", **changes):
    """The transformers LlamaConfig of a named shape (RANDOM_SHAPES), with any of its fields changed.

    changes: config fields to set instead, e.g. num_key_value_heads=1 for multi-query attention.
    """
    from transformers import LlamaConfig

    if size not in RANDOM_SHAPES:
        raise CourseError(f"Unknown model size {size!r}: use one of {', '.join(RANDOM_SHAPES)}.")
    return LlamaConfig(**{**SPECIAL_IDS, **RANDOM_SHAPES[size], **changes})


def random_llama(size: str = "tiny", device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 seed: int = 0, **changes):
    """A transformers LlamaForCausalLM of a named shape with random weights, on `device` in `dtype`, in eval mode.

    The same `seed` gives the same weights. changes: config fields to set instead (see random_config). Like
    load_model's, the weights are frozen (requires_grad False); `requires_grad_(True)` to take a gradient.
    """
    from transformers import LlamaForCausalLM

    config = random_config(size, **changes)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # build the weights where they will live: fast, and no CPU copy
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)
