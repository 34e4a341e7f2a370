"""The real model with one thing changed: the experiments behind claims C3, C5 and C9 (notebooks 02-04).

Each experiment runs the from-scratch model (scratch.py) itself, not a copy of it, with one piece swapped for the
duration of a `with` block:

    with positions_shifted(model, 1000): ...        every RoPE position + 1000 (C3: only offsets matter)
    with kv_heads_read(model, [h % 3 for h ...]): ...  which K/V head each query head reads (C5: GQA's grouping)
    with mask_off(model): ...                       no causal mask in any layer (C9: what keeps the cache valid)
    with heads_ablated(model, [(18, 6)]): ...       those heads' outputs zeroed (notebook 03's induction head)
    with rope_off(model): ...                       no rotation at all: q and k as the projections made them
    with rope_interleaved(model): ...               RoPE turning pairs (2i, 2i + 1), not the checkpoint's (j, j + d/2)
    with attention_off(model) / residual_off / mlps_off / final_norm_off: ...  a part of every block, or the norm, gone

and the functions below measure what changes. A change that never reaches the model would make an experiment
show nothing, so each one counts the layers it reached and refuses to report otherwise.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from . import scratch as scratch_module
from .attention import repeat_kv
from ..errors import CourseError


@contextlib.contextmanager
def positions_shifted(model, shift: int):
    """Every RoPE position of `model` (a ScratchLlama) moved by `shift` tokens while the block runs.

    Yields a list that gains one entry per forward pass that read the shifted positions (check_shifted refuses a result none went through)."""
    if not isinstance(shift, int) or isinstance(shift, bool) or shift < 0:
        raise CourseError(f"shift must be a whole number of positions, 0 or more, not {shift!r}.")
    rope, reached = type(model).rope, []

    def shifted(positions):
        reached.append(1)
        return rope(model, positions + shift)

    model.rope = shifted  # the instance's rope hides the class's for the duration
    try:
        yield reached  # one entry per forward pass that took its positions from the shifted rope
    finally:
        del model.rope


@contextlib.contextmanager
def rope_off(model):
    """RoPE switched off in every layer of `model` while the block runs: cos 1 and sin 0, so q and k are not turned.

    Yields a list that gains one entry per forward pass that read the switched-off rope (check_shifted reads it)."""
    rope, reached = type(model).rope, []

    def unturned(positions):
        reached.append(1)
        cos, sin = rope(model, positions)
        return torch.ones_like(cos), torch.zeros_like(sin)

    model.rope = unturned
    try:
        yield reached
    finally:
        del model.rope


@contextlib.contextmanager
def rope_interleaved(model):
    """Every layer turns the pairs (2i, 2i + 1) of q and k, the original RoPE's layout, by the angles the checkpoint's
    rotate-half layout gives the pairs (j, j + d/2): the right rotation of the wrong numbers for these weights.

    Yields a list that gains one entry per call (two per layer and pass: q and k)."""
    real, reached = scratch_module.apply_rope, []

    def interleaved(x, cos, sin):
        reached.append(1)
        half = x.shape[-1] // 2
        c, s = cos[..., :half], sin[..., :half]  # one angle per pair
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * c - odd * s, even * s + odd * c], dim=-1).flatten(-2)

    scratch_module.apply_rope = interleaved
    try:
        yield reached
    finally:
        scratch_module.apply_rope = real


@contextlib.contextmanager
def _forwards_replaced(modules, make):
    """Each module's forward replaced by `make(module, reached)` while the block runs (an instance attribute, which
    hides the class's); yields `reached`, which the replacements append to."""
    reached: list = []
    modules = list(modules)
    for module in modules:
        module.forward = make(module, reached)
    try:
        yield reached
    finally:
        for module in modules:
            del module.forward


def residual_off(model):
    """No residual stream: each sublayer's output replaces the stream instead of being added to it."""
    def make(block, reached):
        def forward(x, cos, sin, cache=None, key_mask=None, return_weights=False):
            reached.append(1)
            attn_out, weights = block.self_attn(block.input_layernorm(x), cos, sin, cache, key_mask, return_weights)
            return block.mlp(block.post_attention_layernorm(attn_out)), weights
        return forward
    return _forwards_replaced(model.layers, make)


def attention_off(model):
    """Every block's attention gives zeros: no token reads any other."""
    def make(attn, reached):
        def forward(x, *args, **kwargs):
            reached.append(1)
            return torch.zeros_like(x), None
        return forward
    return _forwards_replaced((block.self_attn for block in model.layers), make)


def mlps_off(model):
    """Every block's MLP gives zeros: the blocks are attention alone."""
    return _forwards_replaced((block.mlp for block in model.layers),
                              lambda mlp, reached: lambda x: (reached.append(1), torch.zeros_like(x))[1])


def final_norm_off(model):
    """The norm before the LM head passes the stream through unchanged."""
    return _forwards_replaced([model.norm], lambda norm, reached: lambda x: (reached.append(1), x)[1])


def final_norm_constant(model):
    """The norm before the LM head divides the whole pass by ONE number, the stream's root-mean-square over every
    position and feature, instead of each position by its own; its learned weight stays. The control for
    final_norm_off: it keeps the logits' scale and takes away only the per-position normalization."""
    def constant(norm, reached):
        def forward(x):  # [batch, seq, hidden]
            reached.append(1)
            x32 = x.float()
            return norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean() + norm.eps)).to(x.dtype)
        return forward
    return _forwards_replaced([model.norm], constant)


@contextlib.contextmanager
def _attention_replaced(model, replacement):
    """Every layer's call of attention() goes through `replacement(real_attention, q, k, v, **kw)`."""
    real = scratch_module.attention
    reached = []

    def changed(q, k, v, **kwargs):
        reached.append(1)
        return replacement(real, q, k, v, **kwargs)

    scratch_module.attention = changed
    try:
        yield reached
    finally:
        scratch_module.attention = real


def check_shifted(reached, passes: int = 1) -> None:
    """Refuse a result from a positions_shifted block that fewer than `passes` forward passes went through."""
    if len(reached) < passes:
        raise CourseError(f"the shifted positions reached {len(reached)} forward passes, not {passes}: "
                          "the model did not take its positions from its rope().")


def _check_reached(reached, model, runs: int = 1) -> None:
    if len(reached) < runs * model.cfg.num_layers:
        raise CourseError(f"the change reached {len(reached)} attention calls, not every layer's "
                          f"({model.cfg.num_layers} per pass): the model did not run its plain attention path.")


@contextlib.contextmanager
def kv_heads_read(model, kv_of_head):
    """Query head h reads K/V head `kv_of_head[h]` in every layer (GQA reads h // group size)."""
    cfg = model.cfg
    index = torch.as_tensor(list(kv_of_head), dtype=torch.long)
    if index.shape != (cfg.num_heads,) or int(index.min()) < 0 or int(index.max()) >= cfg.num_kv_heads:
        raise CourseError(f"give one K/V head (0 to {cfg.num_kv_heads - 1}) for each of the {cfg.num_heads} "
                          f"query heads, not {list(kv_of_head)}.")

    def regrouped(real, q, k, v, **kwargs):
        i = index.to(k.device)
        return real(q, k[:, i], v[:, i], **kwargs)  # [batch, heads, seq, head_dim]: one K/V per query head

    with _attention_replaced(model, regrouped) as reached:
        yield reached


@contextlib.contextmanager
def kv_repeated(model):
    """Every layer copies each K/V head for its group of query heads (repeat_kv), the way eager transformers does."""
    n_rep = model.cfg.num_heads // model.cfg.num_kv_heads

    def repeated(real, q, k, v, **kwargs):
        return real(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), **kwargs)  # [batch, heads, seq, head_dim]

    with _attention_replaced(model, repeated) as reached:
        yield reached


@contextlib.contextmanager
def mask_off(model):
    """No causal mask in any layer: every query may read every key it is given."""

    def unmasked(real, q, k, v, **kwargs):
        kwargs["causal"] = False
        return real(q, k, v, **kwargs)

    with _attention_replaced(model, unmasked) as reached:
        yield reached


@contextlib.contextmanager
def heads_ablated(model, heads):
    """The output of each (layer, head) in `heads` set to zero on its way into o_proj, in every pass of the block.

    Yields a list that gains one entry per layer call it reached: one per chosen layer and pass."""
    cfg, reached = model.cfg, []
    chosen: dict[int, list[int]] = {}
    for layer, head in heads:
        if not (0 <= layer < cfg.num_layers and 0 <= head < cfg.num_heads):
            raise CourseError(f"no head {head} in layer {layer}: the model has {cfg.num_layers} layers of "
                              f"{cfg.num_heads} heads.")
        chosen.setdefault(layer, []).append(head)

    def zeroing(heads_here):
        def pre_hook(module, args):
            x = args[0].clone()  # [batch, seq, heads * head_dim]: the heads side by side
            for h in heads_here:
                x[..., h * cfg.head_dim:(h + 1) * cfg.head_dim] = 0
            reached.append(1)
            return (x,) + tuple(args[1:])
        return pre_hook

    handles = [model.layers[layer].self_attn.o_proj.register_forward_pre_hook(zeroing(hs))
               for layer, hs in chosen.items()]
    try:
        yield reached
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def logits_with(model, ids: torch.Tensor, change=None) -> torch.Tensor:
    """The model's logits `[batch, seq, vocab]` for `ids`, with `change` (one of the context managers above,
    as a function of the model, or None) applied."""
    if change is None:
        return model(ids)
    with change(model) as reached:
        logits = model(ids)
    _check_reached(reached, model)
    return logits


def relative_change(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |a| (Frobenius norms): how large a change is against the size of what changed; 0 = none."""
    return float((a.float() - b.float()).norm() / a.float().norm().clamp_min(1e-30))


@dataclass
class CacheDivergence:
    """One cached decode step against the full forward pass, block by block, at the newest position."""

    per_layer: list[float]  # relative change |full - cached| / |full| of the stream after each block (1, 2, ...)
    logits: float  # the same for the logits
    masked: bool  # whether the causal mask was on


@torch.no_grad()
def cached_vs_full(model, ids: torch.Tensor, masked: bool = True) -> CacheDivergence:
    """Prefill `ids[:, :-1]` into a KV cache, decode the last token from it, and compare with one full pass over
    all of `ids`: the stream after every block and the logits, at the last position. With the mask on they agree
    (to rounding); with the mask off every layer's cached keys and values are stale from layer 1 on."""
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise CourseError("give ids [batch, seq] with at least 2 tokens: a prompt and one token to decode.")
    scope = contextlib.nullcontext([1] * (3 * model.cfg.num_layers)) if masked else mask_off(model)
    with scope as reached:
        full = model.trace(ids, keep_hidden=True)
        cache = model.new_cache(ids.shape[0], ids.shape[1])
        model(ids[:, :-1], cache)
        step = model.trace(ids[:, -1:], cache, keep_hidden=True)
    _check_reached(reached, model, runs=3)
    per_layer = [relative_change(f[:, -1], s[:, -1])
                 for f, s in zip(full.hidden_states[1:], step.hidden_states[1:])]
    return CacheDivergence(per_layer, relative_change(full.logits[:, -1], step.logits[:, -1]), masked)
