"""Checks for notebook 04 (the forward pass): RMSNorm, the SwiGLU MLP, the loop over the blocks, the next-token loss
(the block written out, exercise 4.3, is in ch04_block.py).

RMSNorm and the MLP are checked on inputs the notebook never showed (a float16 one among them, where x * x
overflows unless the norm is computed in float32), with the library's and transformers' modules refused. The forward loop is checked on a small random model the notebook never showed (and on the real one when given),
with ScratchLlama's own forward and Block.forward refused; the loss on random logits, with torch's cross-entropy
refused. Each typical mistake is named.
"""

from __future__ import annotations

import torch

import sys

from ..model.scratch import MLP, Block, RMSNorm, ScratchConfig, ScratchLlama
from . import call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: for the notebook)
from .ch04_block import check_block  # noqa: F401  (exercise 4.3, the block written out, in its own file)


def _reference_rms_norm(x, weight, eps):
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rms_cases():
    g = torch.Generator().manual_seed(41)
    yield torch.randn(2, 5, 24, generator=g) * 3 + 1, 1 + 0.5 * torch.randn(24, generator=g), 1e-5
    yield torch.randn(7, 10, generator=g), torch.rand(10, generator=g) + 0.5, 0.5  # a large eps: where it goes shows
    big = (torch.randn(3, 48, generator=g) * 300).half()  # float16: x * x passes 65,504, the largest float16
    yield big, (1 + 0.1 * torch.randn(48, generator=g)).half(), 1e-5


RMS_MISTAKES = [  # the overflow first: in float16 other mistakes collapse to the same zeros
    (lambda x, w, e: w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e),
     "in float16, x * x overflows (above 65,504) and the result collapses: compute the norm in float32 (x.float()), "
     "then cast back to x's dtype before the weight."),
    (lambda x, w, e: w * (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + e),
     "that is LayerNorm: RMSNorm does not subtract the mean, it divides by the root mean square of x itself."),
    (lambda x, w, e: w * x / (x.float().pow(2).mean(-1, keepdim=True).sqrt() + e).to(x.dtype),
     "eps goes inside the square root: x / sqrt(mean(x ** 2) + eps)."),
    (lambda x, w, e: x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + e),
     "multiply by the learned weight (one number per feature) at the end."),
]


@exercise
@hints("Each token's vector is scaled to a typical size of 1, then multiplied by a learned weight. Which mean, over "
       "which dimension, and where does eps go?",
       "The root mean square is sqrt(mean(x ** 2)) over the last dimension (keep it, so it broadcasts); eps goes "
       "inside the square root. RMSNorm subtracts no mean.",
       "In float16 the squares overflow: do the arithmetic on x.float(), cast the normalised x back to x.dtype, and "
       "only then multiply by the weight (torch.rsqrt is 1 / sqrt).")
def check_rms_norm(rms_norm) -> str:
    """Exercise 4.1: rms_norm(x, weight, eps) -> weight * x / sqrt(mean(x^2) + eps) over the last dim, in fp32."""
    expect(callable(rms_norm), "define a function rms_norm(x, weight, eps) that returns a tensor shaped like x.")
    llama = sys.modules.get("transformers.models.llama.modeling_llama")
    library = [(RMSNorm, "forward"), (torch.nn.functional, "rms_norm"), (torch, "rms_norm"), torch.nn.RMSNorm,
               (getattr(llama, "LlamaRMSNorm", None), "forward"), (torch.nn.functional, "layer_norm")]
    for x, weight, eps in _rms_cases():
        with forbidden_all(library, "write the root mean square and the division yourself",
                           transformers=("RMSNorm.forward",)):
            out = returned(call(rms_norm, x.clone(), weight.clone(), eps), "tensor", "the normalised vectors")
        right = _reference_rms_norm(x, weight, eps)
        expect(tuple(out.shape) == tuple(x.shape), f"return a tensor shaped like x, {list(x.shape)}, not "
                                                   f"{list(out.shape)}: take the mean over the last dimension with "
                                                   "keepdim=True.")
        expect(out.dtype == x.dtype, f"return x's dtype ({x.dtype}), not {out.dtype}: compute in float32, then cast "
                                     "back.")
        tolerance = dict(atol=1e-5, rtol=1e-5) if x.dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)
        if torch.allclose(out.float(), right.float(), **tolerance):
            continue
        for wrong, message in RMS_MISTAKES:
            with torch.no_grad():
                mistaken = wrong(x, weight, eps)
            expect(mistaken.shape != out.shape or not torch.allclose(out.float(), mistaken.float(), **tolerance)
                   or torch.allclose(mistaken.float(), right.float(), **tolerance), message)
        expect(torch.isfinite(out.float()).all(), "inf or NaN in your output: in float16 x * x overflows; compute the "
                                                  "norm in float32.")
        expect(False, "not RMSNorm yet: weight * x / sqrt(mean(x ** 2) + eps), the mean over each vector's numbers "
                      "(the last dimension).")
    return "the same numbers as the model's RMSNorm, float16 included: every sublayer sees its input at one scale."


def _reference_mlp(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


MLP_MISTAKES = [
    (lambda x, g, u, d: ((x @ g.T) * torch.nn.functional.silu(x @ u.T)) @ d.T,
     "the SiLU goes on the gate projection, not on up: down(silu(gate(x)) * up(x))."),
    (lambda x, g, u, d: (torch.relu(x @ g.T) * (x @ u.T)) @ d.T, "that is ReLU: SiLU is x * sigmoid(x), smooth, "
                                                                 "and lets a little negative signal through."),
    (lambda x, g, u, d: (torch.sigmoid(x @ g.T) * (x @ u.T)) @ d.T, "silu(x) is x * sigmoid(x), not sigmoid(x) "
                                                                    "alone."),
    (lambda x, g, u, d: (torch.nn.functional.silu(x @ g.T) + (x @ u.T)) @ d.T,
     "the gate multiplies the up projection, number by number: silu(gate(x)) * up(x), not a sum."),
    (lambda x, g, u, d: torch.nn.functional.silu(x @ g.T) @ d.T, "the up projection is missing: silu(gate(x)) * up(x)."),
]


@exercise
@hints("Two projections widen the vector, one of them through an activation; they are combined number by number, "
       "then a third projection brings the result back to the hidden size.",
       "The weights are stored as nn.Linear stores them, [out, in]: x @ w.T applies one. SiLU(z) = z * sigmoid(z) "
       "goes on the gate projection only.",
       "Widen twice (gate and up, to the MLP's width), multiply silu(gate) by up element by element, then apply down; "
       "the result has x's shape.")
def check_swiglu(swiglu) -> str:
    """Exercise 4.2: swiglu(x, gate_w, up_w, down_w) -> down(silu(gate(x)) * up(x)), weights stored [out, in]."""
    expect(callable(swiglu), "define a function swiglu(x, gate_w, up_w, down_w) that returns a tensor shaped like x.")
    llama = sys.modules.get("transformers.models.llama.modeling_llama")
    library = [(MLP, "forward"), (getattr(llama, "LlamaMLP", None), "forward")]
    g = torch.Generator().manual_seed(42)
    for tokens, hidden, wide in [(5, 12, 32), ((2, 3), 20, 56)]:
        shape = (tokens,) if isinstance(tokens, int) else tokens
        x = torch.randn(*shape, hidden, generator=g)
        gate, up = torch.randn(wide, hidden, generator=g) / hidden ** 0.5, torch.randn(wide, hidden, generator=g) / hidden ** 0.5
        down = torch.randn(hidden, wide, generator=g) / wide ** 0.5
        with forbidden_all(library, "write the three projections and the gate yourself", transformers=("MLP.forward",)):
            out = returned(call(swiglu, x.clone(), gate.clone(), up.clone(), down.clone()), "tensor", "the MLP's output")
        expect(tuple(out.shape) == tuple(x.shape), f"return a tensor shaped like x, {list(x.shape)}, not "
                                                   f"{list(out.shape)}: project back down to the hidden size.")
        right = _reference_mlp(x, gate, up, down)
        if torch.allclose(out.float(), right, atol=1e-5, rtol=1e-5):
            continue
        for wrong, message in MLP_MISTAKES:
            expect(not torch.allclose(out.float(), wrong(x, gate, up, down), atol=1e-5, rtol=1e-5), message)
        expect(False, "not SwiGLU yet: down(silu(gate(x)) * up(x)), each weight applied as x @ w.T.")
    return "the same numbers as the model's MLP: widen twice, gate one by the other, project back down."


def small_model(seed: int = 4) -> ScratchLlama:
    """A 2-block ScratchLlama with random weights (norm weights too, so that every step shows in the output)."""
    cfg = ScratchConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=64)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = ScratchLlama(cfg)
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                param.data = 1 + 0.5 * torch.randn_like(param)
    return model.eval()


def _variant(model, ids, *, residual=True, mlp_norm="post_attention_layernorm", final_norm=True, mlp=True):
    """The forward pass with one thing changed: what a typical mistake computes. (Positions that start at 1, not 0,
    are no mistake here: RoPE makes the scores depend on offsets only, so the logits come out the same.)"""
    cos, sin = model.rope(torch.arange(ids.shape[1], device=ids.device))
    x = model.embed_tokens(ids)
    for block in model.layers:
        attn_out, _ = block.self_attn(block.input_layernorm(x), cos, sin)
        x = x + attn_out if residual else attn_out
        if mlp:
            out = block.mlp(getattr(block, mlp_norm)(x))
            x = x + out if residual else out
    return model.lm_head(model.norm(x) if final_norm else x)


def _no_shortcut() -> forbidden_all:
    return forbidden_all([(ScratchLlama, "forward"), (ScratchLlama, "trace"), (Block, "forward")],
                         "write the loop over the blocks yourself: x = x + attention(norm(x)), then "
                         "x = x + mlp(norm(x))")


@exercise
@hints("The model is a list of blocks between an embedding and a head. What goes in, what comes out of each block, "
       "and what happens after the last one?",
       "Start with x = model.embed_tokens(ids) and cos, sin = model.rope(positions). Each block adds two corrections to x: "
       "attention of its normed input (input_layernorm), then the MLP of its normed input (post_attention_layernorm). "
       "After the last block: model.norm, then model.lm_head.",
       "cos, sin = model.rope(torch.arange(ids.shape[1], device=ids.device)); x = model.embed_tokens(ids); "
       "for block in model.layers: "
       "attn, _ = block.self_attn(block.input_layernorm(x), cos, sin); x = x + attn; "
       "x = x + block.mlp(block.post_attention_layernorm(x)); return model.lm_head(model.norm(x))")
def check_forward(forward, model=None, ids=None) -> str:
    """Exercise 4.4: forward(model, ids) -> logits [batch, seq, vocab], the loop over the blocks written out."""
    expect(callable(forward), "define a function forward(model, ids) that returns the logits.")
    cases = [(small_model(), torch.tensor([[5, 17, 3, 96, 40, 2, 2]]))]
    if model is not None and ids is not None:
        cases.append((model, ids))
    for net, tokens in cases:
        with torch.no_grad():
            right = net(tokens)
            with _no_shortcut():
                out = returned(call(forward, net, tokens.clone()), "tensor", "the logits")
        expect(out.shape == right.shape, f"return the logits, [batch, seq, vocab] = {list(right.shape)}, not "
                                         f"{list(out.shape)}.")
        close = dict(atol=1e-4, rtol=1e-4) if right.dtype == torch.float32 else dict(atol=0.1, rtol=0.05)
        if torch.allclose(out.float(), right.float(), **close):
            continue
        mistakes = {"the final norm (model.norm) before the LM head is missing": dict(final_norm=False),
                    "add each sublayer's output to x instead of replacing x: x = x + attention(norm(x)), then "
                    "x = x + mlp(norm(x)); that sum is the residual stream": dict(residual=False),
                    "the MLP has its own norm: block.post_attention_layernorm, not input_layernorm a second time":
                        dict(mlp_norm="input_layernorm"),
                    "each block has an MLP after its attention: x = x + block.mlp(block.post_attention_layernorm(x))":
                        dict(mlp=False)}
        for message, change in mistakes.items():
            with torch.no_grad():
                wrong = _variant(net, tokens, **change)
            expect(not torch.allclose(out.float(), wrong.float(), **close), message + ".")
        expect(False, f"the logits differ from the model's by up to {(out.float() - right.float()).abs().max():.3g}: "
                      "embed, then for each block x = x + attention(norm(x)) and x = x + mlp(norm(x)), then norm and head.")
    where = "a random 2-block model" + (" and the real 30-block one" if len(cases) > 1 else "")
    return f"your loop gives the model's logits on {where}: a Llama is embed, N times (attention, MLP), norm, head."


@exercise
@hints("The logits at position t are the model's guess for the token at position t + 1. Which logits have an answer "
       "to compare with, and which token is it?",
       "Cross-entropy is minus the log-probability the model gave the right next token, averaged over the positions: "
       "log_softmax over the vocabulary, pick the target's entry (gather), negate, mean.",
       "logp = torch.log_softmax(logits[:, :-1].float(), dim=-1); target = ids[:, 1:]; "
       "return -logp.gather(-1, target[..., None]).mean()")
def check_next_token_loss(loss_fn) -> str:
    """Exercise 4.5: next_token_loss(logits, ids) -> the mean cross-entropy of each next token, in nats."""
    expect(callable(loss_fn), "define a function next_token_loss(logits, ids) that returns one number.")
    g = torch.Generator().manual_seed(5)
    cross_entropy = torch.nn.functional.cross_entropy
    library = [(torch.nn.functional, "cross_entropy"), (torch.nn.functional, "nll_loss"), torch.nn.CrossEntropyLoss,
               torch.nn.NLLLoss, (torch._C._nn, "cross_entropy_loss"), (torch._C._nn, "nll_loss"),
               (torch._C._nn, "nll_loss_nd"), (torch.distributions.Categorical, "log_prob"),
               (torch.nn.functional, "kl_div"), torch.nn.KLDivLoss, (torch, "kl_div")]
    for batch, seq, vocab in [(1, 7, 11), (2, 5, 13)]:
        logits = 3 * torch.randn(batch, seq, vocab, generator=g)
        ids = torch.randint(vocab, (batch, seq), generator=g)
        right = cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
        with forbidden_all(library, "compute it from log_softmax: minus the log-probability of each right next token, "
                                    "averaged"):
            got = call(loss_fn, logits.clone(), ids.clone())
        expect(not hasattr(got, "numel") or got.numel() == 1,
               f"return one number, the mean over every predicted position (a 0-d tensor or a float), not a tensor "
               f"of shape {list(getattr(got, 'shape', []))}.")
        got = returned(got, "number", "the loss (one number)")
        if abs(got - float(right)) < 1e-4:
            continue
        logp = torch.log_softmax(logits, dim=-1)
        picked = logp[:, :-1].gather(-1, ids[:, 1:, None])
        unshifted = cross_entropy(logits.reshape(-1, vocab), ids.reshape(-1))
        backwards = cross_entropy(logits[:, 1:].reshape(-1, vocab), ids[:, :-1].reshape(-1))
        expect(abs(got - float(unshifted)) > 1e-4, "shift the labels: the logits at position t predict token t + 1, "
                                                   "so compare logits[:, :-1] with ids[:, 1:].")
        expect(abs(got - float(backwards)) > 1e-4, "that is the shift the wrong way round: logits[:, :-1] go with "
                                                   "ids[:, 1:] (each position predicts the next token).")
        expect(abs(got + float(right)) > 1e-4, "the sign: cross-entropy is minus the log-probability, a positive number.")
        expect(abs(got - float(-picked.exp().mean())) > 1e-4 and abs(got - float(1 - picked.exp().mean())) > 1e-4,
               "take the log of the probability (log_softmax), not the probability itself.")
        expect(abs(got - float(-picked.sum())) > 1e-4, "average over the predicted positions, do not sum them.")
        expect(False, f"expected {float(right):.4f} nats, got {got:.4f}: log_softmax over the vocabulary (the last "
                      "dimension), the entry of the right next token, minus, mean.")
    return ("the mean cross-entropy of the next token, the number training lowers; exp of it is the perplexity, how "
            "many tokens the model hesitates between on average.")
