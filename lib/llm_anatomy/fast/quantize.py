"""Quantization: storing weights in fewer bits, and measuring what that costs (claim C17).

In fp32 every weight takes 4 bytes. A quantized format stores each weight as a small integer
code, plus a few floats per group of weights that turn the codes back into numbers:

    weight = d * code + m     asymmetric: GGML's Q4_1 and our int4 (codes 0..15)
    weight = d * code         symmetric: GGML's Q8_0 and our int8 (codes -127..127)

Decoding reads every weight once per token, so fewer bytes per weight means fewer bytes per token
and a smaller download; the price is that each weight moves to the nearest value its group can store.
The course's own file is read by hand in gguf_blocks.py. Here: 1. we quantize fp32 weights ourselves, and
round-trip a model's weights through a format (fake quantization: measure/quality.py measures the damage, KL
divergence, top-1 agreement, perplexity); 2. we quantize the KV cache. Fake quantization computes in fp32, so it
shows quality, never time: packed.py runs the whole model on kernels that read the codes themselves.
Sizes are in bytes, errors in the weights' own units, KL divergence in nats, times in seconds.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..device import dtype_named
from ..errors import CourseError
from ..weights.load import transformers_model

# --------------------------------------------------------------------------- 1. quantizing weights ourselves


def _matrix(w: torch.Tensor) -> torch.Tensor:
    if not isinstance(w, torch.Tensor) or w.ndim != 2 or not w.is_floating_point():
        raise CourseError("Pass a weight matrix: a 2-D float tensor [out_features, in_features].")
    if not bool(torch.isfinite(w).all()):
        raise CourseError("The weights hold NaN or infinite values: no scale can store them; check where they came "
                          "from (a failed load, an overflow in fp16) before quantizing.")
    return w.detach().float()


def quantize_int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per output row (channel), rounding to nearest.

    scale = max|w| / 127 per row, code = round(w / scale), so each weight moves by at most scale / 2.
    w [out, in] -> codes [out, in] int8 in -127..127, scale [out] fp32 (weight units per code step).
    """
    w = _matrix(w)  # [out, in]
    scale = w.abs().amax(dim=1) / 127  # [out]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: any scale will do
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def dequantize_int8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """codes [out, in] int8, scale [out] -> fp32 weights [out, in] = code * scale."""
    return codes.float() * scale[:, None]


def int4_codes(w: torch.Tensor, group_size: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit codes per group of `group_size` neighbouring weights of a row, the grid of Q4_1.

    Per group: minimum = min(w), scale = (max(w) - minimum) / 15, code = round((w - minimum) / scale)
    in 0..15, so each weight moves by at most scale / 2 and comes back as code * scale + minimum.
    w [out, in] -> codes [out, in] uint8 (one code a byte, not packed), scale and minimum [out, in // group_size] fp32.
    """
    w = _matrix(w)  # [out, in]
    out_f, in_f = w.shape
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2 \
            or in_f % group_size:
        fits = [g for g in (16, 32, 64, 128, 256) if in_f % g == 0]
        raise CourseError(f"The group size must be even and divide the row length {in_f}; {group_size!r} does not: "
                          f"try {' or '.join(map(str, fits[-3:])) or 2}.")
    groups = w.reshape(out_f, in_f // group_size, group_size)  # [out, groups, group_size]
    minimum = groups.amin(dim=-1)  # [out, groups]
    scale = (groups.amax(dim=-1) - minimum) / 15  # [out, groups]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group: code 0 is exact
    codes = torch.round((groups - minimum[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    return codes.reshape(out_f, in_f), scale, minimum


def quantize_int4_groupwise(w: torch.Tensor, group_size: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int4_codes with two codes a byte: code 2i in the low nibble, code 2i + 1 in the high one (GGML pairs weight j
    with weight j + 16 instead). w [out, in] -> codes [out, in // 2] uint8, scale and minimum [out, groups] fp32."""
    codes, scale, minimum = int4_codes(w, group_size)  # [out, in]
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scale, minimum  # packed: [out, in // 2]


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """packed [out, in // 2] uint8, scale and minimum [out, groups] -> fp32 [out, in] = code * scale + minimum."""
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)  # [out, in]
    groups = codes.float().reshape(*scale.shape, -1)  # [out, groups, group_size]
    return (groups * scale[..., None] + minimum[..., None]).reshape(codes.shape)


def bytes_per_weight(fmt: str, in_features: int | None = None, group_size: int = 32) -> float:
    """Storage per weight in bytes, counting each format's scales and minimums.

    int8 keeps one fp32 scale per row of `in_features` weights, our int4 an fp32 scale and minimum
    per group, GGML's blocks fp16 ones (Q8_0: 34 bytes per 32 weights, Q4_1: 20 bytes per 32).
    """
    if fmt == "int8" and not in_features:
        raise CourseError("int8 keeps one scale per row: give the row length too, e.g. in_features=576.")
    sizes = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1 + 4 / (in_features or 1),
             "int4": 0.5 + 8 / group_size, "q8_0": 34 / 32, "q4_1": 20 / 32}
    if fmt not in sizes:
        raise CourseError(f"Unknown format {fmt!r}: use one of {', '.join(sizes)}.")
    return sizes[fmt]


def weight_bytes_per_token(model, fmt: str, group_size: int = 32, head_fmt: str | None = None) -> int:
    """Bytes of weights one decode step reads: every matmul weight of the blocks in `fmt`, the LM head in
    `head_fmt` (default: the same). `model` is a ScratchLlama; embedding rows are looked up, not read whole."""
    blocks = [m.weight for m in model.layers.modules() if isinstance(m, nn.Linear)]
    head = model.lm_head.weight  # [vocab, hidden]
    total = sum(w.numel() * bytes_per_weight(fmt, w.shape[1], group_size) for w in blocks)
    return round(total + head.numel() * bytes_per_weight(head_fmt or fmt, head.shape[1], group_size))


def fake_quantize(w: torch.Tensor, fmt: str, group_size: int = 32) -> torch.Tensor:
    """`w` after a quantize -> dequantize round trip in fmt (fp32, fp16, bf16, int8, int4); same shape and dtype."""
    if fmt in ("fp32", "fp16", "bf16"):
        return w.detach().to(dtype_named(fmt)).to(w.dtype)
    if fmt == "int8":
        return dequantize_int8(*quantize_int8_per_channel(w)).to(w.dtype)
    if fmt == "int4":
        return dequantize_int4(*quantize_int4_groupwise(w, group_size)).to(w.dtype)
    raise CourseError(f"Fake quantization knows fp32, fp16, bf16, int8 and int4, not {fmt!r}.")


@contextlib.contextmanager
def quantize_model_weights(model: nn.Module, fmt: str, group_size: int = 32, head_fmt: str | None = None):
    """Inside the with-block, every Linear weight in the model's blocks is its `fmt` round trip.

    Fake quantization: the weights stay fp32 but take only values the format can store, so the
    outputs show the quality lost (not the speed gained). The embedding stays; the LM head too, unless
    head_fmt names a format for it ("int8", as the course's file keeps its head at 8 bits; then only the head's
    copy is quantized: embedding lookups keep the exact rows). The originals come back when the block ends, even
    after an error. Given a ScratchLlama, the transformers model it shares its weights with is never touched.
    Yields the number of weights changed.
    """
    module = transformers_model(model)
    blocks = module.layers if hasattr(module, "layers") else getattr(module.get_decoder(), "layers", None) \
        if hasattr(module, "get_decoder") else None  # a ScratchLlama's blocks, or a transformers model's
    if blocks is None:
        raise CourseError("Pass a ScratchLlama or a transformers Llama model: this one has no .layers.")
    linears = [(module, fmt) for module in blocks.modules() if isinstance(module, nn.Linear)]
    if head_fmt is not None:
        head = getattr(model, "lm_head", None)
        if not isinstance(head, nn.Linear):
            raise CourseError("head_fmt needs a model whose lm_head is a Linear layer (a ScratchLlama).")
        linears.append((head, head_fmt))
    originals = [module.weight for module, _ in linears]
    fake = [fake_quantize(module.weight, f, group_size) for module, f in linears]  # may raise: nothing changed yet
    try:
        for (module, _), w in zip(linears, fake):
            module.weight = nn.Parameter(w, requires_grad=False)  # a new tensor: the original stays intact
        yield sum(w.numel() for w in fake)
    finally:
        for (module, _), w in zip(linears, originals):
            module.weight = w


def stored_weight_bytes(model, fmt: str, group_size: int = 32, head_fmt: str | None = None) -> int:
    """The bytes of the tensors that `fmt` really stores for every matmul of the blocks and the LM head (in
    `head_fmt`): each matrix quantized here, its codes, scales and minimums counted as they lie in memory. The count
    weight_bytes_per_token gives by formula must equal it, byte for byte. fmt: fp32, int8 or int4."""
    def stored(w, f):
        if f == "fp32":
            return w.numel() * 4
        if f == "int8":
            return sum(t.numel() * t.element_size() for t in quantize_int8_per_channel(w))
        if f == "int4":
            return sum(t.numel() * t.element_size() for t in quantize_int4_groupwise(w, group_size))
        raise CourseError(f"stored_weight_bytes counts fp32, int8 and int4, not {f!r}.")
    blocks = [m.weight for m in model.layers.modules() if isinstance(m, nn.Linear)]
    return sum(stored(w, fmt) for w in blocks) + stored(model.lm_head.weight, head_fmt or fmt)


# int8's quality bar. KL is deterministic on a given machine (no timing): on the real model and the notebook's
# 256-token passage int8 per channel (head int8) measured 0.0051 nats, 95.7% top-1 agreement (0.006 for weights off
# the file's 4-bit grid, issue 44). False worlds: codes truncated instead of rounded 0.019 nats, 90.6%; one scale for
# the whole matrix instead of one a row 0.080, 84.8%; codes in -7..7 (4 bits in int8) 1.28, 44.5%.
INT8_KL_BOUND, INT8_AGREEMENT_BOUND = 0.01, 0.93


def linear_weight_count(cfg, head: bool = True) -> int:
    """How many weights quantize_model_weights must change, by formula from the config (not from the modules it
    walks): every block's q, k, v, o, gate, up and down projections, and the LM head when `head`."""
    attn = 2 * cfg.hidden_size * cfg.num_heads * cfg.head_dim + 2 * cfg.hidden_size * cfg.num_kv_heads * cfg.head_dim
    return cfg.num_layers * (attn + 3 * cfg.hidden_size * cfg.intermediate_size) + head * cfg.vocab_size * cfg.hidden_size


# int8's KL must also be above this: a quantizer that changed nothing (weights restored before the forward, or rounded
# to themselves) gives a KL of 0. Measured: int8 per channel on SmolLM2-135M's 256-token passage, 0.005 nats (50x).
INT8_KL_FLOOR = 1e-4


def quantization_evidence(per_token: dict[str, int], stored: dict[str, int], kl8: float,
                          agree8: float, *, changed: int, should_change: int) -> tuple[bool, str]:
    """C17's bytes-and-quality half: (whether it holds, the evidence in words).

    per_token: the bytes per token by formula (weight_bytes_per_token) of "fp32", "int8" and "int4"; stored: the
    same counted from the quantized tensors (stored_weight_bytes); kl8, agree8: int8's KL against fp32 (nats) and
    its top-1 agreement. Holds when every format's formula equals its stored bytes exactly, int8 and int4 read
    fewer bytes than fp32 (int8 under 0.3x: a quarter plus its scales), and int8 stays under INT8_KL_BOUND with
    INT8_AGREEMENT_BOUND of top tokens unchanged, and the quantizer really changed the model: it replaced
    `changed` weights (what quantize_model_weights yields), equal to `should_change` (linear_weight_count), and int8's
    KL is above INT8_KL_FLOOR (a quantizer that changed nothing gives 0). int4's KL is not asserted: these weights already sit on the file's
    4-bit grid, so int4 in groups of 32 finds them again and its KL says nothing about what 4 bits cost.
    """
    exact = {fmt: per_token[fmt] == stored[fmt] for fmt in stored}
    cut = per_token["int8"] < 0.3 * per_token["fp32"] and per_token["int4"] < per_token["int8"]
    good = kl8 < INT8_KL_BOUND and agree8 >= INT8_AGREEMENT_BOUND
    real = changed == should_change and kl8 > INT8_KL_FLOOR
    counts = ", ".join(f"{fmt} {per_token[fmt]:,}" + ("" if exact[fmt] else f" (stored: {stored[fmt]:,})")
                       for fmt in stored)
    return (all(exact.values()) and cut and good and real,
            "bytes per token, by formula and counted in the quantized tensors"
            f"{'' if all(exact.values()) else ' (they differ)'}: "
            f"{counts}; int8 reads {per_token['int8'] / per_token['fp32']:.3f}x fp32's bytes at a KL of {kl8:.4f} nats "
            f"(bar {INT8_KL_BOUND}; above {INT8_KL_FLOOR}: the weights did change) with {agree8:.1%} of top tokens "
            f"unchanged (bar {INT8_AGREEMENT_BOUND:.0%}); {changed:,} weights quantized, of the {should_change:,} in "
            f"the Linear layers and the head")


# --------------------------------------------------------------------------- 2. the KV cache in int8


def quantize_kv_int8(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 keys (or values) with one scale per (batch, head, position), across head_dim.

    k [batch, kv_heads, seq, head_dim] -> codes int8 of the same shape, scale [batch, kv_heads, seq, 1]
    fp32. Each position is quantized once, when it is written, and never changes after.
    """
    k = k.detach().float()
    scale = k.abs().amax(dim=-1, keepdim=True) / 127  # [batch, kv_heads, seq, 1]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(k / scale).clamp(-127, 127).to(torch.int8), scale


def dequantize_kv_int8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """codes int8 [batch, kv_heads, seq, head_dim], scale [batch, kv_heads, seq, 1] -> fp32 like codes."""
    return codes.float() * scale


def kv_int8_max_error(k: torch.Tensor) -> float:
    """The largest |k - dequantize(quantize(k))| over all entries, in k's own units."""
    return (dequantize_kv_int8(*quantize_kv_int8(k)) - k.float()).abs().max().item()
