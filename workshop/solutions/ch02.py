"""Solutions to the exercises of notebook 02 (embeddings and positions)."""

from __future__ import annotations

import torch


def embed(ids, table):
    """Exercise 2.1: a one-hot row per id, times the table: [..., vocab] @ [vocab, hidden] -> [..., hidden]."""
    return torch.nn.functional.one_hot(ids, table.shape[0]).to(table.dtype) @ table


def neighbours(table, ids, k):
    """Exercise 2.2: the k rows most similar by cosine to each query row, most similar first, the query left out."""
    unit = table.float() / table.float().norm(dim=-1, keepdim=True)  # [vocab, hidden], every row of length 1
    sims = unit[ids] @ unit.T  # [queries, vocab]: every cosine at once
    sims[torch.arange(len(ids)), ids] = -2.0  # below any cosine: a token is not its own neighbour
    return sims.topk(k, dim=-1).indices  # [queries, k]


def rope(x, positions, theta):
    """Exercise 2.3: pair j = (x[:, j], x[:, j + d/2]) turned by position * theta ** (-2j / d) radians."""
    d = x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2] radians per position
    a = positions[:, None].double() * freqs  # [seq, d/2]
    x1, x2 = x[:, :d // 2].double(), x[:, d // 2:].double()
    return torch.cat([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], dim=-1).to(x.dtype)
