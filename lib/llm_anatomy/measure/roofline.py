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


def naive_score_bytes(bytes_per_element: int, masked: bool = True) -> int:
    """Bytes the plain attention (model/attention.py) moves for each score of its `[q_len, k_len]` matrix, pass by pass.

    q.k writes the score (e bytes: the model's number format), the 1/sqrt(d) scaling reads and writes it (2e), the
    causal mask reads and writes it (2e; `masked`: a prefill; a single decode query has no mask), the softmax runs in
    fp32 (a cast reads e and writes 4 when e < 4; the softmax reads and writes 4 + 4; a cast back reads 4 and writes
    e) and weights.v reads it (e). A prefill: 32 bytes per score in fp32 (eight passes of 4 bytes) and in 16 bits
    alike; a decode step: 24 in fp32, 28 in 16 bits. Logical passes: a kernel may read its input more than once. Units: bytes per score.
    """
    e = bytes_per_element
    casts = (e + 4) * 2 if e < 4 else 0  # to fp32 for the softmax and back
    return e + 2 * e + (2 * e if masked else 0) + casts + 8 + e


def forward_work(cfg, new_tokens: int, past: int = 0, batch: int = 1, bytes_per_element: int = 4, *,
                 logits_tokens: int | None = 1, materialized_scores: bool = False) -> Work:
    """FLOPs and bytes of one forward pass of `new_tokens` per sequence after `past` cached positions.

    FLOPs: 2 per block weight per token; 2 per LM-head weight per position whose logits are computed
    (`logits_tokens` per sequence: 1 in generation, which needs the last position only; None = every position);
    attention's two matmuls (q.k and weights.v) over the causal context.
    Bytes: every matmul weight read once (shared by all tokens of the pass), the KV cache read and the new
    K/V written. Other activations are left out: they are small beside the weights for short passes.
    `materialized_scores=True` counts what the plain attention (ScratchLlama's default path) does: it computes the
    whole `[new, past + new]` score matrix, masked entries too, so its q.k and w.v FLOPs are on that full square,
    and it moves naive_score_bytes per score. Without it, the count is that of a fused causal kernel (SDPA, flash):
    q.k and w.v over the positions each token may see (about half the square in a prefill), no scores in memory.
    """
    if new_tokens < 1 or past < 0 or batch < 1:
        raise CourseError(f"Use new_tokens >= 1, past >= 0 and batch >= 1, not {new_tokens}, {past}, {batch}.")
    tokens = batch * new_tokens
    head_positions = new_tokens if logits_tokens is None else min(logits_tokens, new_tokens)
    head_weights = cfg.vocab_size * cfg.hidden_size
    # positions each new token's q.k and w.v run over: the full square when the scores are materialized, else the
    # causal average
    context = past + new_tokens if materialized_scores else past + (new_tokens + 1) / 2
    attention_flops = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context * tokens
    flops = 2 * block_parameters(cfg) * tokens + 2 * head_weights * batch * head_positions + attention_flops
    kv_per_position = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * bytes_per_element
    moved = matmul_parameters(cfg) * bytes_per_element + kv_per_position * batch * (past + new_tokens)
    if materialized_scores:
        scores = cfg.num_layers * cfg.num_heads * (past + new_tokens) * tokens  # the full square, masked entries too
        moved += naive_score_bytes(bytes_per_element, masked=new_tokens > 1) * scores
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




def predict_decode_step_s(batch: int, context: int, weight_bytes: float, kv_bytes_per_token: float, params: float,
                          bandwidth: float, flops_per_s: float) -> float:
    """The scaling book's floor under a decode step, in seconds: the larger of reading the weights once plus every
    sequence's own cache, (weight_bytes + batch x context x kv_bytes_per_token) / bandwidth, and the arithmetic,
    2 x batch x params / flops_per_s. The two overlap on real hardware, so the step is at least the larger one."""
    memory = (weight_bytes + batch * context * kv_bytes_per_token) / bandwidth
    return max(memory, 2 * batch * params / flops_per_s)


def roof_share(peaks: Peaks, work: Work, seconds: float) -> float:
    """The attained FLOP/s of a run that did `work` in `seconds`, as a share of the roof at its intensity (0 to ~1)."""
    return roofline_point("", work, seconds).flops_per_s / roof(peaks, work.intensity)


def claim_compute_bound(peaks: Peaks, work: Work, seconds: float, share: float, what: str):
    """C6 on a measurement: the run attained at least `share` of the roof at its intensity (the roofline explains
    its speed); raises ClaimFailed when it did not. Which roof that is (compute right of the ridge, bandwidth left of
    it) is the hardware's to decide: the evidence names it, and the notebook prints it as a reading."""
    from ..claims import claim

    got = roof_share(peaks, work, seconds)
    side = "the compute roof" if work.intensity >= peaks.ridge_intensity else "the bandwidth slope (left of the ridge)"
    return claim("C6", got >= share,
                 f"{what} attained {work.flops / seconds / 1e9:,.1f} GFLOP/s = {got:.0%} of the roof at its "
                 f"{work.intensity:.1f} FLOP/byte ({side}; ridge {peaks.ridge_intensity:.1f}), at least {share:.0%}")


def claim_byte_floor(peaks: Peaks, bytes_per_step: float, seconds: float, what: str, floor: float = 0.9):
    """C11 on a measurement: a step that must read `bytes_per_step` took at least `floor` x bytes / bandwidth (the
    byte model is a floor under its time; 0.9 leaves room for the bandwidth's own noise). Raises ClaimFailed if a
    step came in faster: then the count of bytes or the bandwidth would be wrong. How close it came is a reading."""
    from ..claims import claim

    least = bytes_per_step / peaks.bytes_per_s
    return claim("C11", seconds >= floor * least,
                 f"{what} took {seconds * 1e3:.2f} ms for {bytes_per_step / 1e6:,.0f} MB: reading them at the measured "
                 f"{peaks.bytes_per_s / 1e9:.1f} GB/s takes at least {least * 1e3:.2f} ms, and the step took "
                 f"{seconds / least:.2f}x that (the floor allows no less than {floor:.1f}x)")
