"""The machine's peaks: a matmul's FLOP/s and the read bandwidth, measured, and the data sheets (never speed)."""

from __future__ import annotations

import math

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.measure.peaks import measure_bandwidth, measure_matmul_flops, measure_peaks, peaks_table, published_peaks


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



def test_peaks_measured_in_turns_with_a_run():
    from llm_anatomy.measure.peaks import measured_in_turns

    calls = []
    timings, peaks = measured_in_turns({"run": lambda: calls.append(1)}, "cpu", nbytes=1 << 20, size=64, repeats=2)
    assert list(timings) == ["run"] and len(calls) == 3  # a warm-up round, then two timed ones
    assert math.isfinite(peaks.flops_per_s) and peaks.flops_per_s > 0 and peaks.bytes_per_s > 0
    assert "in turns" in peaks.how and peaks.dtype == "fp32"
    with pytest.raises(CourseError, match="other than"):
        measured_in_turns({"sum": lambda: None}, "cpu", nbytes=1 << 20, size=64)


def test_matvec_over_reads_the_bytes_asked_for_in_one_product():
    from llm_anatomy.measure.peaks import matvec_over

    fn, nbytes = matvec_over(1_000_000, 576)
    assert nbytes == 434 * 576 * 4 and abs(nbytes - 1_000_000) < 576 * 4  # whole rows, the nearest count
    assert fn().shape == (1, 434)
    fn, nbytes = matvec_over(100, 576, dtype=torch.bfloat16)  # at least one row
    assert nbytes == 576 * 2 and fn().dtype == torch.bfloat16
    with pytest.raises(CourseError, match="width"):
        matvec_over(1_000, 0)
