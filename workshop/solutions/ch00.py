"""Solutions to the exercises of notebook 00 (set-up and tour)."""

from __future__ import annotations


def parameter_count_millions(loaded) -> float:
    """Exercise 0.1: the parameter count in millions (tied embeddings are one tensor, counted once)."""
    return sum(p.numel() for p in loaded.model.parameters()) / 1e6


def eos_token(tokenizer) -> str:
    """Exercise 0.2: the token that closes every turn of the chat template."""
    return tokenizer.eos_token  # "<|im_end|>"
