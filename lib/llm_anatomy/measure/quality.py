"""What quantizing (or any change to the model) costs in quality, measured on the model's own outputs (notebook 09).

    logit_kl(ref, other)        KL divergence of the next-token distributions, nats per position (0: the same)
    greedy_agreement(a, b)      the fraction of positions whose top token agrees (1: all)
    perplexity(model, ids)      exp(mean cross-entropy) on a text (1: certain of every token)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import CourseError


def logit_kl(ref_logits: torch.Tensor, other_logits: torch.Tensor) -> float:
    """KL(P_ref || P_other) of the next-token distributions in nats, averaged over positions.

    Logits [batch, seq, vocab] (or [seq, vocab]), both the same shape. 0 means the same predictions.
    """
    if ref_logits.shape != other_logits.shape:
        raise CourseError(f"Compare logits of one shape, not {tuple(ref_logits.shape)} and {tuple(other_logits.shape)}.")
    ref, other = F.log_softmax(ref_logits.float(), dim=-1), F.log_softmax(other_logits.float(), dim=-1)
    return (ref.exp() * (ref - other)).sum(dim=-1).mean().item()  # sum over the vocabulary, mean over positions


def greedy_agreement(a_tokens, b_tokens) -> float:
    """The fraction of positions where two token sequences (lists or tensors, same length) agree.

    Free-running generations part for good at the first different token; comparing the top token at
    each position of one given text (teacher forcing: logits.argmax(-1)) counts every position on its own.
    """
    a, b = torch.as_tensor(a_tokens).reshape(-1), torch.as_tensor(b_tokens).reshape(-1)
    if a.numel() != b.numel() or a.numel() == 0:
        raise CourseError(f"Compare two non-empty token sequences of one length, not {a.numel()} and {b.numel()}.")
    return (a == b).float().mean().item()


@torch.no_grad()
def perplexity(model, ids: torch.Tensor) -> float:
    """exp(mean cross-entropy) of predicting each token from those before it; ids [1, seq] or [seq].

    1 means certain of every token; guessing uniformly among V tokens scores V.
    """
    ids = ids.reshape(1, -1) if ids.ndim == 1 else ids
    if ids.shape[-1] < 2:
        raise CourseError("Perplexity needs at least two tokens: one to read and one to predict.")
    out = model(ids)
    logits = getattr(out, "logits", out).float()[:, :-1]  # [batch, seq - 1, vocab]: each next-token prediction
    return math.exp(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item())
