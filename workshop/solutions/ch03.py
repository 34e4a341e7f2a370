"""Solutions to the exercises of notebook 03 (attention)."""

from __future__ import annotations

import math

import torch


def mask(n):
    """Exercise 3.1: True on and below the diagonal (query i sees keys 0..i)."""
    return torch.ones(n, n, dtype=torch.bool).tril()


def attend(q, k, v):
    """Exercise 3.2: one causal head: scores, mask, softmax, weighted sum."""
    scores = q @ k.T / math.sqrt(q.shape[-1])  # [seq, seq]
    scores = scores.masked_fill(~mask(q.shape[0]), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# Exercise 3.3: 9 query heads over 3 KV heads: groups of 3, so head 7 reads KV head 7 // 3
kv_head = 7 // 3
