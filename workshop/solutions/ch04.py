"""Solutions to the exercises of notebook 04 (the forward pass)."""

from __future__ import annotations

import torch


def rms_norm(x, weight, eps):
    """Exercise 4.1: each vector divided by its root mean square, in float32 (x * x overflows in float16)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # typical size 1
    return weight * normed.to(x.dtype)


def swiglu(x, gate_w, up_w, down_w):
    """Exercise 4.2: down(silu(gate(x)) * up(x)), each weight stored [out, in] as nn.Linear stores it."""
    return (torch.nn.functional.silu(x @ gate_w.T) * (x @ up_w.T)) @ down_w.T


def forward(model, ids):
    """Exercise 4.3: the loop over the blocks, each block written out: two residual steps, then norm and head."""
    cos, sin = model.rope(torch.arange(ids.shape[1], device=ids.device))  # [seq, head_dim] each
    x = model.embed_tokens(ids)  # [batch, seq, hidden]: the residual stream
    for block in model.layers:
        attn_out, _ = block.self_attn(block.input_layernorm(x), cos, sin)
        x = x + attn_out
        x = x + block.mlp(block.post_attention_layernorm(x))
    return model.lm_head(model.norm(x))  # [batch, seq, vocab]


def next_token_loss(logits, ids):
    """Exercise 4.4: the mean cross-entropy of each next token: logits at t against the token at t + 1."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [batch, seq - 1, vocab]
    target = ids[:, 1:]  # [batch, seq - 1]
    return -logp.gather(-1, target[..., None]).mean()
