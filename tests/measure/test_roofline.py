"""FLOP and byte accounting of a forward pass, the roofline's maths, and the ridge batch (known numbers)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from llm_anatomy.claims import ClaimFailed
from llm_anatomy.errors import CourseError
from llm_anatomy.measure.peaks import Peaks
from llm_anatomy.measure.roofline import (Work, forward_work, matmul_parameters, naive_score_bytes, roof,
                                          roofline_point)
from llm_anatomy.model.attention import attention
from llm_anatomy.model.scratch import ScratchConfig


def test_roofline_point_maths_on_known_numbers():
    work = Work(flops=2e9, bytes=1e9)
    assert work.intensity == 2.0
    point = roofline_point("decode b=1", work, seconds=0.5)
    assert point.intensity == 2.0 and point.flops_per_s == 4e9
    peaks = Peaks("test", "float32", flops_per_s=100e9, bytes_per_s=10e9, how="")
    assert peaks.ridge_intensity == 10.0
    assert roof(peaks, 2.0) == 20e9  # below the ridge: bandwidth x intensity
    assert roof(peaks, 50.0) == 100e9  # above it: the compute peak
    with pytest.raises(CourseError):
        roofline_point("x", work, 0)
    with pytest.raises(CourseError):
        Work(1.0, 0.0).intensity


def test_forward_work_counts_weights_and_kv(tiny_model):
    cfg = ScratchConfig.from_hf(tiny_model.config)
    norms = sum(p.numel() for n, p in tiny_model.named_parameters() if "norm" in n)
    # tied embeddings: the LM head's matmul reads the embedding table; every other weight is a projection
    assert matmul_parameters(cfg) == sum(p.numel() for p in tiny_model.parameters()) - norms
    w = matmul_parameters(cfg)
    decode = forward_work(cfg, new_tokens=1, past=9, batch=1, bytes_per_element=4)
    kv_per_position = 2 * 2 * 2 * 16 * 4  # K and V x layers x kv_heads x head_dim x fp32
    assert decode.bytes == w * 4 + kv_per_position * 10
    assert decode.flops == 2 * w + 4 * 2 * 4 * 16 * 10  # attention over 10 positions, 4 heads of 16
    prefill = forward_work(cfg, new_tokens=100, past=0, batch=1, bytes_per_element=4)
    assert prefill.intensity > 30 * decode.intensity  # the weights are read once for all 100 tokens
    batched = forward_work(cfg, new_tokens=1, past=9, batch=8, bytes_per_element=4)
    assert batched.intensity > 5 * decode.intensity


def test_the_lm_head_is_counted_only_where_it_runs(tiny_model):
    cfg = ScratchConfig.from_hf(tiny_model.config)
    head = cfg.vocab_size * cfg.hidden_size
    last_only = forward_work(cfg, new_tokens=100, logits_tokens=1)  # generation: logits of the last position
    every = forward_work(cfg, new_tokens=100, logits_tokens=None)  # training or scoring: every position
    assert every.flops - last_only.flops == 2 * head * 99
    assert every.bytes == last_only.bytes  # the head's weights are read once either way
    batch = forward_work(cfg, new_tokens=10, batch=3)
    assert batch.flops - forward_work(cfg, new_tokens=10, batch=3, logits_tokens=None).flops == -2 * head * 3 * 9


def test_materialized_scores_add_their_traffic(tiny_model):
    cfg = ScratchConfig.from_hf(tiny_model.config)
    plain = forward_work(cfg, new_tokens=64, past=0)
    naive = forward_work(cfg, new_tokens=64, past=0, materialized_scores=True)
    scores = cfg.num_layers * cfg.num_heads * 64 * 64  # one [64, 64] score matrix per head and layer
    assert naive.bytes - plain.bytes == 32 * scores  # eight fp32 passes over every score
    attention_flops = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 64
    assert naive.flops - plain.flops == attention_flops * (64 - 65 / 2)  # the full square against the causal half
    with pytest.raises(CourseError, match="new_tokens"):
        forward_work(cfg, new_tokens=0)




def test_ridge_batch_is_where_decode_crosses_the_ridge():
    from transformers import LlamaConfig

    from llm_anatomy.measure.roofline import ridge_batch
    from llm_anatomy.weights.random import RANDOM_SHAPES

    smol = ScratchConfig.from_hf(LlamaConfig(**RANDOM_SHAPES["135m"]))  # SmolLM2-135M's shape
    for ridge, size in ((6.0, 4), (150.0, 2), (25.0, 2)):
        b = ridge_batch(smol, 16, size, ridge)
        assert forward_work(smol, 1, 16, b, size).intensity >= ridge  # reached at b ...
        assert forward_work(smol, 1, 16, b - 1, size).intensity < ridge  # ... and not one sooner
    assert ridge_batch(smol, 100_000, 2, 500.0) is None  # a long context: the cache keeps every batch below it
    assert ridge_batch(smol, 16, 2, 500.0) > ridge_batch(smol, 16, 2, 50.0)  # a higher ridge needs a bigger batch


class _ScoreTraffic(TorchDispatchMode):
    """Bytes read and written by every op that touches a tensor of `scores` elements (views move nothing)."""

    def __init__(self, scores: int):
        super().__init__()
        self.scores, self.bytes = scores, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        is_view = func is torch.ops.aten._unsafe_view.default or any(r.alias_info for r in func._schema.returns)
        if not is_view:
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors if t.numel() == self.scores)
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_len", [40, 1])
def test_naive_score_bytes_are_what_the_plain_attention_moves(dtype, q_len):
    """Count the bytes of every op of model/attention.py's attention that reads or writes the score matrix."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, q_len, 64, generator=g).to(dtype)  # [batch, heads, q_len, head_dim]
    k, v = (torch.randn(1, 3, 40, 64, generator=g).to(dtype) for _ in range(2))  # [batch, kv_heads, 40, head_dim]
    counter = _ScoreTraffic(9 * q_len * 40)
    with torch.no_grad(), counter:
        attention(q, k, v)
    per_score = counter.bytes / (9 * q_len * 40)
    assert per_score == naive_score_bytes(dtype.itemsize, masked=q_len > 1)
    assert per_score == (32 if q_len > 1 else {torch.float32: 24, torch.bfloat16: 28}[dtype])  # no mask at decode


PEAKS = Peaks("test", "float32", flops_per_s=100e9, bytes_per_s=10e9, how="")  # ridge 10 FLOP/byte


# ----------------------------------------------------------------- bytes counted op by op, against the ops traced


def _smol():
    from transformers import LlamaConfig

    from llm_anatomy.weights.random import RANDOM_SHAPES

    return ScratchConfig.from_hf(LlamaConfig(**RANDOM_SHAPES["135m"]))  # SmolLM2-135M's shape


def _traced_pass(cfg, new, past, batch, dtype, path, device="meta"):
    """Bytes that ScratchLlama's ops move in one pass of `new` tokens after `past`, traced as they run (on meta
    tensors: shapes only, so a 135M-shaped pass costs nothing)."""
    from llm_anatomy.measure.roofline import traced_bytes
    from llm_anatomy.model.scratch import ScratchLlama

    with torch.device(device):
        model = ScratchLlama(cfg, attention=path).to(dtype)
        cache = model.new_cache(batch, past + new + 1)
    cache.length = past
    ids = torch.zeros(batch, new, dtype=torch.long, device=device)
    with torch.inference_mode():
        return traced_bytes(lambda: model.trace(ids, cache, keep_hidden=False, logits_to_keep=1, check_range=False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["sdpa", "naive"])
@pytest.mark.parametrize("new, past, batch", [(64, 0, 1), (1, 64, 1), (1, 64, 4), (16, 0, 2)])
def test_pass_rows_count_the_bytes_the_ops_move(new, past, batch, path, dtype):
    """pass_rows, summed by forward_work(activations=True), against every op of the model traced as it runs."""
    cfg = _smol()
    counted = forward_work(cfg, new, past, batch, dtype.itemsize, materialized_scores=path == "naive", activations=True)
    traced = _traced_pass(cfg, new, past, batch, dtype, path)
    assert counted.bytes == pytest.approx(traced, rel=0.015)  # measured: within 0.6% (the RoPE tables are left out)


def test_pass_rows_on_a_real_tiny_model_on_the_cpu(tiny_model):
    cfg = ScratchConfig.from_hf(tiny_model.config)
    for new, past, path in ((40, 0, "naive"), (1, 30, "sdpa")):
        counted = forward_work(cfg, new, past, 1, 4, materialized_scores=path == "naive", activations=True).bytes
        assert counted == pytest.approx(_traced_pass(cfg, new, past, 1, torch.float32, path, "cpu"), rel=0.04)


def test_a_long_prefill_moves_mostly_activations():
    """Issue 44: a 4,096-token fp32 prefill (SDPA) moves about 20 GB counted op by op, not the 0.73 GB of its weights
    and cache: 70 FLOP per byte, not 1,995. The weights-and-cache count stays the default (exercise 7.1 checks it)."""
    from llm_anatomy.measure.roofline import matmul_ceiling, pass_rows

    cfg = _smol()
    old, new = forward_work(cfg, 4096, 0, 1, 4), forward_work(cfg, 4096, 0, 1, 4, activations=True)
    assert old.bytes == pytest.approx(0.727e9, rel=0.01) and old.intensity == pytest.approx(1995, rel=0.01)
    assert new.bytes == pytest.approx(20.6e9, rel=0.01) and new.intensity == pytest.approx(70.4, rel=0.01)
    assert new.flops == old.flops  # the same arithmetic
    rows = pass_rows(cfg, 4096, 0, 1, 4)
    assert sum(r.weight_bytes for r in rows) == 4 * matmul_parameters(cfg)  # the norms' weights sit in their rows
    assert new.bytes == pytest.approx(_traced_pass(cfg, 4096, 0, 1, torch.float32, "sdpa"), rel=0.005)
    assert matmul_ceiling(576, 1536, 4) == pytest.approx(2 * 576 * 1536 / (2112 * 4))  # 209 FLOP/byte in fp32
    # on an H100 (data-sheet ridge 295 FLOP/byte, bf16) the 135M model's 4,096-token prefill sits left of the ridge
    assert forward_work(cfg, 4096, 0, 1, 2, activations=True).intensity < 989e12 / 3.35e12


def test_traced_bytes_counts_copies_not_views():
    from llm_anatomy.measure.roofline import traced_bytes

    x = torch.zeros(8, 16)  # 512 bytes
    assert traced_bytes(lambda: x.view(16, 8).transpose(0, 1)) == 0  # views move nothing
    assert traced_bytes(lambda: x + 1) == 2 * 512  # read x, write the sum (the scalar is no tensor)
    assert traced_bytes(lambda: x.t().reshape(-1)) == 2 * 512  # a reshape that must copy reads and writes
    assert traced_bytes(lambda: x.mul_(2)) == 512  # in place: its output is its input
    table = torch.zeros(1000, 16)
    assert traced_bytes(lambda: torch.nn.functional.embedding(torch.tensor([1, 2]), table)) == 2 * 2 * 16 * 4


# ----------------------------------------------------------------- C6: prefill is parallel and compute-bound
# Measured on the 2-core test machine, busy (two other programs per core), notebook 07's CPU sizes, fp32:
# peaks 27-40 GFLOP/s and 10-12.5 GB/s (ridge 2.6-3.2); the 160-token prefill 1.24 s (plain) and 1.47 s (SDPA);
# a decode step 154 ms (plain, after 160 tokens).
BUSY = Peaks("busy CPU", "fp32", flops_per_s=27e9, bytes_per_s=10e9, how="")
H100 = Peaks("H100 SXM (data sheet)", "bf16", flops_per_s=989e12, bytes_per_s=3.35e12, how="")


def test_c6_a_long_prefill_is_parallel_and_compute_bound():
    from llm_anatomy.measure.roofline import claim_compute_bound, claim_prefill_parallel

    cfg = _smol()
    assert "C6 holds" in repr(claim_prefill_parallel(160, 1.243, 0.154, "prefill"))  # 8 steps' time for 160 tokens
    assert "C6 holds" in repr(claim_compute_bound(BUSY, forward_work(cfg, 160, 0, 1, 4, activations=True), 1.473,
                                                  what="prefill"))  # 26 FLOP/byte, 24 GFLOP/s = 88%
    fake = Work(flops=50e9, bytes=1e9)  # 50 FLOP/byte, right of PEAKS' ridge of 10
    assert "C6 holds" in repr(claim_compute_bound(PEAKS, fake, 1.0, 0.3, "prefill"))  # 50% of the peak


@pytest.mark.counterfactual("C6", "a prefill that runs the prompt token by token (n decode steps)")
def test_c6_fails_for_a_prefill_run_token_by_token():
    from llm_anatomy.measure.roofline import claim_compute_bound, claim_prefill_parallel

    with pytest.raises(ClaimFailed, match="C6 FAILED"):
        claim_prefill_parallel(160, 160 * 0.154 * 0.9, 0.154, "sequential prefill")  # even 10% quicker per token
    work = forward_work(_smol(), 160, 0, 1, 4, activations=True)  # the same count: only the time differs
    with pytest.raises(ClaimFailed, match=r"C6 FAILED.*x the measured ridge.*= 5% of"):
        claim_compute_bound(BUSY, work, 160 * 0.154, what="sequential prefill")


@pytest.mark.counterfactual("C6", "the decode step fed to the prefill checks")
def test_c6_fails_for_the_decode_step():
    from llm_anatomy.measure.roofline import claim_compute_bound, claim_prefill_parallel

    with pytest.raises(ClaimFailed, match="C6 FAILED"):
        claim_prefill_parallel(1, 0.154, 0.154, "a decode step")
    step = forward_work(_smol(), 1, 160, 1, 4, materialized_scores=True, activations=True)  # 0.5 FLOP/byte
    with pytest.raises(ClaimFailed, match="C6 FAILED.*left of the measured ridge"):
        claim_compute_bound(BUSY, step, 0.154, what="a decode step")
    with pytest.raises(ClaimFailed, match="C6 FAILED.*left of the measured ridge"):  # even at an impossible speed
        claim_compute_bound(BUSY, step, 1e-6, what="a decode step")


@pytest.mark.counterfactual("C6", "a short prefill left of the ridge (16 tokens; on a GPU, the 135M model's prefill)")
def test_c6_fails_for_a_prefill_left_of_the_ridge():
    from llm_anatomy.measure.roofline import claim_compute_bound

    cfg = _smol()
    short = forward_work(cfg, 16, 0, 1, 4, activations=True)  # 5.6 FLOP/byte in fp32
    # measured in one busy nbval run of 07: 44 GFLOP/s and 9.9 GB/s (ridge 4.5); the 16-token SDPA prefill at 9.4
    # GFLOP/s (21% of the peak) and the 160-token one at 28.7 (65%, 26.4 FLOP/byte): the short one is at the knee
    knee = Peaks("busy CPU", "fp32", flops_per_s=44e9, bytes_per_s=9.86e9, how="")
    long = forward_work(cfg, 160, 0, 1, 4, activations=True)
    assert "C6 holds" in repr(claim_compute_bound(knee, long, long.flops / 28.7e9, what="a 160-token prefill"))
    with pytest.raises(ClaimFailed, match=r"C6 FAILED.*1\.3x the measured ridge"):
        claim_compute_bound(knee, short, short.flops / 9.4e9, what="a 16-token prefill")
    with pytest.raises(ClaimFailed, match=r"C6 FAILED.*1\.3x the measured ridge"):  # even at the whole peak
        claim_compute_bound(knee, short, short.flops / 44e9, what="a 16-token prefill")
    low = Peaks("very busy CPU", "fp32", flops_per_s=26e9, bytes_per_s=10e9, how="")  # ridge 2.6: the lowest seen
    with pytest.raises(ClaimFailed, match=r"C6 FAILED.*2\.2x the measured ridge"):  # at 38% of the peak, its best
        claim_compute_bound(low, short, short.flops / (0.38 * 26e9), what="a 16-token prefill")
    ridge_8 = Peaks("CPU, ridge 8", "fp32", flops_per_s=160e9, bytes_per_s=20e9, how="")
    with pytest.raises(ClaimFailed, match="C6 FAILED.*left of the measured ridge"):
        claim_compute_bound(ridge_8, short, short.flops / (0.5 * 160e9), what="a 16-token prefill")  # at 50% of peak
    gpu = forward_work(cfg, 4096, 0, 1, 2, activations=True)  # 108 FLOP/byte in bf16, against a ridge of 295
    with pytest.raises(ClaimFailed, match="C6 FAILED.*left of the measured ridge"):
        claim_compute_bound(H100, gpu, gpu.bytes / 3.0e12, what="a 4,096-token prefill on an H100")


# ----------------------------------------------------------------- C11: decode is memory-bound
# Measured busy on the 2-core machine: the default model's decode step (batch 1, 64 cached tokens, plain attention,
# fp32) took 112-127 ms at best against 11.9-12.5 GB/s, reading its 546 MB at 36-39% of the streaming bandwidth;
# the tiny model's step took 0.66-0.97 ms for its 0.41 MB: 3-5% (9% in a busy nbval run: 0.6 ms against 7.5 GB/s).
BUSY_BW = Peaks("busy CPU", "fp32", flops_per_s=37e9, bytes_per_s=11.9e9, how="")


def _decode_step(cfg):
    work = forward_work(cfg, 1, 64, 1, 4, materialized_scores=True, activations=True)
    return work, _traced_pass(cfg, 1, 64, 1, torch.float32, "naive")


# The default model's step took 1.16-1.17x one matrix-vector product over its 546 MB (46 ms), idle and with a core
# burned (roofline.py's note on MATVEC_SLACK); 54 ms is what it took here.
MATVEC_S = 0.046


def test_c11_the_default_decode_step_is_memory_bound():
    from llm_anatomy.measure.roofline import claim_memory_bound

    work, traced = _decode_step(_smol())
    for seconds in (0.054, 0.127):  # as measured, and 2.8x slower than the product (a slower step, same kernel)
        assert "C11 holds" in repr(claim_memory_bound(BUSY_BW, work, traced, seconds, "a decode step", matvec_s=MATVEC_S))
    fast_sum = Peaks("a CPU whose sum streams 63 GB/s", "fp32", flops_per_s=183e9, bytes_per_s=63.1e9, how="")
    verdict = claim_memory_bound(fast_sum, work, traced, 0.05239, "a decode step", matvec_s=0.045)  # CI's figures
    assert "C11 holds" in repr(verdict) and "17% and" in repr(verdict)  # the sum's share is a reading, not a bar


def test_c11_scales_the_products_time_to_the_steps_bytes():
    from llm_anatomy.measure.roofline import claim_memory_bound

    work, traced = _decode_step(_smol())
    with pytest.raises(ClaimFailed, match="its bytes' reading"):  # a product over a tenth of the bytes, 10x quicker
        claim_memory_bound(BUSY_BW, work, traced, 0.2, "a decode step", matvec_s=0.0046, matvec_bytes=work.bytes)
    assert "C11 holds" in repr(claim_memory_bound(BUSY_BW, work, traced, 0.054, "a decode step", matvec_s=0.0046,
                                                  matvec_bytes=work.bytes / 10))
    with pytest.raises(CourseError, match="positive"):
        claim_memory_bound(BUSY_BW, work, traced, 0.054, "a decode step", matvec_s=0)


@pytest.mark.counterfactual("C11", "a byte count that forgets the LM head")
def test_c11_fails_when_the_count_forgets_the_lm_head():
    from llm_anatomy.measure.roofline import claim_memory_bound

    cfg = _smol()
    work, traced = _decode_step(cfg)
    headless = Work(work.flops, work.bytes - cfg.vocab_size * cfg.hidden_size * 4)
    for seconds in (0.05, 0.127, 0.3):  # whatever the time
        with pytest.raises(ClaimFailed, match="C11 FAILED.*failed: counted = traced"):
            claim_memory_bound(BUSY_BW, headless, traced, seconds, "a decode step", matvec_s=MATVEC_S)


@pytest.mark.counterfactual("C11", "a byte count halved")
def test_c11_fails_when_the_bytes_are_halved():
    from llm_anatomy.measure.roofline import claim_memory_bound

    work, traced = _decode_step(_smol())
    with pytest.raises(ClaimFailed, match="C11 FAILED.*counted = traced"):
        claim_memory_bound(BUSY_BW, Work(work.flops, work.bytes / 2), traced, 0.127, "a decode step",
                           matvec_s=MATVEC_S / 2)


@pytest.mark.counterfactual("C11", "the tiny model's step, which is overhead-bound")
def test_c11_fails_for_the_tiny_overhead_bound_step(tiny_model):
    """The tiny model's real step, timed in turns with a matrix-vector product over its 0.41 MB as notebook 07 times
    the default model's (47-52x the product here, idle or with a core burned)."""
    from llm_anatomy.generate.decode import decode_step
    from llm_anatomy.measure.peaks import matvec_over, measured_in_turns
    from llm_anatomy.measure.roofline import claim_memory_bound, traced_bytes
    from llm_anatomy.model.scratch import ScratchLlama

    net = ScratchLlama.from_hf(tiny_model)
    work = forward_work(net.cfg, 1, 64, 1, 4, materialized_scores=True, activations=True)
    cache, token = net.new_cache(1, 65), torch.zeros(1, 1, dtype=torch.long)

    def step():
        cache.length = 64
        decode_step(net, token, cache)

    matvec, matvec_bytes = matvec_over(work.bytes, net.cfg.hidden_size)
    with torch.inference_mode():
        traced = traced_bytes(step)
        times, peaks = measured_in_turns({"step": step, "matvec": matvec}, repeats=5, nbytes=1 << 24, size=256)
    with pytest.raises(ClaimFailed, match="C11 FAILED.*failed: .*its bytes' reading"):
        claim_memory_bound(peaks, work, traced, times["step"].min_s, "the tiny model's decode step",
                           matvec_s=times["matvec"].min_s, matvec_bytes=matvec_bytes)
    # and with the figures measured here: 1.22-1.26 ms against 0.024-0.026 ms
    with pytest.raises(ClaimFailed, match="its bytes' reading"):
        claim_memory_bound(BUSY_BW, work, traced, 0.00122, "the tiny model's decode step", matvec_s=0.000026)


@pytest.mark.counterfactual("C11", "a step faster than its bytes allow (bandwidth or bytes wrong)")
def test_c11_fails_for_a_step_faster_than_its_bytes():
    from llm_anatomy.measure.roofline import claim_memory_bound

    work, traced = _decode_step(_smol())
    with pytest.raises(ClaimFailed, match="C11 FAILED.*no faster than its bytes"):
        claim_memory_bound(BUSY_BW, work, traced, 0.5 * work.bytes / BUSY_BW.bytes_per_s, "a decode step",
                           matvec_s=MATVEC_S)


@pytest.mark.counterfactual("C11", "a step right of the ridge (a large batch, or a prefill)")
def test_c11_fails_right_of_the_ridge():
    from llm_anatomy.measure.roofline import claim_memory_bound

    cfg = _smol()
    prefill = forward_work(cfg, 160, 0, 1, 4, materialized_scores=True, activations=True)
    traced = _traced_pass(cfg, 160, 0, 1, torch.float32, "naive")
    with pytest.raises(ClaimFailed, match="C11 FAILED.*left of the ridge"):
        claim_memory_bound(BUSY_BW, prefill, traced, 1.24, "a prefill", matvec_s=MATVEC_S)


def test_c11_claims_the_byte_model_as_a_floor():
    from llm_anatomy.measure.roofline import claim_byte_floor

    assert "C11 holds" in repr(claim_byte_floor(PEAKS, 1e9, 0.25, "decode"))  # 0.1 s is the floor: 2.5x it
    assert "C11 holds" in repr(claim_byte_floor(PEAKS, 1e9, 0.095, "decode"))  # within the 0.9 allowance
    with pytest.raises(ClaimFailed, match="0.50x that"):
        claim_byte_floor(PEAKS, 1e9, 0.05, "decode")  # faster than its bytes allow: the count or the bandwidth is wrong


def test_the_predicted_decode_step_is_the_larger_of_the_byte_and_the_flop_floors():
    from llm_anatomy.measure.roofline import predict_decode_step_s

    # 1 GB of weights, 1 kB of cache per token, 0.5 G parameters, 100 GB/s, 10 TFLOP/s
    memory_bound = predict_decode_step_s(4, 1000, 1e9, 1e3, 0.5e9, 100e9, 10e12)
    assert memory_bound == pytest.approx((1e9 + 4 * 1000 * 1e3) / 100e9)
    compute_bound = predict_decode_step_s(4096, 1, 1e9, 1e3, 0.5e9, 100e9, 10e12)
    assert compute_bound == pytest.approx(2 * 4096 * 0.5e9 / 10e12)
