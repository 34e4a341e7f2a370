"""FLOPs and bytes of a Llama-family forward pass, and the roofline that turns them into a speed limit.

A run that does F FLOPs and moves B bytes has arithmetic intensity F/B. It can go no faster than
min(compute peak, bandwidth x intensity): below the ridge point (peak / bandwidth) memory sets the speed,
above it compute does. Units: FLOP, bytes, FLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CourseError
from .peaks import Peaks

@dataclass(frozen=True)
class Work:
    """FLOPs done and bytes moved by one forward pass."""

    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte."""
        if self.bytes <= 0:
            raise CourseError("Arithmetic intensity needs a positive number of bytes.")
        return self.flops / self.bytes


def block_parameters(cfg) -> int:
    """Matmul weights of the blocks (every Q, K, V, O, gate, up and down projection), all layers.

    `cfg` is a ScratchConfig (llm_anatomy.model.scratch).
    """
    d, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return cfg.num_layers * (d * q + 2 * d * kv + q * d + 3 * d * cfg.intermediate_size)


def matmul_parameters(cfg) -> int:
    """Weights that take part in matmuls: the blocks' projections and the LM head (not the embedding lookup)."""
    return block_parameters(cfg) + cfg.vocab_size * cfg.hidden_size


def forward_work(cfg, new_tokens: int, past: int = 0, batch: int = 1, bytes_per_element: int = 4, *,
                 logits_tokens: int | None = 1, materialized_scores: bool = False) -> Work:
    """FLOPs and bytes of one forward pass of `new_tokens` per sequence after `past` cached positions.

    FLOPs: 2 per block weight per token; 2 per LM-head weight per position whose logits are computed
    (`logits_tokens` per sequence: 1 in generation, which needs the last position only; None = every position);
    attention's two matmuls (q.k and weights.v) over the causal context.
    Bytes: every matmul weight read once (shared by all tokens of the pass), the KV cache read and the new
    K/V written; with `materialized_scores`, also the attention scores written and read back (fp32, once
    for the softmax and once for weights.v), which a naive attention does and SDPA/flash kernels avoid.
    Other activations are left out: they are small beside the weights for short passes.
    """
    if new_tokens < 1 or past < 0 or batch < 1:
        raise CourseError(f"Use new_tokens >= 1, past >= 0 and batch >= 1, not {new_tokens}, {past}, {batch}.")
    tokens = batch * new_tokens
    head_positions = new_tokens if logits_tokens is None else min(logits_tokens, new_tokens)
    head_weights = cfg.vocab_size * cfg.hidden_size
    context = past + (new_tokens + 1) / 2  # average positions each new token attends to (causal)
    attention_flops = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context * tokens
    flops = 2 * block_parameters(cfg) * tokens + 2 * head_weights * batch * head_positions + attention_flops
    kv_per_position = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * bytes_per_element
    moved = matmul_parameters(cfg) * bytes_per_element + kv_per_position * batch * (past + new_tokens)
    if materialized_scores:
        # the whole [new, past + new] score matrix is written (masked entries too), read by the softmax, read by weights.v
        moved += 3 * 4 * cfg.num_layers * cfg.num_heads * (past + new_tokens) * tokens
    return Work(float(flops), float(moved))


def ridge_batch(cfg, past: int, bytes_per_element: int, ridge: float, largest: int = 1 << 20) -> int | None:
    """The smallest batch whose decode step (one new token per sequence after `past` cached positions) reaches
    `ridge` FLOP/byte by forward_work's count, or None if no batch up to `largest` does (the KV cache, read once
    per sequence, keeps long contexts below it)."""
    low, high = 1, largest
    if forward_work(cfg, 1, past, high, bytes_per_element).intensity < ridge:
        return None
    while low < high:  # intensity rises with the batch: bisect
        mid = (low + high) // 2
        if forward_work(cfg, 1, past, mid, bytes_per_element).intensity >= ridge:
            high = mid
        else:
            low = mid + 1
    return low


@dataclass(frozen=True)
class RooflinePoint:
    """One measured run on the roofline: its intensity (FLOP/byte) and attained FLOP/s."""

    label: str
    intensity: float
    flops_per_s: float


def roofline_point(label: str, work: Work, seconds: float) -> RooflinePoint:
    """Place a run that did `work` in `seconds` on the roofline."""
    if seconds <= 0:
        raise CourseError(f"seconds must be positive, not {seconds}.")
    return RooflinePoint(label, work.intensity, work.flops / seconds)


def roof(peaks: Peaks, intensity: float) -> float:
    """The most FLOP/s any run of this intensity can reach here: min(compute peak, bandwidth x intensity)."""
    return min(peaks.flops_per_s, peaks.bytes_per_s * intensity)


