"""The request timeline: one row per request, the prefill bar first, one bar per decode step, axes in ms."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from llm_anatomy.views.timeline import plot_request_timeline  # noqa: E402


def test_the_timeline_draws_the_prefill_then_each_step():
    import matplotlib.pyplot as plt

    ax = plot_request_timeline({"short": [0.1, 0.02, 0.02, 0.03], "long": [0.5, 0.02, 0.02]})
    bars = [(round(p.get_x() * 1e3) / 1e3, round(p.get_width() * 1e3) / 1e3) for p in ax.patches]
    assert bars[:4] == [(0.0, 100.0), (100.0, 20.0), (120.0, 20.0), (140.0, 30.0)]  # ms, starting where the last ended
    assert bars[4:] == [(0.0, 500.0), (500.0, 20.0), (520.0, 20.0)]
    assert "ms" in ax.get_xlabel() and [t.get_text() for t in ax.get_yticklabels()] == ["short", "long"]
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "first token at 100 ms" in texts and "20.0 ms (median)" in texts
    plt.close("all")
