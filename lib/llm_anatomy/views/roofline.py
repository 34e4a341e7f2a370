"""The roofline picture: measured roofs and measured runs on log-log axes."""

from __future__ import annotations

from ..measure.peaks import Peaks
from ..measure.roofline import RooflinePoint, roof


def plot_roofline(peaks: Peaks, points: list[RooflinePoint], ax=None, title: str | None = None):
    """Log-log roofline: the measured roofs and each run as a point. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    lows = [p.intensity for p in points] + [peaks.ridge_intensity]
    x = np.logspace(np.log10(min(lows) / 4), np.log10(max(lows + [p.intensity for p in points]) * 4), 200)
    ax.loglog(x, [roof(peaks, i) / 1e9 for i in x], color="black", lw=2, label="measured roof")
    ax.axvline(peaks.ridge_intensity, color="grey", ls=":", lw=1)
    markers = {"prefill": "o", "decode": "s"}
    placed: list[tuple[float, float]] = []  # (log10 x, log10 y) of the points labelled so far
    for p in sorted(points, key=lambda p: (p.intensity, p.flops_per_s)):
        kind = next((k for k in markers if p.label.startswith(k)), None)
        ax.loglog(p.intensity, p.flops_per_s / 1e9, markers.get(kind, "^"),
                  color={"prefill": "tab:orange", "decode": "tab:blue"}.get(kind, "tab:green"))
        here = (np.log10(p.intensity), np.log10(p.flops_per_s / 1e9))
        near = sum(abs(here[0] - x) < 0.35 and abs(here[1] - y) < 0.25 for x, y in placed)  # labels it would cover
        placed.append(here)
        ax.annotate(p.label, (p.intensity, p.flops_per_s / 1e9), fontsize=7, xytext=(4, 3 - 10 * near),
                    textcoords="offset points", va="bottom" if not near else "top",
                    arrowprops=dict(arrowstyle="-", color="grey", lw=0.5) if near else None)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attained GFLOP/s")
    ax.set_title(title or f"Roofline of {peaks.device} ({peaks.dtype})")
    ax.grid(True, which="both", alpha=0.3)
    return ax
