"""Packed-weight decode: every matmul of the model reads int8 or int4 codes through a packed kernel (claim C17).

Fake quantization (quantize.py) shows what rounding the weights costs in quality, but not in time: it still
computes in fp32 with every weight stored at 4 bytes. Time falls only where a matmul kernel reads the codes
themselves and turns them into numbers on the fly. PyTorch ships such kernels (the ones gpt-fast and torchao call):

    int8, CPU:  torch._weight_int8pack_mm(x [m, k], codes int8 [n, k], scale [n], in x's dtype)
    int8, GPU:  F.linear(x, codes.to(x.dtype)) * scale, gpt-fast's form: torch.compile fuses the conversion into
                the matmul; run eagerly it converts the whole matrix at every call (more bytes than bf16, not fewer)
    int4, CPU:  torch._convert_weight_to_int4pack_for_cpu(codes int32 [n, k], 1) once, then
                torch._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros [k / group, n, 2], x's dtype)
    int4, GPU:  torch._convert_weight_to_int4pack(codes uint8 [n, k / 2], inner_k_tiles) once, then
                torch._weight_int4pack_mm (tinygemm; compute capability 8.0 or newer)

int4 uses tinygemm's convention, weight = (code - 8) * scale + zero with zero = minimum + 8 * scale: the grid of
Q4_1's d * code + m. On a CPU both kernels take fp32, bf16 or fp16 activations (PyTorch 2.13), with the scales in
the activations' dtype; tinygemm on a GPU takes bf16. pack() gives them bf16 by default (`activations=`): each packed
matmul turns its input to that dtype and its output back, while the residual stream, the norms, attention (torch's
fused SDPA) and the KV cache stay fp32, as llama.cpp keeps its activations in fp32 between kernels (on a CPU, fp32's
small ops run several times faster than bf16's). Whether bf16 activations pay for the packed matmul itself is
measured, not assumed: notebook 09 times pack(model, fmt) with bf16 and with fp32 activations in turns (on the
2-core test machine, busy, fp32 activations made the int8 step 3.4-4.7x and the int4 step 10-15x slower: these
kernels' fp32 paths are far slower than their bf16 ones). The LM head stays at 8 bits, as the course's file keeps it
(Q8_0). `pack(model, "int8")` gives a ScratchLlama with fused projections (fused.py) whose every matmul is packed:
the same prefill, decode_step and generate_greedy run it.

What these kernels do not do, and llama.cpp's CPU kernels do: quantize the activations too (to int8 per block of
32), multiply int8 by int8 with integer dot-product instructions (AVX2's maddubs, AVX-VNNI, ARM's sdot), and run one
fused loop per block of weights. Sizes are in bytes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CourseError
from ..generate.decode import decode_step, generate_greedy, prefill
from ..measure.timing import time_interleaved
from ..model.scratch import ScratchLlama
from .fused import Projection, fuse, sdpa_attend
from .quantize import int4_codes, quantize_int8_per_channel

FORMATS = ("int8", "int4")
ACTIVATIONS = torch.bfloat16  # what the packed kernels multiply by, unless pack(activations=) says otherwise
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the CPU kernels take (PyTorch 2.13)
READS_CODES = ("torch._weight_int8pack_mm", "torch._weight_int4pack_mm_for_cpu", "torch._weight_int4pack_mm")
DEQUANTIZES_EACH_CALL = "F.linear(x, codes.to(x.dtype)) * scale"  # int8 on a GPU without the packed op, run eagerly


def _int4_tiles(k: int) -> int:
    """tinygemm's inner k-tiles: the largest of 8, 4, 2 with k divisible by 16 times it (576 takes 4)."""
    return next((t for t in (8, 4, 2) if k % (16 * t) == 0), 0)


class PackedProjection(Projection):
    """y = x @ W.T with W held as int8 codes (one scale a row) or int4 codes (a scale and a zero a group).

    weight: the fp32 matrix [out, in] to pack; fmt "int8" or "int4"; group_size for int4 (it must divide `in`);
    activations: the dtype the kernel multiplies in (bf16 by default; fp16 or fp32 on a CPU), its scales held in it.
    `kernel` names what runs; `nbytes` is what a call reads of the weights (codes, scales and zeros).
    """

    def __init__(self, weight: torch.Tensor, fmt: str = "int8", group_size: int = 32,
                 activations: torch.dtype = ACTIVATIONS):
        nn.Module.__init__(self)
        if fmt not in FORMATS:
            raise CourseError(f"Packed formats are {', '.join(FORMATS)}, not {fmt!r}.")
        device, (out_f, in_f) = weight.device, weight.shape
        if activations not in ACTIVATION_DTYPES or (device.type != "cpu" and fmt == "int4"
                                                    and activations != torch.bfloat16):
            raise CourseError(f"The packed kernels multiply in bf16, fp16 or fp32 on a CPU (bf16 only for int4 on a "
                              f"GPU), not {activations} on {device.type}.")
        self.fmt, self.group_size, self.out_features, self.layout = fmt, group_size, out_f, "packed"
        self.activations = activations
        if fmt == "int8":
            codes, scale = quantize_int8_per_channel(weight)  # [out, in] int8, [out] fp32
            self.register_buffer("codes", codes)
            self.register_buffer("scale", scale.to(activations))  # [out]
            self.kernel = READS_CODES[0] if _int8_op_runs(device) else DEQUANTIZES_EACH_CALL
        else:
            codes, scale, minimum = int4_codes(weight, group_size)  # [out, in] uint8 in 0..15, [out, groups] fp32
            tiles = _int4_tiles(in_f)
            if device.type != "cpu" and not tiles:
                raise CourseError(f"tinygemm needs the row length to be a multiple of 32; {in_f} is not.")
            zero = minimum + 8 * scale  # (code - 8) * scale + zero = code * scale + minimum
            self.register_buffer("scales_and_zeros", torch.stack([scale.T, zero.T], -1).contiguous().to(activations))
            if device.type == "cpu":  # [k / group, n, 2] above; the packed codes below
                self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(codes.int(), 1))
                self.kernel = "torch._weight_int4pack_mm_for_cpu"
            else:  # two codes a byte, the even column in the high nibble
                pairs = (codes[:, 0::2] << 4) | codes[:, 1::2]  # [out, in / 2] uint8
                self.register_buffer("packed", torch._convert_weight_to_int4pack(pairs.contiguous(), tiles))
                self.kernel = "torch._weight_int4pack_mm"
        self.nbytes = sum(b.numel() * b.element_size() for b in self.buffers())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(self.activations)  # [tokens, in], in the kernels' dtype (bf16 by default)
        return self.matmul(rows).view(*x.shape[:-1], self.out_features).to(x.dtype)  # [..., out], the caller's dtype

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        """The packed kernel alone: rows `[tokens, in]` in the activations' dtype -> `[tokens, out]` in it."""
        if self.fmt == "int8":
            if self.kernel == "torch._weight_int8pack_mm":
                y = torch._weight_int8pack_mm(rows, self.codes, self.scale)
            else:
                y = F.linear(rows, self.codes.to(rows.dtype)) * self.scale
        elif self.kernel == "torch._weight_int4pack_mm_for_cpu":
            y = torch._weight_int4pack_mm_for_cpu(rows, self.packed, self.group_size, self.scales_and_zeros)
        else:
            y = torch._weight_int4pack_mm(rows, self.packed, self.group_size, self.scales_and_zeros)
        return y

    def dequantized(self) -> torch.Tensor:
        """The weights the kernel multiplies by, fp32 [out, in]: code * scale, or (code - 8) * scale + zero (for int4
        read out of the kernel itself, so rounded to the activations' dtype)."""
        if self.fmt == "int8":
            return self.codes.float() * self.scale.float()[:, None]
        eye = torch.eye(self.scales_and_zeros.shape[0] * self.group_size, dtype=self.activations,
                        device=self.packed.device)
        return self(eye).float().T.contiguous()  # the kernel applied to the identity: each column is one weight row


_INT8_OP: dict[str, bool] = {}


def _int8_op_runs(device: torch.device) -> bool:
    """Whether torch._weight_int8pack_mm runs on this kind of device (CPU: yes; a GPU: depends on the build)."""
    if device.type not in _INT8_OP:
        try:
            torch._weight_int8pack_mm(torch.ones(1, 32, dtype=ACTIVATIONS, device=device),
                                      torch.ones(8, 32, dtype=torch.int8, device=device),
                                      torch.ones(8, dtype=ACTIVATIONS, device=device))
            _INT8_OP[device.type] = True
        except (RuntimeError, NotImplementedError, AttributeError):
            _INT8_OP[device.type] = False
    return _INT8_OP[device.type]


def kernel_status(fmt: str, device: torch.device | str = "cpu") -> tuple[bool, str]:
    """Whether the packed `fmt` kernel runs on `device` and gives the right numbers: (True, kernel) or (False, why)."""
    device = torch.device(device)
    if fmt not in FORMATS:
        raise CourseError(f"Packed formats are {', '.join(FORMATS)}, not {fmt!r}.")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g).to(device)  # [out, in]
    x = torch.randn(3, 256, generator=g).to(device, ACTIVATIONS)  # [tokens, in]
    try:
        layer = PackedProjection(w, fmt, 32)
        got = layer(x).float()
        want = x.float() @ dequantized_reference(w, fmt, 32).T.to(device)
    except (RuntimeError, NotImplementedError, AttributeError, CourseError) as err:
        return False, f"{fmt} on {device.type}: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
    error = ((got - want).abs().max() / want.abs().max()).item()
    if not error < 0.02:  # bf16 activations and scales: a few parts in a thousand
        return False, f"{fmt} on {device.type}: the kernel ran but gave numbers {error:.1%} off the codes' own"
    return True, layer.kernel


def dequantized_reference(w: torch.Tensor, fmt: str, group_size: int = 32) -> torch.Tensor:
    """The weights a packed `fmt` layer multiplies by, computed by hand without its kernel, fp32 [out, in]:
    int8 code * scale, int4 (code - 8) * scale + zero, with the scales (and zeros) rounded to bf16 as the layer
    holds them."""
    if fmt == "int8":
        codes, scale = quantize_int8_per_channel(w)  # [out, in], [out]
        return codes.float() * scale.to(ACTIVATIONS).float()[:, None]
    codes, scale, minimum = int4_codes(w, group_size)  # [out, in], [out, groups]
    scale16, zero16 = scale.to(ACTIVATIONS).float(), (minimum + 8 * scale).to(ACTIVATIONS).float()
    groups = codes.float().view(*scale.shape, group_size)  # [out, groups, group_size]
    return ((groups - 8) * scale16[..., None] + zero16[..., None]).view(w.shape)


def pack(model: ScratchLlama, fmt: str = "int8", group_size: int = 32, head_fmt: str = "int8",
         activations: torch.dtype = ACTIVATIONS) -> ScratchLlama:
    """A ScratchLlama with q/k/v and gate/up fused and every matmul packed in `fmt`, its LM head in `head_fmt`.

    The embedding and the norms are the model's own (fp32, shared, not copied), attention is torch's fused SDPA and
    the KV cache is in the model's dtype; only the packed matmuls compute in `activations` (bf16 by default; fp16 or
    fp32 on a CPU). The model given is not changed. group_size: int4's group (it must divide every row: 32 or 64).
    """
    if not isinstance(model, ScratchLlama):
        raise CourseError("pack() takes a ScratchLlama: build one with ScratchLlama.from_hf(loaded).")
    for name in (fmt, head_fmt):
        if name not in FORMATS:
            raise CourseError(f"Packed formats are {', '.join(FORMATS)}, not {name!r}.")
    ok, why = kernel_status(fmt, model.device)
    if not ok:
        raise CourseError(f"No packed {fmt} kernel here ({why}).")
    fast = fuse(model, attend=sdpa_attend)  # fp32 fused copies, replaced one by one below
    with torch.no_grad():
        for block in fast.layers:
            for owner, name in ((block.self_attn, "qkv_proj"), (block.self_attn, "o_proj"),
                                (block.mlp, "gate_up_proj"), (block.mlp, "down_proj")):
                setattr(owner, name, PackedProjection(getattr(owner, name).weight, fmt, group_size, activations))
        fast.lm_head = PackedProjection(model.lm_head.weight, head_fmt, group_size, activations)
    fast._inv_freq = None
    return fast.eval()


def matmul_weight_bytes(model: ScratchLlama) -> int:
    """Bytes of weights one decode step reads: every matmul of the blocks and the LM head, as this model holds them
    (fp32 or bf16 matrices, or packed codes with their scales); the embedding rows are looked up, not read whole."""
    total = 0
    for module in [*model.layers.modules(), model.lm_head]:
        if isinstance(module, PackedProjection):
            total += module.nbytes
        elif isinstance(module, (nn.Linear, Projection)):
            total += module.weight.numel() * module.weight.element_size()
    return total


def decode_bytes_per_token(model: ScratchLlama, context: int) -> int:
    """Bytes one decode step (batch 1) reads after `context` cached positions: the matmul weights, as held, and
    the KV cache, in the model's own dtype (2 x layers x kv_heads x head_dim x bytes per element per position)."""
    cfg = model.cfg
    kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * model.embed_tokens.weight.element_size()
    return matmul_weight_bytes(model) + kv * (context + 1)


FUSED_FP32 = "fp32 fused"  # the reference of C17's speed half: fp32 with pack()'s own fusion and SDPA attention
# A packed step must take at most this share of the fused fp32 step's time. Measured on the 2-core test machine,
# the fastest of 15 interleaved steps, busy (other agents on both cores, torch on 1 thread): int8 0.40-0.49x,
# int4 0.27-0.33x; false worlds: the fused fp32 model relabelled as packed 0.96-1.05x, a "packed" int8 that
# dequantizes to fp32 at every call 1.7-2.4x. Notebook 09's own runs (busy, and with one more core burned by
# tools/busy_check.py): int8 0.45-0.52x, int4 0.23-0.35x. (Idle, both sides get faster together.)
SPEED_MARGIN = 0.75


def fused_reference(model: ScratchLlama) -> ScratchLlama:
    """The fp32 model as pack() builds it but unpacked: q/k/v and gate/up fused, torch's SDPA attention. Timed
    against the packed models, only the weights' format differs (the fusion and SDPA alone make a step faster)."""
    return fuse(model, attend=sdpa_attend)


def one_step(model, context: torch.Tensor):
    """A function that runs one decode step of `model` after `context` [1, seq], the cache rewound at every call
    (the prefill runs once, here)."""
    cache = model.new_cache(1, context.shape[1] + 1)
    prefill(model, context, cache)

    def step():
        cache.length = context.shape[1]
        decode_step(model, context[:, -1:], cache)
    return step


def time_decode_steps(models: dict, context: torch.Tensor, device: torch.device | str = "cpu", *, warmup: int = 2,
                      repeats: int = 15) -> dict:
    """One decode step of each model after `context`, timed in turns (time_interleaved): {name: Timing}. A busy
    moment slows every model alike, and each Timing's min_s, its fastest step, can only be raised by other work."""
    with torch.inference_mode():
        return time_interleaved({name: one_step(m, context) for name, m in models.items()}, device, warmup=warmup,
                                repeats=repeats)


def packed_speed_evidence(seconds: dict[str, float], kernels: dict[str, str], bytes_per_token: dict[str, int],
                          reference: str = FUSED_FP32, margin: float = SPEED_MARGIN) -> tuple[bool, str]:
    """C17's speed half: (whether every packed variant whose kernel reads the codes took at most `margin` times the
    `reference` step's time, the evidence in words). seconds: per decode step of each variant (the reference's
    included); kernels: each packed variant's kernel name; bytes_per_token: what each step reads. The reference is
    the fp32 model fused as pack() fuses it, with the same SDPA attention (fused_reference), so that only the
    weights' format differs: fusion and SDPA alone made an fp32 step 1.13-1.17x faster than the plain one, which a
    bar of "faster than plain fp32" would have credited to packing. False, with a reason, when no packed kernel
    reads codes here (nothing to show)."""
    reading_codes = [fmt for fmt, kernel in kernels.items() if kernel in READS_CODES and fmt in seconds]
    if reference not in seconds or not reading_codes:
        return False, "no packed kernel that reads the codes ran here"
    base = seconds[reference]
    size, ref_rate = bytes_per_token, bytes_per_token[reference] / base / 1e9
    parts = [f"{fmt} ({kernels[fmt].removeprefix('torch.')}) reads {size[fmt] / size[reference]:.2f}x "
             f"the bytes of {reference} and took {seconds[fmt] / base:.2f}x its time per token "
             f"({size[fmt] / seconds[fmt] / 1e9:.1f} GB/s against {ref_rate:.1f})"
             for fmt in reading_codes]
    return (all(seconds[fmt] <= margin * base for fmt in reading_codes),
            "; ".join(parts) + f" (the bar: at most {margin:.2f}x, with the same fusion and SDPA attention)")


# A step that takes more than this many times its bytes over the device's bandwidth is not bound by reading its
# weights (on a GPU, a decode step of this small model is bound by kernel launches): fewer bytes cannot show there.
LAUNCH_BOUND_FACTOR = 2.0


def packed_speed_verdict(seconds: dict[str, float], kernels: dict[str, str], bytes_per_token: dict[str, int],
                         on_gpu: bool, bandwidth: float | None = None,
                         reference: str = FUSED_FP32) -> tuple[str, str, str]:
    """What notebook 09 shows of C17's speed half here: ("claim", holds, evidence) to assert packed_speed_evidence,
    or ("not_shown", why, what would show it). Not shown where no packed kernel runs, and on a GPU where the
    reference step is launch-bound: it took more than LAUNCH_BOUND_FACTOR times its bytes over `bandwidth` (bytes/s,
    measured; needed on a GPU), so reading fewer bytes cannot shorten it. Elsewhere (a CPU with a kernel, or a GPU
    step that reads its bytes near the bandwidth) the claim is asserted, with the same bar on both."""
    holds, evidence = packed_speed_evidence(seconds, kernels, bytes_per_token, reference)
    would = ("a device with a packed int8 or int4 kernel that reads the codes, on which the fp32 step reads its "
             "weights near the memory bandwidth (a CPU with PyTorch's packed kernels, or a larger model on a GPU)")
    if not kernels:  # nothing packed ran (a kernel that ran but reads no codes is asserted, and fails)
        return "not_shown", "no packed int8 or int4 kernel runs on this device and PyTorch build", would
    if on_gpu:
        if bandwidth is None or bandwidth <= 0:
            raise CourseError("On a GPU, give the measured bandwidth (bytes/s) to tell a launch-bound step.")
        floor = bytes_per_token[reference] / bandwidth
        if seconds[reference] > LAUNCH_BOUND_FACTOR * floor:
            return ("not_shown", f"the {reference} step took {seconds[reference] * 1e3:.3f} ms, "
                    f"{seconds[reference] / floor:.1f}x the {floor * 1e3:.3f} ms its {bytes_per_token[reference] / 1e6:.0f} "
                    f"MB take at {bandwidth / 1e9:.0f} GB/s (bar {LAUNCH_BOUND_FACTOR:.0f}x): it is bound by kernel "
                    "launches, not by its bytes, so fewer bytes cannot make it faster", would)
    return "claim", holds, evidence


def token_agreement(model, prompt: torch.Tensor, reference: torch.Tensor) -> dict:
    """The model's greedy tokens after `prompt` [1, seq] against `reference` [n] (the fp32 model's, on the CPU):
    equal for how many from the start, whether the first 32 are, and the share of positions that agree."""
    ours = generate_greedy(model, prompt, len(reference)).tokens[0].cpu()
    same = (ours == reference).long().cumprod(0)  # 1 while every token so far agreed
    return {"tokens_compared": len(reference), "equal_prefix": int(same.sum()), "first_32_equal": bool(same[:32].all()),
            "agreement": float((ours == reference).float().mean())}


def difference_sources(plain, chat, reference: torch.Tensor) -> dict:
    """Where the packed models' tokens part from fp32's: each re-rounding alone, the rest of the model fp32.

    The fp32 model holds the file's grids (Q4_1 blocks of 32 with a minimum, the head Q8_0 blocks of 32), so int4 g32
    holds the blocks' weights on their own grid while int8's one scale a row re-rounds them, body and head alike.
    For each variant: how many greedy tokens equal fp32's, and fp32's own margin (top logit minus the second) at the
    first token that differs: a small margin is a near tie, which any change of rounding may turn over.
    """
    variants = {"int8 body, fp32 head": (pack(plain, "int8"), plain.lm_head),
                "int4 g32 body, fp32 head": (pack(plain, "int4"), plain.lm_head),
                "fp32 body, int8 head": (fuse(plain, attend=sdpa_attend), PackedProjection(plain.lm_head.weight, "int8"))}
    rows = {}
    for name, (model, head) in variants.items():
        model.lm_head = head
        agreement = token_agreement(model, chat, reference)
        equal = agreement["equal_prefix"]
        row = {"equal_prefix": equal, "tokens_compared": agreement["tokens_compared"]}
        if equal < len(reference):  # fp32's logits where it chose reference[equal]
            ids = torch.cat([chat, reference[:equal][None].to(chat.device)], dim=1)
            with torch.inference_mode():
                top2 = plain.trace(ids, keep_hidden=False, logits_to_keep=1).logits[0, -1].float().topk(2).values
            row["fp32_margin_at_first_difference"] = float(top2[0] - top2[1])
        rows[name] = row
    return rows
