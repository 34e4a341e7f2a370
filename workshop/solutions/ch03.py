"""Solutions to the exercises of notebook 03 (attention)."""

from __future__ import annotations

import math

import torch


def attend(q, k, v):
    """Exercise 3.1: one causal head: scores, mask, softmax, weighted sum."""
    n = q.shape[0]
    scores = q @ k.T / math.sqrt(q.shape[-1])  # [seq, seq]: row = query, column = key
    allowed = torch.ones(n, n, dtype=torch.bool).tril()  # query i sees keys 0..i
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def expand_kv(k, n_heads):
    """Exercise 3.2: each K/V head repeated for its group of query heads, in order: [kv, seq, d] -> [n_heads, seq, d]."""
    return k.repeat_interleave(n_heads // k.shape[0], dim=0)
