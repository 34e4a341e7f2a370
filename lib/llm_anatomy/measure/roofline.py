"""FLOPs and bytes of a Llama-family forward pass, and the roofline that turns them into a speed limit.

A run that does F FLOPs and moves B bytes has arithmetic intensity F/B. It can go no faster than
min(compute peak, bandwidth x intensity): below the ridge point (peak / bandwidth) memory sets the speed,
above it compute does. Units: FLOP, bytes, FLOP/s.

Bytes are counted op by op (`pass_rows`): each matmul's weights, input and output, and each elementwise op's reads
and writes, as the course's model (model/scratch.py) runs them without fusion. `traced_bytes` counts the same thing
from the ops a step really calls, and the tests hold the two together. The claims C6 (prefill is parallel and
compute-bound) and C11 (decode is memory-bound) are checked here, on measurements, by the functions at the end.
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
                 logits_tokens: int | None = 1, materialized_scores: bool = False, activations: bool = False) -> Work:
    """FLOPs and bytes of one forward pass of `new_tokens` per sequence after `past` cached positions.

    FLOPs: 2 per block weight per token; 2 per LM-head weight per position whose logits are computed
    (`logits_tokens` per sequence: 1 in generation, which needs the last position only; None = every position);
    attention's two matmuls (q.k and weights.v) over the causal context.
    Bytes: every matmul weight read once (shared by all tokens of the pass), the KV cache read and the new
    K/V written. `activations=True` counts every op's reads and writes as well, op by op (`pass_rows`): each
    matmul's input and output, the norms, RoPE, the residual adds, SwiGLU, the cache writes. They are small beside the
    weights in a decode step, and most of the bytes of a long prefill (notebook 07 counts both); without them a long
    prefill looks far more compute-heavy than it is.
    `materialized_scores=True` counts what the plain attention (ScratchLlama's default path) does: it computes the
    whole `[new, past + new]` score matrix, masked entries too, so its q.k and w.v FLOPs are on that full square,
    and it moves naive_score_bytes per score. Without it, the count is that of a fused causal kernel (SDPA, flash):
    q.k and w.v over the positions each token may see (about half the square in a prefill), no scores in memory.
    """
    if new_tokens < 1 or past < 0 or batch < 1:
        raise CourseError(f"Use new_tokens >= 1, past >= 0 and batch >= 1, not {new_tokens}, {past}, {batch}.")
    if activations:
        rows = pass_rows(cfg, new_tokens, past, batch, bytes_per_element, logits_tokens=logits_tokens,
                         materialized_scores=materialized_scores)
        return Work(float(sum(r.flops for r in rows)), float(sum(r.bytes for r in rows)))
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


@dataclass(frozen=True)
class PassRow:
    """One kind of op of a forward pass, all layers together: the FLOPs of its matmuls, the bytes of weights it reads,
    and the bytes its ops read and write besides (their inputs and outputs: activations, and the KV cache)."""

    name: str
    flops: float
    weight_bytes: float
    activation_bytes: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.activation_bytes


def norm_bytes(rows: int, size: int, bytes_per_element: int) -> int:
    """Bytes an RMSNorm (model/scratch.py) reads and writes over `rows` vectors of `size` numbers, op by op.

    It runs in fp32: a 16-bit input is cast up and back (each cast reads one format and writes the other); then
    x.pow(2), its mean, + eps, rsqrt, x times the rsqrt, and the weight times that (each reads its inputs and writes
    its output). fp32: 28 bytes per number; 16 bits: 44 (plus a few per row and the weight itself).
    """
    e, n = bytes_per_element, rows * size
    casts = 2 * n * (e + 4) if e < 4 else 0
    return casts + 8 * n + (4 * n + 4 * rows) + 8 * rows + 8 * rows + (8 * n + 4 * rows) + (size * e + 2 * n * e)


def pass_rows(cfg, new_tokens: int, past: int = 0, batch: int = 1, bytes_per_element: int = 4, *,
              logits_tokens: int | None = 1, materialized_scores: bool = False) -> list[PassRow]:
    """The work of one forward pass, op by op as model/scratch.py runs it (no fusion): FLOPs and bytes of each kind of
    op, all layers together. `forward_work(..., activations=True)` is their sum.

    Each matmul reads its weights and its input and writes its output; each elementwise op reads its inputs and
    writes its output (RoPE: 10 passes over q and k; SiLU and the gate product: 5 over the MLP's width; each residual
    add: 3; norms: `norm_bytes`). The cache: the new K and V copied in (read and written), and attention reading every
    cached position. `materialized_scores`: the plain attention's score matrix (naive_score_bytes per score), its
    boolean causal mask and the copy of its output into the token-major layout; SDPA keeps none of them.
    The small tables made once per pass (RoPE's cos and sin, positions) are left out: under 1% at these sizes.
    """
    if new_tokens < 1 or past < 0 or batch < 1:
        raise CourseError(f"Use new_tokens >= 1, past >= 0 and batch >= 1, not {new_tokens}, {past}, {batch}.")
    e, L, T = bytes_per_element, cfg.num_layers, batch * new_tokens
    d, q, kv, f = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    heads_rows = batch * (new_tokens if logits_tokens is None else min(logits_tokens, new_tokens))
    ctx = past + new_tokens

    def matmul(name, inp, out, rows=T, layers=L):
        return PassRow(f"{name}" + (f" x {layers} layers" if layers > 1 else ""), 2.0 * rows * inp * out * layers,
                       float(inp * out * e * layers), float((rows * inp + rows * out) * e * layers))

    context = ctx if materialized_scores else past + (new_tokens + 1) / 2  # positions each q.k and w.v runs over
    attention_flops = 4 * L * cfg.num_heads * cfg.head_dim * context * T
    attention_io = 2 * T * q * e  # reads q, writes its output
    if new_tokens > 1:
        attention_io += 2 * T * q * e  # the output, head-major, copied token-major for o_proj (both paths)
    rows = [
        PassRow("embedding lookup (rows read and written)", 0.0, 0.0, float(2 * T * d * e)),
        PassRow(f"RMSNorms x {2 * L + 1}", 0.0, 0.0,
                float(2 * L * norm_bytes(T, d, e) + norm_bytes(heads_rows, d, e))),
        matmul("q_proj", d, q), matmul("k_proj", d, kv), matmul("v_proj", d, kv),
        PassRow(f"RoPE on q and k x {L} layers", 0.0, 0.0,
                float(L * (10 * T * (q + kv) + 4 * new_tokens * cfg.head_dim) * e)),
        PassRow(f"KV cache: new K and V written x {L} layers", 0.0, 0.0, float(L * 4 * T * kv * e)),
        PassRow(f"KV cache: read by attention x {L} layers", 0.0, 0.0, float(L * 2 * batch * ctx * kv * e)),
        PassRow(f"attention q.k and w.v ({'full square' if materialized_scores else 'causal'}) x {L} layers",
                float(attention_flops), 0.0, float(L * attention_io)),
    ]
    if materialized_scores:
        square = L * cfg.num_heads * ctx * T
        per_score = naive_score_bytes(e, masked=new_tokens > 1)
        rows.append(PassRow(f"attention scores ({per_score} B each) x {L} layers", 0.0, 0.0, float(per_score * square)))
        if new_tokens > 1:  # the boolean mask [new, ctx]: made (1 byte), negated (read, write), read by masked_fill
            rows.append(PassRow(f"causal mask (bool) x {L} layers", 0.0, 0.0, float(L * 4 * new_tokens * ctx)))
    rows += [
        matmul("o_proj", q, d),
        PassRow(f"residual adds x {2 * L}", 0.0, 0.0, float(2 * L * 3 * T * d * e)),
        matmul("gate_proj", d, f), matmul("up_proj", d, f),
        PassRow(f"SiLU and the gate product x {L} layers", 0.0, 0.0, float(L * 5 * T * f * e)),
        matmul("down_proj", f, d),
        matmul(f"lm_head ({heads_rows} position{'s' if heads_rows > 1 else ''})", d, cfg.vocab_size, rows=heads_rows,
               layers=1),
    ]
    return rows


def matmul_ceiling(inp: int, out: int, bytes_per_element: int) -> float:
    """The intensity a matmul of an `[n, inp]` activation by an `[inp, out]` weight tends to as n grows, counting its
    input, weights and output: 2 n inp out / ((n inp + inp out + n out) e) -> 2 inp out / ((inp + out) e), FLOP/byte.

    Past it no prompt length helps: a narrow model's matmuls (SmolLM2: 576 -> 1536) saturate near 2df/((d+f)e)."""
    return 2 * inp * out / ((inp + out) * bytes_per_element)


def traced_bytes(fn) -> int:
    """Bytes that the ops of one call of `fn()` read and write, counted as they run (a TorchDispatchMode): each op's
    tensor inputs and outputs, once each; views move nothing; an in-place op's output is its input; an embedding
    lookup reads the rows it returns, not the whole table. Works on "meta" tensors too (shapes only, nothing runs),
    so a large pass can be counted for free. The check on `pass_rows`: both count the same ops."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    import torch

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            aliased = [r.alias_info is not None for r in func._schema.returns]
            if any(aliased) and not func._schema.is_mutable:
                with self:  # reshape, to, contiguous: a view or a copy, as their parts (view, clone, _to_copy) say
                    decomposed = func.decompose(*args, **kwargs)
                if decomposed is not NotImplemented:
                    return decomposed
                return func(*args, **kwargs)  # a view: nothing moves
            out = func(*args, **kwargs)
            if func in (torch.ops.aten.embedding.default, torch.ops.aten._unsafe_view.default):
                if func is torch.ops.aten.embedding.default:
                    self.total += 2 * out.numel() * out.element_size()  # the rows read, the output written
                return out
            outs = [] if all(aliased) else [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)] + outs
            self.total += sum(t.numel() * t.element_size() for t in tensors)
            return out

    counter = Count()
    with counter:
        fn()
    return counter.total

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


# The margins of the claims below, set from measured runs of notebook 07 on a 2-core CPU (fp32, SmolLM2-135M), idle
# and with other programs on both cores, in the true world and in its counterfactual:
# - C6, parallel: the fastest prefill of 160 tokens took 1/20 of 160 decode steps busy (1.24 s against 160 x 154 ms);
#   a prefill run token by token takes n steps (1x); the bar is n/4 steps.
# - C6, compute-bound: the 160-token prefill (26 FLOP/byte counted op by op) reached 65-89% of the matmul peak
#   measured in the same busy runs (ridges 2.6-4.5 FLOP/byte); a decode step (0.5 FLOP/byte) reached 4-6%, and so does
#   a prefill run token by token (its FLOPs in n steps' time). The bar, 20%, sits 3x above the second and 3x below the
#   first. A 16-token prefill (5.6 FLOP/byte) sits at the knee: 1.2-2.2x the busy ridges, at 21-38% of the peak; to be
#   called compute-bound a run must lie RIDGE_MARGIN (3) times right of the ridge, where its FLOPs at the peak take at
#   least three times its bytes at the bandwidth (the 160-token prefill: 6-10x), and reach COMPUTE_SHARE (35%) of the
#   peak: at a busy ridge of 2.6 the 16-token prefill is 2.2x right of it and at 21-38%, so a margin of 2 and a share
#   of 20% let it pass (a reviewer's find); 3x stops it whatever its share, and 35% stops it too below its best. An
#   idle clean-clone run put the 160-token prefill at 7.5x the ridge (3.5) and 54% of the peak (the two threads'
#   matmul peak is higher than a prefill's share of it): 35% leaves it 1.5x, 40% only 1.35x. Where this machine's
#   ridge puts even the longest prompt under 3x (a CPU or GPU with a high ridge), notebook 07 says "not shown on this
#   machine" for this half instead of asserting it.
# - C11, memory-bound: a decode step of the default model (546 MB in fp32) took 1.16-1.17x the time one
#   matrix-vector product takes to read the same bytes, timed in turns with it (peaks.matvec_over), idle and with a
#   core burned; the tiny model's step (0.41 MB, overhead-bound: its ops' dispatch is all its time) took 47-52x. The
#   bar, 3x (MATVEC_SLACK), sits 2.6x above the one and 16x below the other. An earlier bar compared the step with the
#   streaming sum's bandwidth (at least 20% of it): this machine's step read at 24-36% of a sum that streams 29-43
#   GB/s, while PyTorch's fp32 matrix-vector kernel reads at 12-16 GB/s; a CI machine whose sum streamed 63 GB/s saw
#   the same step at 17% and failed, though its step (52 ms) was as memory-bound as ours. How fast the kernel reads
#   against the streaming sum is the kernel's efficiency, a reading (notebook 09 and `bench fast` chase it), not the
#   regime. Both figures must be of the same moment (peaks.measured_in_turns).
PARALLEL_STEPS = 4  # C6: a prefill of n tokens must take less than n / PARALLEL_STEPS decode steps
COMPUTE_SHARE = 0.35  # C6: the share of the measured matmul peak a compute-bound prefill reaches
RIDGE_MARGIN = 3.0  # C6: how many times the ridge a compute-bound run's intensity must be (not at the knee)
MATVEC_SLACK = 3.0  # C11: how many times a matrix-vector product over the same bytes a memory-bound step may take
BYTES_AGREE = 0.05  # C11: how far the counted bytes may be from the bytes traced op by op as the step ran


def claim_prefill_parallel(tokens: int, ttft_s: float, tpot_s: float, what: str, steps: float = PARALLEL_STEPS):
    """C6, the parallel half: a prefill of `tokens` took less than tokens / `steps` decode steps (its fastest run
    against the median step). A prefill that ran the prompt token by token takes about `tokens` steps, and a single
    token (a decode step) one: both raise ClaimFailed."""
    from ..claims import claim

    if tokens < 1 or ttft_s <= 0 or tpot_s <= 0:
        raise CourseError(f"Give tokens >= 1 and positive times, not {tokens}, {ttft_s} and {tpot_s}.")
    bar = tokens / steps * tpot_s
    return claim("C6", ttft_s < bar,
                 f"{what}: {tokens} tokens in {ttft_s * 1e3:,.1f} ms, {ttft_s / tpot_s:.1f} decode steps of "
                 f"{tpot_s * 1e3:.1f} ms ({tokens / (ttft_s / tpot_s):.0f} tokens per step's time); "
                 f"one token at a time "
                 f"would take {tokens} steps, and the bar is {tokens / steps:g}")


def claim_compute_bound(peaks: Peaks, work: Work, seconds: float, share: float = COMPUTE_SHARE, what: str = "the run",
                        margin: float = RIDGE_MARGIN):
    """C6, the compute-bound half, on a measurement: the run's intensity (FLOP per byte, bytes counted op by op) is at
    least `margin` times the measured ridge (its FLOPs at the peak take at least that many times its bytes at the
    bandwidth: right of the ridge, not at the knee), and it attained at least `share` of the measured compute peak
    (not of the roof at its own intensity: left of the ridge that roof is the bandwidth slope, and a memory-bound run
    reaches it too). Raises ClaimFailed when either fails: a decode step, a short prefill at or left of the ridge, a
    prefill run token by token (its FLOPs in n steps' time)."""
    from ..claims import claim

    attained = work.flops / seconds
    times = work.intensity / peaks.ridge_intensity
    side = "left of" if times < 1 else f"{times:.1f}x"
    return claim("C6", times >= margin and attained >= share * peaks.flops_per_s,
                 f"{what} does {work.intensity:,.1f} FLOP per byte, {side} the measured ridge "
                 f"({peaks.ridge_intensity:.1f}; at least {margin:g}x), and attained {attained / 1e9:,.1f} GFLOP/s = "
                 f"{attained / peaks.flops_per_s:.0%} of the measured {peaks.dtype} matmul peak (at least {share:.0%})")


def roof_share(peaks: Peaks, work: Work, seconds: float) -> float:
    """The attained FLOP/s of a run that did `work` in `seconds`, as a share of the roof at its intensity (0 to ~1)."""
    return roofline_point("", work, seconds).flops_per_s / roof(peaks, work.intensity)


def claim_memory_bound(peaks: Peaks, work: Work, traced: float, seconds: float, what: str, *, matvec_s: float,
                       matvec_bytes: float | None = None, slack: float = MATVEC_SLACK, floor: float = 0.9,
                       agree: float = BYTES_AGREE):
    """C11 on a measured step: its bytes set its time. Four checks, each of which raises ClaimFailed:
    - the counted bytes (`work.bytes`) agree, within `agree`, with the bytes its ops read and wrote as it ran
      (`traced`, from traced_bytes): a count that forgets the LM head, or halves the bytes, fails here;
    - its intensity is left of the measured ridge: FLOPs cannot be what sets its speed;
    - it took at least `floor` x bytes / bandwidth: no step beats its bytes (0.9: the bandwidth's own noise);
    - it took at most `slack` x the time one matrix-vector product took to read the same bytes (`matvec_s` for
      `matvec_bytes`, default work.bytes; peaks.matvec_over, timed in turns with the step): reading its bytes, with
      this framework's own kernel, is its time. An overhead-bound step (a tiny model's, whose ops' dispatch is all
      its time) takes tens of times its bytes' reading, and fails.
    How close the step and the kernel came to the streaming bandwidth is a reading of the machine and the kernel."""
    from ..claims import claim

    if seconds <= 0 or matvec_s <= 0:
        raise CourseError(f"seconds and matvec_s must be positive, not {seconds} and {matvec_s}.")
    reading_s = matvec_s * work.bytes / (matvec_bytes or work.bytes)  # one matrix-vector product over the step's bytes
    rate = work.bytes / seconds
    least = work.bytes / peaks.bytes_per_s
    off = work.bytes / traced - 1
    checks = {"counted = traced": abs(off) <= agree, "left of the ridge": work.intensity < peaks.ridge_intensity,
              "no faster than its bytes": seconds >= floor * least,
              "its bytes' reading": seconds <= slack * reading_s}
    failed = [name for name, ok in checks.items() if not ok]
    verdict = "" if failed else " is bound by its bytes, at the rate the matrix-vector kernel reads them: it"
    return claim("C11", not failed,
                 f"{what}{verdict} moves {work.bytes / 1e6:,.1f} MB counted, {traced / 1e6:,.1f} MB traced op by op "
                 f"({off:+.1%}; within {agree:.0%}); {work.intensity:.2f} FLOP/byte against a ridge of "
                 f"{peaks.ridge_intensity:.1f}; it took {seconds * 1e3:.2f} ms = {seconds / least:.2f}x its bytes at "
                 f"the measured {peaks.bytes_per_s / 1e9:.1f} GB/s (at least {floor:.1f}x) and "
                 f"{seconds / reading_s:.2f}x the {reading_s * 1e3:.2f} ms one matrix-vector product took to read "
                 f"them (at most {slack:g}x); it read at {rate / 1e9:.1f} GB/s, the product at "
                 f"{work.bytes / reading_s / 1e9:.1f} GB/s, {rate / peaks.bytes_per_s:.0%} and "
                 f"{work.bytes / reading_s / peaks.bytes_per_s:.0%} of the streaming sum"
                 + (f"; failed: {', '.join(failed)}" if failed else ""))


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
