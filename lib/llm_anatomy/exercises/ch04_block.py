"""Notebook 04's exercise 4.3: one block written out (projections, RoPE on q and k, GQA, o_proj, both residuals).

The check runs the learner's `block_forward(block, x, cos, sin)` on blocks the notebook never showed (random
weights, two shapes, one with more query heads per K/V head than the real model) and, when given, on a real block
the notebook did not use, with random streams. Block.forward, the model's attention module and every attention
function of the library, torch and transformers are refused: the learner writes the attention sublayer. The norms
(exercise 4.1), the MLP module (4.2), apply_rope (notebook 02) and repeat_kv (notebook 03) stay allowed. Each
typical mistake is computed and named: post-norm, a residual added to the normed stream, RoPE on v (or missing on
q or k), K/V heads dealt out by tiling, no causal mask, no 1/sqrt(head_dim), a missing residual.
"""

from __future__ import annotations

import re
import sys

import torch

from ..model import attention as attention_module
from ..model.config import ScratchConfig
from ..model.rope import apply_rope
from ..model.scratch import Attention, Block, ScratchLlama
from . import _LearnerFailed, call, exercise, expect, forbidden_all, hints, returned

SHORTCUT = ("write the attention sublayer yourself: project q, k and v, turn q and k with RoPE, let each query "
            "head read its K/V head, mask, softmax, o_proj, then the two residual steps")


def _config(hidden, heads, kv_heads, head_dim) -> ScratchConfig:
    return ScratchConfig(vocab_size=50, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=1,
                         num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rope_theta=10000.0,
                         rms_norm_eps=1e-5, max_position_embeddings=64)


def random_block(hidden=40, heads=6, kv_heads=2, head_dim=8, seed=11) -> tuple[ScratchLlama, Block]:
    """A ScratchLlama of one block with random weights, norm weights included (so that every step shows)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = ScratchLlama(_config(hidden, heads, kv_heads, head_dim))
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight"):
                param.data = 1 + 0.5 * torch.randn_like(param)
    return model.eval(), model.layers[0]


def block_variant(block, x, cos, sin, *, post_norm=False, residual_on_normed=False, rope_on_v=False, rope_q=True,
                  rope_k=True, tiled=False, causal=True, scale=True, residual=True, o_proj=True):
    """The block with one thing changed: what a typical mistake computes. `[batch, seq, hidden]`."""
    attn = block.self_attn
    b, s, _ = x.shape
    heads, kv_heads, d = attn.cfg.num_heads, attn.cfg.num_kv_heads, attn.cfg.head_dim

    def attention_sublayer(h):
        q = attn.q_proj(h).view(b, s, heads, d).transpose(1, 2)  # [batch, heads, seq, head_dim]
        k = attn.k_proj(h).view(b, s, kv_heads, d).transpose(1, 2)  # [batch, kv_heads, seq, head_dim]
        v = attn.v_proj(h).view(b, s, kv_heads, d).transpose(1, 2)
        q = apply_rope(q, cos, sin) if rope_q else q
        k = apply_rope(k, cos, sin) if rope_k else k
        v = apply_rope(v, cos, sin) if rope_on_v else v
        group = heads // kv_heads
        index = torch.arange(heads) % kv_heads if tiled else torch.arange(heads) // group  # K/V head of each query head
        k, v = k[:, index], v[:, index]  # [batch, heads, seq, head_dim]
        scores = q @ k.transpose(-1, -2) / (d ** 0.5 if scale else 1.0)  # [batch, heads, seq, seq]
        if causal:
            scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
        out = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v  # [batch, heads, seq, head_dim]
        heads_out = out.transpose(1, 2).reshape(b, s, heads * d)
        return attn.o_proj(heads_out) if o_proj else heads_out

    if post_norm:  # the original transformer's order: add, then normalise the stream
        x = block.input_layernorm(x + attention_sublayer(x))
        return block.post_attention_layernorm(x + block.mlp(x))
    h = block.input_layernorm(x)
    x = (h if residual_on_normed else x if residual else 0) + attention_sublayer(h)
    h = block.post_attention_layernorm(x)
    return (h if residual_on_normed else x if residual else 0) + block.mlp(h)


MISTAKES = [  # (what the mistake changes, its name)
    (dict(post_norm=True), "that is post-norm, the norm after the sublayer: this block is pre-norm, each sublayer "
                           "reads norm(x) and its output is added to x itself, x = x + attention(norm(x))"),
    (dict(residual_on_normed=True), "the residual adds the sublayer's output to the stream x, not to the normed "
                                    "stream: x = x + attention(norm(x)), not norm(x) + attention(norm(x))"),
    (dict(rope_on_v=True), "RoPE turns q and k only, never v: positions enter through the scores, and v carries "
                           "content"),
    (dict(rope_q=False), "RoPE is missing on q: turn both q and k (apply_rope(q, cos, sin))"),
    (dict(rope_k=False), "RoPE is missing on k: turn both q and k (apply_rope(k, cos, sin))"),
    (dict(rope_q=False, rope_k=False), "no RoPE: turn q and k with apply_rope(..., cos, sin) before the scores"),
    (dict(tiled=True), "the K/V heads are dealt out by tiling (h % kv_heads): query head h reads K/V head "
                       "h // (heads // kv_heads), so neighbouring query heads share one (repeat_kv, or "
                       "repeat_interleave on the head dimension, not repeat)"),
    (dict(causal=False), "the causal mask is missing: query i may read keys 0..i only"),
    (dict(scale=False), "divide the scores by sqrt(head_dim) before the softmax"),
    (dict(o_proj=False), "o_proj is missing: the heads, side by side, go through o_proj before they are added to "
                         "the stream"),
    (dict(residual=False), "add each sublayer's output to the stream: x = x + attention(norm(x)), then "
                           "x = x + mlp(norm(x))"),
]


def _refused():
    from torch.nn.attention import flex_attention  # imported here, so that it is refused even if imported later

    llama = sys.modules.get("transformers.models.llama.modeling_llama")
    return [(flex_attention, "flex_attention"), (type(torch.ops.higher_order.flex_attention), "__call__"),
            (Block, "forward"), (Attention, "forward"), attention_module.attention,
            attention_module.attention_probabilities, attention_module.sdpa_attention,
            (torch.nn.functional, "scaled_dot_product_attention"),
            (getattr(llama, "LlamaAttention", None), "forward"), (getattr(llama, "LlamaDecoderLayer", None), "forward"),
            (llama, "eager_attention_forward"), (torch.nn.functional, "multi_head_attention_forward"),
            torch.nn.MultiheadAttention]


def _cases(model=None):
    g = torch.Generator().manual_seed(43)
    for shape, seed in [((40, 6, 2, 8), 11), ((24, 4, 4, 6), 12)]:  # 3 query heads per K/V head; then plain MHA
        net, block = random_block(*shape, seed=seed)
        yield net, block, torch.randn(2, 7, shape[0], generator=g) * 2  # [batch, seq, hidden]
    if model is not None:  # a real block the notebook did not run, on a random stream of real size
        layer = min(5, len(model.layers) - 1)
        x = torch.randn(1, 6, model.cfg.hidden_size, generator=g).to(model.device, model.dtype)  # [1, 6, hidden]
        yield model, model.layers[layer], x


@exercise
@hints("Two residual steps, each: read the stream through a norm, compute a sublayer, add its output to the stream. "
       "Which sublayer needs positions, and on which of its vectors?",
       "Attention: q, k, v from block.self_attn's q_proj, k_proj, v_proj, viewed as [batch, heads, seq, head_dim] "
       "(k and v have fewer heads); apply_rope on q and k; each query head h reads K/V head h // group (repeat_kv); "
       "scores q @ k^T / sqrt(head_dim), causal mask, softmax, @ v; heads back side by side, then o_proj.",
       "h = block.input_layernorm(x); attention as above on h; x = x + o_proj(...); "
       "x = x + block.mlp(block.post_attention_layernorm(x)); return x (cfg = block.self_attn.cfg gives "
       "num_heads, num_kv_heads, head_dim).")
def check_block(block_forward, model=None) -> str:
    """Exercise 4.3: block_forward(block, x, cos, sin) -> the stream after the block, [batch, seq, hidden]."""
    expect(callable(block_forward), "define a function block_forward(block, x, cos, sin) that returns the stream "
                                    "after the block.")
    for net, block, x in _cases(model):
        cos, sin = net.rope(torch.arange(x.shape[1], device=x.device))  # [seq, head_dim] each
        cfg = block.self_attn.cfg
        with torch.no_grad():
            right = block(x, cos, sin)[0]
            try:
                with forbidden_all(_refused(), SHORTCUT, transformers=("Attention.forward", "DecoderLayer.forward",
                                                            "eager_attention_forward")):
                    out = call(block_forward, block, x.clone(), cos.clone(), sin.clone())
            except _LearnerFailed as failed:
                err = failed.args[0]
                sizes = {int(n) for n in re.findall(r"\((\d+)\)", str(err))} if isinstance(err, RuntimeError) else set()
                width = cfg.num_heads * cfg.head_dim
                expect(width == cfg.hidden_size or not {width, cfg.hidden_size} <= sizes,
                       f"your code raised {type(err).__name__}: {err}. The heads side by side are {cfg.num_heads} x "
                       f"{cfg.head_dim} = {width} wide and the stream {cfg.hidden_size}: o_proj brings the heads back "
                       "to the hidden size before the residual add.")
                grouped = cfg.num_kv_heads < cfg.num_heads and isinstance(err, RuntimeError) and "size" in str(err)
                expect(not grouped, f"your code raised {type(err).__name__}: {err}. With {cfg.num_heads} query heads "
                                    f"and {cfg.num_kv_heads} K/V heads, give each query head its K/V head first "
                                    "(GQA: repeat_kv(k, heads // kv_heads)), then compute the scores.")
                raise
            out = returned(out, "tensor", "the stream after the block")
            expect(tuple(out.shape) == tuple(x.shape), f"return the stream, shaped like x {list(x.shape)}, not "
                                                       f"{list(out.shape)}: after the heads, o_proj brings them back "
                                                       "to the hidden size.")
            close = dict(atol=1e-4, rtol=1e-4) if x.dtype == torch.float32 else dict(atol=0.05, rtol=0.05)
            if torch.allclose(out.to(right.dtype), right, **close):
                continue
            for change, message in MISTAKES:
                if change.get("tiled") and cfg.num_kv_heads == cfg.num_heads:
                    continue  # one K/V head per query head: the order cannot show
                if change.get("o_proj") is False and cfg.num_heads * cfg.head_dim != cfg.hidden_size:
                    continue  # the heads cannot be added to the stream without o_proj (named above, from the error)
                wrong = block_variant(block, x, cos, sin, **change)
                expect(not torch.allclose(out.to(wrong.dtype), wrong, **close), message + ".")
            expect(False, f"the stream differs from the block's by up to {(out - right).abs().max():.3g}: "
                          "x = x + o_proj(attention with RoPE on q and k, GQA, mask, softmax), then "
                          "x = x + mlp(post_attention_layernorm(x)).")
    where = "two random blocks" + (" and a real one" if model is not None else "")
    return (f"your block gives the block's stream on {where}: two residual steps, attention (with RoPE on q and k, "
            "and GQA's shared K/V) and the MLP, each reading the stream through its own norm.")
