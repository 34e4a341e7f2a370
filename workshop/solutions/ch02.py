"""Solutions to the exercises of notebook 02 (embeddings and positions)."""

from __future__ import annotations

import torch


def embed(ids, table):
    """Exercise 2.1: a one-hot row per id, times the table: [n, vocab] @ [vocab, hidden] -> [n, hidden]."""
    return torch.nn.functional.one_hot(ids, table.shape[0]).to(table.dtype) @ table


def cosine(a, b):
    """Exercise 2.2: the dot product divided by both lengths."""
    return float(a @ b / (torch.linalg.norm(a) * torch.linalg.norm(b)))


def frequencies(head_dim, theta):
    """Exercise 2.3: theta ** (-2i / head_dim) for each pair i."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
