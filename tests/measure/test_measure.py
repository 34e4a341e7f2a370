"""Timing helpers, the machine's peaks, FLOP/byte accounting and the roofline (structure and maths, never speed)."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from llm_anatomy.errors import CourseError
from llm_anatomy.measure.peaks import Peaks, measure_bandwidth, measure_matmul_flops, measure_peaks, peaks_table, published_peaks
from llm_anatomy.measure.roofline import Work, forward_work, matmul_parameters, roof, roofline_point
from llm_anatomy.measure.timing import Timing, time_generation, time_it
from llm_anatomy.views.roofline import plot_roofline
from llm_anatomy.model.scratch import ScratchConfig, ScratchLlama


def test_time_it_warms_up_then_repeats():
    calls = []
    timing = time_it(lambda: calls.append(1), "cpu", warmup=2, repeats=5)
    assert len(calls) == 7 and len(timing.times_s) == 5 and timing.warmup == 2
    assert all(t >= 0 for t in timing.times_s)
    assert timing.min_s <= timing.median_s <= max(timing.times_s)
    assert timing.median_ms == pytest.approx(timing.median_s * 1e3)
    assert "median" in repr(timing)
    with pytest.raises(CourseError):
        time_it(lambda: None, "cpu", repeats=0)


def test_median_of_known_times():
    assert Timing([3.0, 1.0, 2.0], 0).median_s == 2.0


def test_measured_peaks_are_positive_finite_numbers():
    flops = measure_matmul_flops("cpu", size=64, repeats=2)
    read = measure_bandwidth("cpu", nbytes=1 << 20, repeats=2)
    copy = measure_bandwidth("cpu", nbytes=1 << 20, repeats=2, method="copy")
    triad = measure_bandwidth("cpu", nbytes=1 << 20, repeats=2, method="triad")
    for value in (flops, read, copy, triad):
        assert math.isfinite(value) and value > 0
    with pytest.raises(CourseError, match="sum"):
        measure_bandwidth("cpu", method="scan")
    peaks = measure_peaks("cpu", quick=True)
    assert peaks.published is None and "matmul" in peaks.how and peaks.dtype == "fp32"
    assert set(peaks.bandwidth_by_method) == {"sum", "copy", "triad"}
    assert peaks.bytes_per_s == max(peaks.bandwidth_by_method.values())  # the best of the three
    table = peaks_table(peaks)
    assert "this machine (measured, fp32)" in table and "H200 (data sheet, bf16)" in table
    assert "T4 (data sheet, fp16)" in table  # no bf16 tensor cores on a T4: its peak is fp16's


@pytest.mark.parametrize("name, expected", [
    ("Tesla T4", (65e12, 320e9, "fp16")),
    ("NVIDIA L4", (121e12, 300e9, "bf16")),
    ("NVIDIA A100-SXM4-80GB", (312e12, 2039e9, "bf16")),
    ("NVIDIA A100-SXM4-40GB", (312e12, 1555e9, "bf16")),
    ("NVIDIA H100 80GB HBM3", (989e12, 3350e9, "bf16")),
    ("NVIDIA H100 PCIe", (756e12, 2000e9, "bf16")),
    ("NVIDIA H200", (989e12, 4800e9, "bf16")),
    ("NVIDIA L40S", None),  # not the L4
    ("NVIDIA GeForce RTX 4090", None),
])
def test_published_peaks_match_by_device_name(name, expected):
    found = published_peaks(name)
    if expected is None:
        assert found is None
    else:
        assert found[:2] == pytest.approx(expected[:2]) and found[2] == expected[2]


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
    scores = cfg.num_layers * cfg.num_heads * 64 * 64 * 4  # one fp32 [64, 64] score matrix per head and layer
    assert naive.bytes - plain.bytes == 3 * scores and naive.flops == plain.flops
    with pytest.raises(CourseError, match="new_tokens"):
        forward_work(cfg, new_tokens=0)


def test_plot_roofline_is_log_log_with_units():
    peaks = Peaks("test", "float32", flops_per_s=100e9, bytes_per_s=10e9, how="")
    points = [roofline_point("prefill 512", Work(1e12, 1e9), 20.0), roofline_point("decode b=1", Work(2e9, 1e9), 0.2)]
    ax = plot_roofline(peaks, points)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "FLOP per byte" in ax.get_xlabel() and "GFLOP/s" in ax.get_ylabel()
    assert [t.get_text() for t in ax.texts] == ["prefill 512", "decode b=1"]
    import matplotlib.pyplot as plt

    plt.close(ax.figure)


def test_time_generation_gives_ttft_and_tpot(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    t = time_generation(model, ids, new_tokens=5, repeats=3)
    assert t.prompt_tokens == 12 and t.batch == 2 and len(t.step_seconds) == 5
    assert t.ttft_s > 0 and t.tpot_s > 0
    assert t.decode_tokens_per_s == pytest.approx(2 / t.tpot_s)
    assert t.prefill_tokens_per_s == pytest.approx(24 / t.ttft_s)
    assert len(t.prefill_seconds) == 3 and t.ttft_s == sorted(t.prefill_seconds)[1]  # the median of the runs
