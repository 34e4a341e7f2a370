"""Solutions to the exercises of notebook 09 (making decode fast)."""

from __future__ import annotations

import numpy as np
import torch


def quantize_block(weights: np.ndarray) -> np.ndarray:
    """Exercise 9.1: 32 fp32 weights -> the 20 bytes of one Q4_1 block (uint8).

    m = the minimum, d = (max - min) / 15 (16 levels, 15 steps), code = round((w - m) / d) in 0..15; bytes 0-1 hold d
    and 2-3 hold m as fp16, then byte j holds code j in its low nibble and code j + 16 in its high nibble.
    """
    w = np.asarray(weights, dtype=np.float32)
    m = float(w.min())
    d = (float(w.max()) - m) / 15
    codes = np.clip(np.round((w - m) / d), 0, 15).astype(np.uint8) if d > 0 else np.zeros(32, np.uint8)  # [32]
    packed = codes[:16] | (codes[16:] << 4)  # [16]
    return np.concatenate([np.float16(d).reshape(1).view(np.uint8), np.float16(m).reshape(1).view(np.uint8), packed])


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 9.2: symmetric int8 with one scale per output row: (codes [out, in] int8, scale [out])."""
    scale = w.abs().amax(dim=1) / 127  # [out]: the row's largest weight lands on code 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def kl(ref_logits: torch.Tensor, other_logits: torch.Tensor) -> float:
    """Exercise 9.2: KL(P_ref || P_other) in nats, summed over the vocabulary, averaged over the positions."""
    ref, other = ref_logits.float().log_softmax(-1), other_logits.float().log_softmax(-1)
    return float((ref.exp() * (ref - other)).sum(-1).mean())


def verify(logits: torch.Tensor, drafts: list[int]) -> tuple[int, int]:
    """Exercise 9.3: greedy verification. logits [k + 1, vocab]: row i is the model's choice after the first i
    drafts. Returns (drafts kept, the token the pass adds: a correction, or a bonus when all were kept)."""
    choices = logits.argmax(-1).tolist()  # [k + 1]
    kept = 0
    while kept < len(drafts) and drafts[kept] == choices[kept]:
        kept += 1
    return kept, choices[kept]


def online_update(m, l, o, scores, v):
    """Exercise 9.4: fold one block of scores [q, block] and values [block, d] into the running state."""
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    rescale = torch.exp(m - m_new)  # exp(-inf) = 0 on the first block: nothing to rescale yet
    p = torch.exp(scores - m_new)
    return m_new, l * rescale + p.sum(dim=-1, keepdim=True), o * rescale + p @ v


def acceptance_probability(p, q, x):
    """Exercise 9.5: keep the draft token x with probability min(1, p(x) / q(x))."""
    return min(1.0, float(p[x] / q[x]))


def residual(p, q):
    """Exercise 9.5: on rejection, sample from what the draft under-proposed: max(p - q, 0), normalised."""
    r = (p - q).clamp(min=0)
    return r / r.sum()
