"""Solutions to the exercises of notebook 05 (generation)."""

from __future__ import annotations

import torch


def greedy_choice(logits: torch.Tensor) -> int:
    """Exercise 5.1: the id of the most likely next token (greedy decoding)."""
    return int(logits.argmax())


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Exercise 5.2: the probabilities after dividing the logits by the temperature."""
    return torch.softmax(logits / temperature, dim=-1)


def keep_top_k(logits: torch.Tensor, k: int) -> set[int]:
    """Exercise 5.3: the set of token ids top-k keeps: the k highest logits."""
    return set(torch.topk(logits, k).indices.tolist())
