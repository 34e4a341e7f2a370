"""The roofline picture: log-log axes with units, one label per point."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from llm_anatomy.measure.peaks import Peaks  # noqa: E402
from llm_anatomy.measure.roofline import Work, roofline_point  # noqa: E402
from llm_anatomy.views.roofline import plot_roofline  # noqa: E402


def test_plot_roofline_is_log_log_with_units():
    peaks = Peaks("test", "float32", flops_per_s=100e9, bytes_per_s=10e9, how="")
    points = [roofline_point("prefill 512", Work(1e12, 1e9), 20.0), roofline_point("decode b=1", Work(2e9, 1e9), 0.2)]
    ax = plot_roofline(peaks, points)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "FLOP per byte" in ax.get_xlabel() and "GFLOP/s" in ax.get_ylabel()
    assert [t.get_text() for t in ax.texts] == ["1", "2"]  # numbers by the points, the names in the legend
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["measured roof", "1: prefill 512", "2: decode b=1"]
    close = [roofline_point("prefill 64", Work(1e10, 1e9), 1.0), roofline_point("prefill 65", Work(1.01e10, 1e9), 1.0)]
    ax2 = plot_roofline(peaks, close)
    first, second = (t.xyann for t in ax2.texts)  # the offsets of the two numbers, in points
    assert first != second  # the second number moved off the first
    plt.close(ax2.figure)
    plt.close(ax.figure)




def test_labels_of_points_close_together_do_not_overprint():
    import matplotlib.pyplot as plt

    peaks = Peaks("test", "float32", flops_per_s=100e9, bytes_per_s=10e9, how="")
    close = [roofline_point(f"decode {name}", Work(2e9, b), 0.05) for name, b in
             (("plain", 1.0e9), ("fused", 1.02e9), ("packed int8", 0.98e9), ("packed int4", 0.97e9))]
    ax = plot_roofline(peaks, close)
    ax.figure.canvas.draw()
    from matplotlib.text import Text

    boxes = [Text.get_window_extent(t) for t in ax.texts]  # the labels' text alone, not their leader lines
    assert len(boxes) == 4
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(ax.figure)
