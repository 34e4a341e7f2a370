"""Solutions to the exercises of notebook 09 (making decode fast)."""

from __future__ import annotations

import numpy as np
import torch


def dequantize_block(block: np.ndarray) -> torch.Tensor:
    """Exercise 9.1: the 32 weights of one 20-byte Q4_1 block: d * code + m.

    Bytes 0-1: the scale d (fp16); bytes 2-3: the minimum m (fp16); bytes 4-19: the codes, byte j holding
    weight j in its low nibble and weight j + 16 in its high nibble.
    """
    d = float(block[0:2].view(np.float16)[0])
    m = float(block[2:4].view(np.float16)[0])
    packed = block[4:20]
    codes = np.concatenate([packed & 0x0F, packed >> 4])  # weights 0..15, then 16..31
    return torch.tensor(codes, dtype=torch.float32) * np.float32(d) + np.float32(m)


def online_update(m, l, o, scores, v):
    """Exercise 9.2: fold one block of scores [q, block] and values [block, d] into the running state."""
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    rescale = torch.exp(m - m_new)  # exp(-inf) = 0 on the first block: nothing to rescale yet
    p = torch.exp(scores - m_new)
    return m_new, l * rescale + p.sum(dim=-1, keepdim=True), o * rescale + p @ v


def acceptance_probability(p, q, x):
    """Exercise 9.3: keep the draft token x with probability min(1, p(x) / q(x))."""
    return min(1.0, float(p[x] / q[x]))


def residual(p, q):
    """Exercise 9.3: on rejection, sample from what the draft under-proposed: max(p - q, 0), normalised."""
    r = (p - q).clamp(min=0)
    return r / r.sum()
