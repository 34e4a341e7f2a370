"""Notebook 09's pictures draw what they are given, with labelled axes (no model needed)."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from llm_anatomy.views.fast import (plot_peak_memory, plot_quantization, plot_speculation, plot_step_split,  # noqa: E402
                                    plot_step_times, speculation_rounds_html)


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


def test_a_kl_of_zero_gets_a_label_not_a_made_up_bar():
    _, right = plot_quantization({"fp32": (540e6, 0.0), "int8": (136e6, 0.004), "int4": (100e6, 0.3)})
    low, high = right.get_ylim()
    assert right.get_yscale() == "log" and low < 0.004 and high > 0.3
    assert right.patches[0].get_height() == 0  # no bar for fp32, whose KL is 0: a label says so
    assert any("reference" in t.get_text() for t in right.texts)
    plt.close("all")


def test_the_third_prediction_is_drawn_when_given():
    _, right = plot_speculation([2, 4], [0.8, 0.7], [1.3, 1.5], [1.4, 1.6], from_widths=[1.2, 1.4])
    assert len(right.lines) == 4  # measured, two predictions, the line at 1x
    plt.close("all")


def test_the_rounds_are_coloured_kept_rejected_and_own():
    from llm_anatomy.fast.speculative import SpeculativeResult

    # prefill gives 10; round 1 drafts 11 12 13 and keeps 2 (13 rejected, 99 the correction); round 2 no draft (14);
    # round 3 drafts 15 16, both kept, bonus 17
    run = SpeculativeResult(tokens=[10, 11, 12, 99, 14, 15, 16, 17], rounds=3, drafts_per_round=[[11, 12, 13], [], [15, 16]],
                            accepted_per_round=[2, 0, 2], drafted_per_round=[3, 0, 2])
    html = speculation_rounds_html(run, lambda t: f"t{t}")
    for token in ("t10", "t11", "t12", "t13", "t99", "t14", "t15", "t16", "t17"):
        assert f">{token}<" in html
    assert html.count("line-through") == 1  # the one rejected draft (13)
    assert html.count(': draft kept"') == 4 and "bonus" in html and "instead of the rejected draft" in html
    assert html.count("border-left") == 3  # one bar per pass


def test_sdpa_is_the_third_line_of_the_memory_plot():
    ax = plot_peak_memory([256, 512], [10e6, 40e6], [2e6, 3e6], sdpa_bytes=[1e6, 1.5e6])
    assert len(ax.lines) == 3 and "SDPA" in ax.get_legend_handles_labels()[1][2]
    plt.close("all")


def test_the_step_split_stacks_each_steps_parts_in_milliseconds_with_its_op_count():
    eager = {"matmuls": 0.006, "casts": 0.0007, "attention": 0.0008, "rest": 0.0083, "ops": 1583}
    compiled = {"matmuls": 0.0055, "casts": 0.0, "attention": 0.0009, "rest": 0.0028, "ops": 271}
    ax = plot_step_split({"eager": eager, "compiled": compiled}, kernels_ms=5.8)
    assert "milliseconds" in ax.get_xlabel() and len(ax.patches) == 8  # four parts a bar
    widths = [p.get_width() for p in ax.patches]
    assert sum(widths[:4]) == pytest.approx(sum(eager[k] for k in ("matmuls", "casts", "attention", "rest")) * 1e3)
    assert [t.get_text().strip() for t in ax.texts] == ["1,583 aten ops a step", "271 aten ops a step"]
    assert ax.get_xlim()[1] > 1.3 * sum(widths[:4])  # room for the labels at the bars' ends
    assert any("5.8 ms" in t.get_text() for t in ax.get_legend().get_texts())
    plt.close("all")
