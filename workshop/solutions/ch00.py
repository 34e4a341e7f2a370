"""Solutions to the exercises of notebook 00 (set-up and tour)."""

from __future__ import annotations


def count_parameters(model) -> int:
    """Exercise 0.1: every parameter tensor once (a tied table is one tensor), its numbers summed."""
    return sum(p.numel() for p in model.parameters())


def eos_token(tokenizer) -> str:
    """Exercise 0.2: the token that closes every turn of the chat template."""
    return tokenizer.eos_token  # "<|im_end|>"
