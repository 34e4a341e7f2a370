"""Notebook 09's pictures draw what they are given, with labelled axes (no model needed)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from llm_anatomy.views.fast import plot_peak_memory, plot_quantization, plot_speculation, plot_step_times  # noqa: E402


def test_each_picture_labels_its_axes_with_units():
    left, right = plot_quantization({"fp32": (540e6, 0.0), "int8": (136e6, 0.004), "int4": (100e6, 0.3)})
    assert "MB" in left.get_ylabel() and "nats" in right.get_ylabel() and len(left.patches) == 3
    left, right = plot_speculation([1, 2, 4], [0.8, 0.75, 0.7], [1.3, 1.5, 1.6], [1.4, 1.6, 1.8])
    assert "tokens" in left.get_xlabel() and "(x)" in right.get_ylabel() and len(right.lines) == 3
    ax = plot_peak_memory([256, 512], [10e6, 40e6], [2e6, 3e6])
    assert "tokens" in ax.get_xlabel() and "MB" in ax.get_ylabel() and len(ax.lines) == 2
    ax = plot_step_times(["plain", "fused"], [40.0, 30.0], 25.0)
    assert "milliseconds" in ax.get_ylabel() and len(ax.patches) == 2
    plt.close("all")
