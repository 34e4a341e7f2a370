"""Selective batching (Orca's second idea): the batch flattened into one stream of tokens, attention per request.

A padded batch is a rectangle `[rows, longest, hidden]`: every row is padded to the longest prompt, and every pad
column goes through every projection and MLP. But only attention mixes the tokens of a request; every other layer
(the norms, the q/k/v/o projections, the MLP, the LM head) treats each token on its own. So Orca runs those on all
the batch's tokens laid end to end, `[total_tokens, hidden]`, with no padding at all, and splits the stream by
request only for attention. vLLM and SGLang lay out every iteration this way (prompt chunks and decode tokens in one
stream). `flattened_prefill` does it for prompts over our model's own layers; the logits equal the padded batch's
at every real position, to float rounding.
"""

from __future__ import annotations

import torch

from ..errors import CourseError
from ..model.attention import attention
from ..model.rope import apply_rope


def flattened_prefill(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Logits `[len(prompt), vocab]` of each prompt, all prompts' tokens in one `[total_tokens, hidden]` pass through
    every layer but attention, which runs per request over its own stretch of the stream (causal, nothing cached)."""
    if not prompts or not all(prompts):
        raise CourseError("Give at least one prompt, each at least one token id.")
    cfg, device = model.cfg, model.device
    ids = torch.tensor([t for p in prompts for t in p], device=device)  # [total]
    ends = torch.tensor([len(p) for p in prompts]).cumsum(0).tolist()
    spans = list(zip([0] + ends[:-1], ends))  # each request's stretch of the stream
    positions = torch.cat([torch.arange(len(p), device=device) for p in prompts])  # [total] each row's own positions
    cos, sin = model.rope(positions)  # [total, head_dim] each
    total, d = len(ids), cfg.head_dim
    x = model.embed_tokens(ids)  # [total, hidden]
    for block in model.layers:
        layer = block.self_attn
        h = block.input_layernorm(x)
        q = layer.q_proj(h).view(total, cfg.num_heads, d).transpose(0, 1)[None]  # [1, heads, total, d]
        k = layer.k_proj(h).view(total, cfg.num_kv_heads, d).transpose(0, 1)[None]  # [1, kv_heads, total, d]
        v = layer.v_proj(h).view(total, cfg.num_kv_heads, d).transpose(0, 1)[None]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = torch.cat([attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], causal=True)  # per request only
                         for a, b in spans], dim=2)  # [1, heads, total, d]
        x = x + layer.o_proj(out[0].transpose(0, 1).reshape(total, cfg.num_heads * d))
        x = x + block.mlp(block.post_attention_layernorm(x))
    logits = model.lm_head(model.norm(x))  # [total, vocab]
    return [logits[a:b] for a, b in spans]


def padded_tokens(prompts: list[list[int]]) -> int:
    """Token columns a left-padded batch of `prompts` computes: rows x the longest prompt."""
    return len(prompts) * max(len(p) for p in prompts)
