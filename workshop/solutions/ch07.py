"""Solutions to the exercises of notebook 07 (prefill and decode)."""

from __future__ import annotations

import math


def decode_work(cfg, past, bytes_per_element):
    """Exercise 7.1: FLOPs and bytes of one decode step (one token, batch 1) after `past` cached positions."""
    d, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * cfg.intermediate_size  # q, k, v, o, gate, up, down
    weights = cfg.num_layers * per_layer + cfg.vocab_size * d  # + the LM head (one position's logits)
    positions = past + 1  # the new token attends to every cached position and to itself
    flops = 2 * weights + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * positions  # q.k and weights.v
    moved = weights * bytes_per_element + 2 * cfg.num_layers * kv * bytes_per_element * positions  # + K and V read
    return flops, moved


def ridge_batch(ridge, bytes_per_element):
    """Exercise 7.2: intensity ~ 2 x batch / bytes per number while the weights dominate the bytes."""
    return math.ceil(ridge * bytes_per_element / 2)


def step_bounds(flops, bytes_moved, ops, peak_flops, bandwidth, per_op_s):
    """Exercise 7.4: the three lower bounds on a step's time (seconds), and the regime: the largest of them."""
    bounds = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": ops * per_op_s}
    return bounds, max(bounds, key=bounds.get)


def predict_step_s(batch, context, weight_bytes, kv_bytes_per_token, params, bandwidth, flops_per_s):
    """Exercise 7.3: the floor under a decode step (seconds): the weights once plus every sequence's cache over the
    bandwidth, against 2 FLOPs per parameter per sequence over the peak; the larger wins."""
    memory = (weight_bytes + batch * context * kv_bytes_per_token) / bandwidth
    compute = 2 * batch * params / flops_per_s
    return max(memory, compute)
