"""Solutions to the exercises of notebook 04 (the forward pass)."""

from __future__ import annotations

import torch


def forward(model, ids):
    """Exercise 4.1: the loop over the blocks, each block written out: two residual steps, then norm and head."""
    cos, sin = model.rope(torch.arange(ids.shape[1], device=ids.device))  # [seq, head_dim] each
    x = model.embed_tokens(ids)  # [batch, seq, hidden]: the residual stream
    for block in model.layers:
        attn_out, _ = block.self_attn(block.input_layernorm(x), cos, sin)
        x = x + attn_out
        x = x + block.mlp(block.post_attention_layernorm(x))
    return model.lm_head(model.norm(x))  # [batch, seq, vocab]


def next_token_loss(logits, ids):
    """Exercise 4.2: the mean cross-entropy of each next token: logits at t against the token at t + 1."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [batch, seq - 1, vocab]
    target = ids[:, 1:]  # [batch, seq - 1]
    return -logp.gather(-1, target[..., None]).mean()
