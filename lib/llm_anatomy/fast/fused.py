"""Fewer, bigger matmuls: the from-scratch model with its projections fused (claim C20).

A decode step of the plain model (scratch.py) makes seven matmul calls per layer: q, k, v, o, gate, up
and down. Each call is a separate trip through Python and PyTorch's dispatcher (and, on a GPU, a separate
kernel launch), and for one token of a small model each does very little work. Fusing them is a marked
change of the plain modules, built once from the same weights:

    qkv_proj = cat([q_proj, k_proj, v_proj])     one matmul, then split: [q | k | v]
    gate_up_proj = cat([gate_proj, up_proj])     one matmul, then chunk: [gate | up]

so four calls per layer instead of seven. `fuse(model)` gives a ScratchLlama whose blocks use them: the
same `prefill`, `decode_step` and `generate_greedy` run it, and its logits equal the plain model's
(within float rounding: the sums are the same numbers, added in another order).

A second, separate lever is the layout of each weight in memory. nn.Linear keeps W as [out, in] and
computes x @ W.T; keeping the transpose [in, out] contiguous instead lets some CPUs' matrix-vector kernels
stream the weights faster (measure it: `fuse(model, layout="in_out")`). Both copies cost memory once:
the fused model holds its own weights beside the plain one's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..model.attention import attention, sdpa_attention
from ..device import timed
from ..errors import CourseError
from ..model.rope import apply_rope
from ..model.scratch import MLP, Attention, RMSNorm, ScratchLlama

LAYOUTS = ("out_in", "in_out")


class Projection(nn.Module):
    """y = x @ W.T for a weight W [out, in], stored as given ("out_in", like nn.Linear) or transposed ("in_out")."""

    def __init__(self, weight: torch.Tensor, layout: str = "out_in"):
        super().__init__()
        if layout not in LAYOUTS:
            raise CourseError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}.")
        self.layout, self.out_features = layout, weight.shape[0]
        stored = weight.detach() if layout == "out_in" else weight.detach().T.contiguous()  # [out, in] or [in, out]
        self.weight = nn.Parameter(stored, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "in_out":
            return x @ self.weight  # [..., in] @ [in, out]
        return F.linear(x, self.weight)  # [..., in] @ [out, in].T, what nn.Linear does


class FusedAttention(Attention):
    """Attention with one matmul for q, k and v (and a choice of attention function, e.g. tiled)."""

    def __init__(self, plain: Attention, layout: str = "out_in", attend=attention):
        nn.Module.__init__(self)
        self.cfg, self.layer, self.attend = plain.cfg, plain.layer, attend
        d = self.cfg.head_dim
        self.sizes = [self.cfg.num_heads * d, self.cfg.num_kv_heads * d, self.cfg.num_kv_heads * d]  # q | k | v
        w = torch.cat([plain.q_proj.weight, plain.k_proj.weight, plain.v_proj.weight])  # new: [q + 2 kv, hidden]
        self.qkv_proj = Projection(w, layout)  # new: one matmul instead of three
        self.o_proj = Projection(plain.o_proj.weight, layout)

    def project(self, x, cos, sin):  # new: the plain forward pass calls this instead of Attention.project
        b, s, _ = x.shape
        d, heads, kv_heads = self.cfg.head_dim, self.cfg.num_heads, self.cfg.num_kv_heads
        qkv = self.qkv_proj(x).view(b, s, heads + 2 * kv_heads, d).transpose(1, 2)  # new: [b, q|k|v heads, s, d]
        qk = apply_rope(qkv[:, :heads + kv_heads], cos, sin)  # new: one rotation for the q and k heads together
        return qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads:]  # [b, heads | kv_heads | kv_heads, s, d]

    def kernel(self, q, k, v, *, key_mask=None, return_weights=False):  # new: any attention function
        out = self.attend(q, k, v, causal=True, key_mask=key_mask, return_weights=return_weights)
        return out if return_weights else (out, None)


class FusedRMSNorm(nn.Module):
    """RMSNorm in one call (torch's fused kernel) instead of seven small ones, on the plain norm's own weight
    (shared, not copied)."""

    def __init__(self, plain: RMSNorm):
        super().__init__()
        self.eps, self.weight = plain.eps, plain.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)  # new: x / sqrt(mean(x^2) + eps) * weight


class FusedMLP(MLP):
    """SwiGLU with one matmul for gate and up: down(silu(gate) * up), [gate | up] = x @ [gate; up].T."""

    def __init__(self, plain: MLP, layout: str = "out_in"):
        nn.Module.__init__(self)
        self.gate_up_proj = Projection(torch.cat([plain.gate_proj.weight, plain.up_proj.weight]), layout)  # new
        self.down_proj = Projection(plain.down_proj.weight, layout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # new: one call, then two views
        return self.down_proj(F.silu(gate) * up)


def sdpa_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True, key_mask=None,
                return_weights: bool = False) -> torch.Tensor:
    """torch's fused attention (model.attention.sdpa_attention) in the calling convention of fuse()'s `attend`.

    It never keeps the weights, so it refuses return_weights: look at them through the plain attention."""
    if return_weights:
        raise CourseError("SDPA keeps no attention weights: use fuse(model) with the plain attention to look at them.")
    return sdpa_attention(q, k, v, causal=causal, key_mask=key_mask)


def fuse(model: ScratchLlama, layout: str = "out_in", attend=attention) -> ScratchLlama:
    """A ScratchLlama computing what `model` computes, with q/k/v and gate/up fused (4 matmuls per layer, not 7).

    layout: "out_in" keeps each weight as nn.Linear does; "in_out" stores it transposed (also the LM head).
    attend: the attention function (the plain one by default; e.g. tiled_attention for long prompts).
    The embedding and the norm weights are shared with `model` (each norm runs as one fused call). The fused
    matrices are copies made once (about half the model's weight memory); with "in_out" every matrix is a
    transposed copy (as much memory as the model's weights).
    """
    if not isinstance(model, ScratchLlama):
        raise CourseError("fuse() takes a ScratchLlama: build one with ScratchLlama.from_hf(loaded).")
    if layout not in LAYOUTS:
        raise CourseError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}.")
    with torch.device("meta"):  # the skeleton costs nothing: every part is replaced below
        fast = ScratchLlama(model.cfg)
    fast.embed_tokens, fast.norm = model.embed_tokens, FusedRMSNorm(model.norm)  # the weights are shared
    with torch.no_grad():
        for ours, plain in zip(fast.layers, model.layers):
            ours.input_layernorm = FusedRMSNorm(plain.input_layernorm)
            ours.post_attention_layernorm = FusedRMSNorm(plain.post_attention_layernorm)
            ours.self_attn = FusedAttention(plain.self_attn, layout, attend)
            ours.mlp = FusedMLP(plain.mlp, layout)
        fast.lm_head = model.lm_head if layout == "out_in" else Projection(model.lm_head.weight, layout)
    return fast.eval()


def matmuls_per_layer(model: ScratchLlama) -> int:
    """How many matmul calls one block makes on its weights: 7 plain, 4 fused."""
    block = model.layers[0]
    return sum(isinstance(m, (nn.Linear, Projection)) for m in block.modules())


def compile_step(fn, device: torch.device | str = "cpu", *, mode: str | None = None, backend: str = "inductor",
                 static=()):
    """`torch.compile(fn)` run once: (compiled function, seconds its first call took, graph breaks found).

    The first call traces the Python code into graphs and generates kernels (minutes for a whole model on a
    small CPU); a graph break is where tracing had to stop, for example at `int(tensor)`, which reads a value
    back to the host. mode="reduce-overhead" also replays CUDA graphs on a GPU; backend="eager" only traces
    (no code generation, no C++ compiler needed). static: tensors the step mutates in place and keeps between calls
    (a StaticDecoder's KV cache, `pos` and `token`): marked as static addresses, so that CUDA graph trees record
    them instead of skipping the graph (see cudagraph_skips).
    """
    import torch._dynamo as dynamo

    for t in static:
        dynamo.mark_static_address(t)
    explained = dynamo.explain(fn)()
    compiled = torch.compile(fn, mode=mode, backend=backend)
    seconds, _ = timed(compiled, device)
    return compiled, seconds, explained.graph_break_count


def cudagraph_skips() -> int:
    """How many times torch.compile's inductor has so far decided to run a graph without CUDA graphs (a counter
    that only grows: compare it before and after a compile to see whether the graphs were used)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


# --------------------------------------------------------------------------- C20's checks (notebook 09, section 4)


def fusion_evidence(plain32: ScratchLlama, variants: dict, prompt: torch.Tensor, plain_ops: int, fused_ops: int,
                    new_tokens: int = 24) -> tuple[bool, str]:
    """C20's fusion: (whether every fused variant gives the plain fp32 logits within 1e-4 and the same greedy tokens,
    with 4 weight matmuls per layer instead of 7 and fewer ops per step, the evidence). variants: {name: fp32 fused
    model}; plain_ops, fused_ops: the ops one decode step dispatches, plain and fused (measure/overhead.count_ops)."""
    from ..generate.decode import generate_greedy

    plain_tokens = generate_greedy(plain32, prompt, new_tokens).tokens
    with torch.no_grad():
        plain_logits = plain32(prompt)
        gaps = {name: (m(prompt) - plain_logits).abs().max().item() for name, m in variants.items()}
    same = {name: torch.equal(generate_greedy(m, prompt, new_tokens).tokens, plain_tokens)
            for name, m in variants.items()}
    per_layer = {name: matmuls_per_layer(m) for name, m in variants.items()}
    holds = (all(g < 1e-4 for g in gaps.values()) and all(same.values()) and all(n == 4 for n in per_layer.values())
             and fused_ops < plain_ops)
    return holds, ("fused models give the plain logits within " + ", ".join(f"{g:.0e}" for g in gaps.values())
                   + f" (bar 1e-4), {'the same' if all(same.values()) else 'NOT the same'} {new_tokens} greedy tokens, "
                   + f"{'/'.join(map(str, per_layer.values()))} weight matmuls per layer instead of 7 and {fused_ops} "
                   f"operations per step instead of {plain_ops}")


def graph_break_evidence(model_call_breaks: int, static_step_breaks: int) -> tuple[bool, str]:
    """C20's tracing: (the model call breaks its graph, at its host read, and the fixed-shape step traces whole, the
    evidence). A fixed-shape step that read a value back to the host (an id check, `.item()`) would break too."""
    return (model_call_breaks >= 1 and static_step_breaks == 0,
            f"the model call breaks its graph {model_call_breaks} time(s) (the range check's host read); "
            f"the fixed-shape "
            f"step {static_step_breaks} time(s)" + (": it traces whole" if static_step_breaks == 0 else ""))


# Replay must take at most this share of the eager step. Not measured on a GPU in this repository's runs (none was
# lent); a CUDA graph of a 135M model's step at batch 1 replaces hundreds of launches by one, which gpt-fast and
# vLLM report as a several-fold gain; a "replay" that relaunches every kernel (eager under another name) sits at 1.0
# give or take the noise, which the fastest of interleaved repeats keeps within a few per cent.
REPLAY_MARGIN = 0.8


def replay_evidence(eager_s: float, replay_s: float, margin: float = REPLAY_MARGIN) -> tuple[bool, str]:
    """C20 on a GPU: (graph replay took at most `margin` times the eager step, the evidence). Both the fastest of
    interleaved repeats of the same fixed-shape step (time_interleaved)."""
    if eager_s <= 0 or replay_s <= 0:
        raise CourseError(f"Give two positive times in seconds, not {eager_s} and {replay_s}.")
    return (replay_s <= margin * eager_s,
            f"the fixed-shape step eager {eager_s * 1e3:.3f} ms, replayed from a CUDA graph {replay_s * 1e3:.3f} ms: "
            f"{replay_s / eager_s:.2f}x (bar {margin:.2f}x)")
