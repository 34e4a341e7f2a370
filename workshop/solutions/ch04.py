"""Solutions to the exercises of notebook 04 (the forward pass)."""

from __future__ import annotations

import torch


def rms_norm(x, weight, eps):
    """Exercise 4.1: divide by the root mean square over the last dimension, then weight."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def swiglu(x, gate, up, down):
    """Exercise 4.2: silu(gate) times up, projected down."""
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def next_token(model, tokenizer, prompt="The capital of France is"):
    """Exercise 4.3: the text of the top token at the last position."""
    ids = torch.tensor([tokenizer.encode(prompt)], device=model.device)
    return tokenizer.decode([int(model(ids)[0, -1].argmax())])
