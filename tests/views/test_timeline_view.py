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


def test_the_step_timeline_colours_matmuls_apart_and_draws_in_ms():
    import matplotlib.pyplot as plt

    from llm_anatomy.measure.step_parts import Span
    from llm_anatomy.views.timeline import plot_step_timeline

    spans = [Span("linear", 0.0, 0.002), Span("mul", 0.0021, 0.0022), Span("_weight_int4pack_mm_for_cpu", 0.003, 0.004)]
    ax = plot_step_timeline({"eager": spans, "graph": spans[:1]})
    bars = [(round(p.get_x(), 3), round(p.get_width(), 3), matplotlib.colors.to_hex(p.get_facecolor()))
            for p in ax.patches]
    blue, orange = matplotlib.colors.to_hex("tab:blue"), matplotlib.colors.to_hex("tab:orange")
    assert bars == [(0.0, 2.0, blue), (2.1, 0.1, orange), (3.0, 1.0, blue), (0.0, 2.0, blue)]  # ms
    assert "ms" in ax.get_xlabel() and [t.get_text() for t in ax.get_yticklabels()] == ["eager", "graph"]
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["matrix products", "other ops and kernels"]
    plt.close("all")
