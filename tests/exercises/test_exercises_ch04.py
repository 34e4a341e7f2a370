"""Notebook 04's exercise checks: the solutions pass, typical wrong answers fail with a specific message."""

from __future__ import annotations

import torch

from exercise_helpers import as_learner_code, load_solutions, not_yet, unattempted

from llm_anatomy.exercises import ch04
from llm_anatomy.exercises.ch04_block import block_variant, random_block
from llm_anatomy.model.scratch import ScratchLlama

solutions = load_solutions("ch04")


def test_solutions_pass_on_the_small_model():
    assert ch04.check_rms_norm(solutions.rms_norm).passed
    assert ch04.check_swiglu(solutions.swiglu).passed
    assert ch04.check_forward(solutions.forward).passed
    assert ch04.check_next_token_loss(solutions.next_token_loss).passed


def test_the_forward_solution_passes_on_the_real_model_and_equals_transformers(real):
    scratch = ScratchLlama.from_hf(real)
    ids = real.tokenizer("The capital of France is", return_tensors="pt").input_ids
    verdict = ch04.check_forward(solutions.forward, scratch, ids)
    assert verdict.passed and "real 30-block" in verdict.message, verdict.message
    with torch.no_grad():
        assert (solutions.forward(scratch, ids) - real.model(ids).logits).abs().max() < 1e-3


def _forward(model, ids, *, residual=True, final_norm=True, mlp_norm="post_attention_layernorm", start=0):
    cos, sin = model.rope(torch.arange(start, start + ids.shape[1]))
    x = model.embed_tokens(ids)
    for block in model.layers:
        attn, _ = block.self_attn(block.input_layernorm(x), cos, sin)
        x = x + attn if residual else attn
        out = block.mlp(getattr(block, mlp_norm)(x))
        x = x + out if residual else out
    return model.lm_head(model.norm(x) if final_norm else x)


def test_forward_mistakes_get_specific_messages():
    not_yet(ch04.check_forward(lambda m, ids: _forward(m, ids, final_norm=False)), "final norm")
    not_yet(ch04.check_forward(lambda m, ids: _forward(m, ids, residual=False)), "residual stream")
    not_yet(ch04.check_forward(lambda m, ids: _forward(m, ids, mlp_norm="input_layernorm")), "post_attention_layernorm")
    assert ch04.check_forward(lambda m, ids: _forward(m, ids, start=1)).passed  # RoPE: only offsets matter
    not_yet(ch04.check_forward(lambda m, ids: _forward(m, ids)[:, -1]), "[batch, seq, vocab]")
    not_yet(ch04.check_forward(unattempted), "not attempted")


def test_forward_refuses_the_model_s_own_loop():
    not_yet(ch04.check_forward(lambda m, ids: m(ids)), "don't call", "forward")
    not_yet(ch04.check_forward(lambda m, ids: m.trace(ids).logits), "don't call", "trace")

    def blocks_whole(m, ids):
        cos, sin = m.rope(torch.arange(ids.shape[1]))
        x = m.embed_tokens(ids)
        for block in m.layers:
            x, _ = block(x, cos, sin)
        return m.lm_head(m.norm(x))

    not_yet(ch04.check_forward(blocks_whole), "don't call", "x = x + attention(norm(x))")
    small = ch04.small_model()
    assert small(torch.tensor([[1, 2]])).shape == (1, 2, 97)  # restored afterwards


def test_next_token_loss_mistakes_get_specific_messages():
    ce = lambda logits, ids: -torch.log_softmax(logits, -1).gather(-1, ids[..., None]).mean()  # noqa: E731
    not_yet(ch04.check_next_token_loss(ce), "shift the labels")
    backwards = lambda logits, ids: ce(logits[:, 1:], ids[:, :-1])  # noqa: E731
    not_yet(ch04.check_next_token_loss(backwards), "wrong way round")
    not_yet(ch04.check_next_token_loss(lambda logits, ids: -solutions.next_token_loss(logits, ids)), "sign")
    probs = lambda logits, ids: -torch.softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).mean()  # noqa: E731
    not_yet(ch04.check_next_token_loss(probs), "log of the probability")
    summed = lambda logits, ids: -torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).sum()  # noqa: E731
    not_yet(ch04.check_next_token_loss(summed), "average")
    per_position = lambda logits, ids: -torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])  # noqa: E731
    not_yet(ch04.check_next_token_loss(per_position), "one number")
    not_yet(ch04.check_next_token_loss(unattempted), "not attempted")


def test_next_token_loss_refuses_torch_s_cross_entropy():
    def shortcut(logits, ids):
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    not_yet(ch04.check_next_token_loss(shortcut), "don't call", "cross_entropy")
    not_yet(ch04.check_next_token_loss(lambda logits, ids: torch.nn.CrossEntropyLoss()(logits[0], ids[0])), "don't call")
    assert torch.nn.functional.cross_entropy(torch.zeros(1, 2), torch.tensor([0])) > 0  # restored afterwards


def test_rms_norm_mistakes_get_specific_messages():
    def layer_norm(x, w, eps):
        x32 = x.float()
        return w * ((x32 - x32.mean(-1, keepdim=True)) * torch.rsqrt(x32.var(-1, keepdim=True, unbiased=False) + eps)).to(x.dtype)

    def eps_outside(x, w, eps):
        x32 = x.float()
        return w * (x32 / (x32.pow(2).mean(-1, keepdim=True).sqrt() + eps)).to(x.dtype)

    def no_weight(x, w, eps):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    def no_upcast(x, w, eps):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def wrong_dim(x, w, eps):
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(0, keepdim=True) + eps)).to(x.dtype)

    not_yet(ch04.check_rms_norm(layer_norm), "LayerNorm", "subtract the mean")
    not_yet(ch04.check_rms_norm(eps_outside), "inside the square root")
    not_yet(ch04.check_rms_norm(no_weight), "learned weight")
    not_yet(ch04.check_rms_norm(no_upcast), "float16", "float32")
    not_yet(ch04.check_rms_norm(wrong_dim), "not RMSNorm yet", "last dimension")
    not_yet(ch04.check_rms_norm(lambda x, w, eps: solutions.rms_norm(x, w, eps).float()), "dtype")
    not_yet(ch04.check_rms_norm(lambda x, w, eps: x.pow(2).mean(-1)), "shaped like x")
    not_yet(ch04.check_rms_norm(unattempted), "not attempted")


def test_rms_norm_refuses_the_library_s_norms():
    from llm_anatomy.model.scratch import RMSNorm

    def ours(x, w, eps):
        norm = RMSNorm(x.shape[-1], eps).to(x.dtype)
        norm.weight.data = w
        return norm(x)

    not_yet(ch04.check_rms_norm(ours), "don't call")
    not_yet(ch04.check_rms_norm(lambda x, w, eps: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)), "don't call")


def test_swiglu_mistakes_get_specific_messages():
    silu = torch.nn.functional.silu
    not_yet(ch04.check_swiglu(lambda x, g, u, d: ((x @ g.T) * silu(x @ u.T)) @ d.T), "gate projection")
    not_yet(ch04.check_swiglu(lambda x, g, u, d: (torch.relu(x @ g.T) * (x @ u.T)) @ d.T), "ReLU")
    not_yet(ch04.check_swiglu(lambda x, g, u, d: (torch.sigmoid(x @ g.T) * (x @ u.T)) @ d.T), "sigmoid(x) alone")
    not_yet(ch04.check_swiglu(lambda x, g, u, d: (silu(x @ g.T) + (x @ u.T)) @ d.T), "not a sum")
    not_yet(ch04.check_swiglu(lambda x, g, u, d: silu(x @ g.T) @ d.T), "up projection is missing")
    not_yet(ch04.check_swiglu(lambda x, g, u, d: silu(x @ g.T) * (x @ u.T)), "project back down")
    not_yet(ch04.check_swiglu(unattempted), "not attempted")


def test_swiglu_refuses_the_model_s_mlp():
    from llm_anatomy.model.scratch import MLP

    def ours(x, g, u, d):
        mlp = MLP.__new__(MLP)
        torch.nn.Module.__init__(mlp)
        mlp.gate_proj, mlp.up_proj, mlp.down_proj = (torch.nn.Linear(1, 1, bias=False) for _ in range(3))
        mlp.gate_proj.weight.data, mlp.up_proj.weight.data, mlp.down_proj.weight.data = g, u, d
        return mlp(x)

    not_yet(ch04.check_swiglu(ours), "don't call")


# Exercise 4.3: one block written out
def test_the_block_solution_passes_on_random_blocks_and_on_a_real_one(real):
    assert ch04.check_block(solutions.block_forward).passed
    verdict = ch04.check_block(solutions.block_forward, ScratchLlama.from_hf(real))
    assert verdict.passed and "and a real one" in verdict.message, verdict.message


def _variant(**change):
    return lambda block, x, cos, sin: as_learner_code(block_variant)(block, x, cos, sin, **change)


def test_block_mistakes_get_specific_messages():
    not_yet(ch04.check_block(_variant(post_norm=True)), "post-norm", "x = x + attention(norm(x))")
    not_yet(ch04.check_block(_variant(residual_on_normed=True)), "not to the normed stream")
    not_yet(ch04.check_block(_variant(rope_on_v=True)), "q and k only, never v")
    not_yet(ch04.check_block(_variant(rope_k=False)), "missing on k")
    not_yet(ch04.check_block(_variant(tiled=True)), "tiling", "h // (heads // kv_heads)")
    not_yet(ch04.check_block(_variant(causal=False)), "causal mask")
    not_yet(ch04.check_block(_variant(scale=False)), "sqrt(head_dim)")
    not_yet(ch04.check_block(_variant(residual=False)), "add each sublayer's output to the stream")
    not_yet(ch04.check_block(lambda block, x, cos, sin: solutions.block_forward(block, x, cos, sin)[..., :-1]),
            "shaped like x")
    not_yet(ch04.check_block(unattempted), "not attempted")


def test_a_block_without_the_gqa_expansion_is_told_to_share_the_k_v_heads():
    def no_expansion(block, x, cos, sin):  # q has 6 heads, k 2: the scores cannot be formed
        attn, cfg = block.self_attn, block.self_attn.cfg
        b, s, _ = x.shape
        h = block.input_layernorm(x)
        q = attn.q_proj(h).view(b, s, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        return q @ k.transpose(-1, -2)

    not_yet(ch04.check_block(no_expansion), "raised RuntimeError", "repeat_kv")


def test_block_refuses_the_block_the_attention_module_and_every_attention_function():
    from llm_anatomy.model.attention import attention, sdpa_attention

    not_yet(ch04.check_block(lambda block, x, cos, sin: block(x, cos, sin)[0]), "don't call", "Block.forward")

    def module(block, x, cos, sin):
        out, _ = block.self_attn(block.input_layernorm(x), cos, sin)
        x = x + out
        return x + block.mlp(block.post_attention_layernorm(x))

    not_yet(ch04.check_block(module), "don't call", "Attention.forward")
    for function in (attention, sdpa_attention, torch.nn.functional.scaled_dot_product_attention):
        def through(block, x, cos, sin, function=function):
            attn, cfg = block.self_attn, block.self_attn.cfg
            b, s, _ = x.shape
            h = block.input_layernorm(x)
            q, k, v = (p(h).view(b, s, -1, cfg.head_dim).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
            group = cfg.num_heads // cfg.num_kv_heads
            out = function(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
            x = x + attn.o_proj(out.transpose(1, 2).reshape(b, s, -1))
            return x + block.mlp(block.post_attention_layernorm(x))

        not_yet(ch04.check_block(through), "don't call", "write the attention sublayer yourself")
    net, block = random_block()
    assert block(torch.zeros(1, 2, 40), *net.rope(torch.arange(2)))[0].shape == (1, 2, 40)  # restored afterwards


def test_block_hints_go_from_a_nudge_to_an_outline():
    from llm_anatomy.exercises import reset_hints

    reset_hints()
    try:
        shown = [ch04.hint(ch04.check_block) for _ in range(3)]
        assert [len(h.shown) for h in shown] == [1, 2, 3]
        assert "=" not in shown[0].shown[0] and "(" not in shown[0].shown[0]
    finally:
        reset_hints()
