"""Solutions to the exercises of notebook 04 (the forward pass)."""

from __future__ import annotations

import torch

from llm_anatomy.model.rope import apply_rope


def rms_norm(x, weight, eps):
    """Exercise 4.1: each vector divided by its root mean square, in float32 (x * x overflows in float16)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # typical size 1
    return weight * normed.to(x.dtype)


def swiglu(x, gate_w, up_w, down_w):
    """Exercise 4.2: down(silu(gate(x)) * up(x)), each weight stored [out, in] as nn.Linear stores it."""
    return (torch.nn.functional.silu(x @ gate_w.T) * (x @ up_w.T)) @ down_w.T


def forward(model, ids):
    """Exercise 4.4: the loop over the blocks, each block written out: two residual steps, then norm and head."""
    cos, sin = model.rope(torch.arange(ids.shape[1], device=ids.device))  # [seq, head_dim] each
    x = model.embed_tokens(ids)  # [batch, seq, hidden]: the residual stream
    for block in model.layers:
        attn_out, _ = block.self_attn(block.input_layernorm(x), cos, sin)
        x = x + attn_out
        x = x + block.mlp(block.post_attention_layernorm(x))
    return model.lm_head(model.norm(x))  # [batch, seq, vocab]


def next_token_loss(logits, ids):
    """Exercise 4.5: the mean cross-entropy of each next token: logits at t against the token at t + 1."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [batch, seq - 1, vocab]
    target = ids[:, 1:]  # [batch, seq - 1]
    return -logp.gather(-1, target[..., None]).mean()


def block_forward(block, x, cos, sin):
    """Exercise 4.3: one block written out: x + o_proj(attention(norm(x))), then x + mlp(norm(x))."""
    attn, cfg = block.self_attn, block.self_attn.cfg
    b, s, _ = x.shape
    h = block.input_layernorm(x)  # the stream, read through the first norm
    q = attn.q_proj(h).view(b, s, cfg.num_heads, cfg.head_dim).transpose(1, 2)  # [batch, heads, seq, head_dim]
    k = attn.k_proj(h).view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)  # [batch, kv_heads, seq, head_dim]
    v = attn.v_proj(h).view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)  # [batch, kv_heads, seq, head_dim]
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # positions enter q and k only
    group = cfg.num_heads // cfg.num_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # query head h reads K/V head h // group
    scores = q @ k.transpose(-1, -2) / cfg.head_dim ** 0.5  # [batch, heads, seq, seq]
    scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool, device=x.device).tril(), float("-inf"))
    heads_out = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v  # [batch, heads, seq, head_dim]
    x = x + attn.o_proj(heads_out.transpose(1, 2).reshape(b, s, cfg.num_heads * cfg.head_dim))
    return x + block.mlp(block.post_attention_layernorm(x))
