"""Notebook 10's pictures draw what they are given: every rank and stage, units on the axes, the fitted line."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from llm_anatomy.distributed.collectives import Link  # noqa: E402
from llm_anatomy.distributed.pipeline import schedule  # noqa: E402
from llm_anatomy.errors import CourseError  # noqa: E402
from llm_anatomy.model.scratch import ScratchConfig  # noqa: E402
from llm_anatomy.views.parallel import (plot_block_split, plot_bubble, plot_link_fit, plot_pipeline_gantt,  # noqa: E402
                                        plot_tp_measured)

SMOL = ScratchConfig(49152, 576, 1536, 30, 9, 3, 64, 1e5, 1e-5, 8192)


def _texts(ax) -> str:
    return " ".join(t.get_text() for t in ax.texts)


def test_the_block_split_names_each_ranks_heads_and_both_all_reduces():
    ax = plot_block_split(SMOL, 3)
    text = _texts(ax)
    assert "rank 0" in text and "rank 2" in text and text.count("all-\nreduce") == 2
    assert "query heads 6-8\nKV head 2" in text and "width 1024-1535" in text  # rank 2's heads and MLP columns
    plt.close("all")


def test_the_measured_step_draws_each_rank_the_prediction_and_every_all_reduce():
    """Bars of the measured times cost_run returns (a few parts each, not a sliver per collective), beside the
    prediction; every all-reduce of rank 0's step on the right, by layer."""
    link = Link(2e-4, 1e9)
    layers = 30
    calls = [("all_reduce", "embedding", 256, 1e-3)]
    calls += [c for i in range(layers) for c in (("all_reduce", "attention", 256, 1e-3 * (1 + i % 3)),
                                                 ("all_reduce", "mlp", 256, 2e-3))]
    calls.append(("all_gather", "logits", 8192, 1e-3))
    bars, each = plot_tp_measured([0.2, 0.21], [calls, calls], link, compute_s=0.007)
    assert [t.get_text() for t in bars.get_yticklabels()] == ["predicted", "rank 0, measured", "rank 1, measured"]
    assert len(bars.patches) == 3 * 4 and "(ms)" in bars.get_xlabel() and "(ms" in each.get_ylabel()
    widths = [p.get_width() for p in bars.patches]  # ms: compute, after attention, after the MLP, the two ends
    inside_attention = sum(s for _, site, _, s in calls if site == "attention") * 1e3
    assert widths[4:8] == pytest.approx([200 - inside_attention - 60 - 2, inside_attention, 60, 2])  # rank 0
    assert widths[0:4] == pytest.approx([7, layers * link.seconds(256) * 1e3, layers * link.seconds(256) * 1e3,
                                         (link.seconds(256) + link.seconds(8192)) * 1e3])  # the prediction
    assert "200.0 ms" in _texts(bars) and "210.0 ms" in _texts(bars)  # each measured step's total, written at its end
    points = [len(line.get_xdata()) for line in each.get_lines()[:2]]
    assert points == [layers, layers]  # every all-reduce after attention and after the MLP, one point each
    with pytest.raises(CourseError, match="one step time and one list of collectives per rank"):
        plot_tp_measured([0.2], [calls, calls], link, 0.007)
    plt.close("all")


def test_the_link_fit_draws_the_repeats_the_medians_and_the_line():
    sweep = {4: [1e-3, 1.1e-3], 4096: [1.1e-3, 1.2e-3], 1 << 20: [3e-3, 3.5e-3]}
    ax = plot_link_fit(sweep, Link(1e-3, 5e8), marks={"one token": 2304}, fitted_to="each size's fastest repeat")
    assert ax.get_xscale() == "log" and "(bytes)" in ax.get_xlabel() and "(ms)" in ax.get_ylabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "fitted to each size's fastest repeat: 1.000 ms + bytes / 0.50 GB/s" in legend, legend
    assert legend[:2] == ["each repeat", "median of the repeats"]  # the grey dots are named too
    assert "one token" in _texts(ax)
    plt.close("all")


def test_the_link_fit_labels_sit_below_every_point_clear_of_their_lines_and_of_each_other():
    sweep = {n: [1e-3, 4e-3] for n in (4, 256, 2304, 1 << 16, 1 << 20, 1 << 22)}
    marks = {"one token's hidden state, 256 B": 256, "n½ = 660,570 B": 660_570}
    ax = plot_link_fit(sweep, Link(2.3e-4, 2.9e9), marks=marks)
    renderer = ax.figure.canvas.get_renderer()
    boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
    lowest = ax.transData.transform((4, 1e3 * min(min(t) for t in sweep.values())))[1]
    assert all(box.y1 < lowest for box in boxes.values())  # in the band under every repeat
    line = ax.transData.transform((660_570, 1))[0]
    assert boxes["n½ = 660,570 B"].x1 < line  # left of its dotted line
    near_left = ax.transData.transform((256, 1))[0]
    assert boxes["one token's hidden state, 256 B"].x0 > near_left  # no room left of it, so to its right
    assert not boxes["n½ = 660,570 B"].overlaps(boxes["one token's hidden state, 256 B"])
    plt.close("all")


def test_the_gantt_chart_has_a_bar_per_micro_batch_per_stage():
    slots = schedule([[0.01] * 4, [0.01] * 4])
    ax = plot_pipeline_gantt(slots, 2)
    assert [t.get_text() for t in ax.texts] == ["0", "1", "2", "3"] * 2
    assert len(ax.patches) == 2 + 8  # an idle background per stage, then the micro-batches
    plt.close("all")


def test_the_bubble_plot_draws_the_run_the_lines_read_when_given():
    ax = plot_bubble({1: [0.5, 0.5], 2: [0.35, 0.3], 4: [0.2, 0.22]}, 2, fastest={1: 0.5, 2: 0.3, 4: 0.22})
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["each run", "the fastest run (the lines below)", "(p - 1) / (m + p - 1)"]
    assert list(ax.get_lines()[-2].get_ydata()) == [50, 30, 22]  # those runs, not the medians (32.5, 21)
    busy = plot_bubble({1: [0.56, 0.7], 2: [0.54, 0.8]}, 2, fastest={1: 0.56, 2: 0.54})
    assert busy.get_ylim()[1] >= 80  # a run whose stages took turns (above one half) is still on the plot
    plt.close("all")


def test_the_bubble_plot_draws_the_formula_and_the_medians():
    ax = plot_bubble({1: [0.5, 0.5], 2: [0.35, 0.3], 4: [0.2, 0.22]}, 2)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["each run", "measured (median)",
                                                                    "(p - 1) / (m + p - 1)"]
    assert ax.get_ylabel().endswith("(%)")
    plt.close("all")
