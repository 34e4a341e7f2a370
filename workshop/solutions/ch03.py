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


def grouped_scores(q, k):
    """Exercise 3.3: every query head against its group's K, no copy: stack each group's queries as extra rows."""
    heads, q_len, d = q.shape
    kv, k_len = k.shape[0], k.shape[1]
    stacked = q.reshape(kv, (heads // kv) * q_len, d)  # [kv_heads, n_rep * q_len, d]: a group's heads one under another
    scores = stacked @ k.transpose(-2, -1) / math.sqrt(d)  # [kv_heads, n_rep * q_len, k_len]
    return scores.view(heads, q_len, k_len)
