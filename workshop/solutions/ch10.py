"""Solutions to the exercises of notebook 10 (beyond one device)."""

from __future__ import annotations


def column_split(weight, rank, tp):
    """Exercise 10.1: rank's block of outputs: rows rank*k to (rank+1)*k - 1 of a weight stored [out, in]."""
    k = weight.shape[0] // tp
    return weight[rank * k:(rank + 1) * k]


def row_split(weight, rank, tp):
    """Exercise 10.1: rank's block of inputs: columns rank*k to (rank+1)*k - 1 (its output is a partial sum)."""
    k = weight.shape[1] // tp
    return weight[:, rank * k:(rank + 1) * k]


def traffic(cfg, batch, tokens, bytes_per_element):
    """Exercise 10.2: all-reduces of one forward pass (2 per block + the embedding's) and the bytes of each."""
    return 2 * cfg.num_layers + 1, batch * tokens * cfg.hidden_size * bytes_per_element


def predict(compute_s, tp, layers, latency_s, bytes_per_s, message_bytes):
    """Exercise 10.3: a TP step, seconds: each rank's share of the compute, plus 2 all-reduces per block."""
    return compute_s / tp + 2 * layers * (latency_s + message_bytes / bytes_per_s)
