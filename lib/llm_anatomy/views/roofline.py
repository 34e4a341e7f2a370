"""The roofline picture: measured roofs and measured runs on log-log axes."""

from __future__ import annotations

from ..measure.peaks import Peaks
from ..measure.roofline import RooflinePoint, roof


def plot_roofline(peaks: Peaks, points: list[RooflinePoint], ax=None, title: str | None = None):
    """Log-log roofline: the measured roof and each run as a numbered point, named in a legend beside the plot (so
    that labels of close points never overprint). Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    lows = [p.intensity for p in points] + [peaks.ridge_intensity]
    x = np.logspace(np.log10(min(lows) / 4), np.log10(max(lows + [p.intensity for p in points]) * 4), 200)
    ax.loglog(x, [roof(peaks, i) / 1e9 for i in x], color="black", lw=2, label="measured roof")
    ax.axvline(peaks.ridge_intensity, color="grey", ls=":", lw=1)
    markers = {"prefill": "o", "decode": "s"}
    placed: list[tuple[float, float]] = []  # where each number went, in log10 units
    for number, p in enumerate(points, 1):
        kind = next((k for k in markers if p.label.startswith(k)), None)
        y = p.flops_per_s / 1e9
        ax.loglog(p.intensity, y, markers.get(kind, "^"), ls="none", label=f"{number}: {p.label}",
                  color={"prefill": "tab:orange", "decode": "tab:blue"}.get(kind, "tab:green"))
        # only the number sits by the point (the legend names it); a number that would land on an earlier one is
        # moved down a line, so close points stay readable
        here = (np.log10(p.intensity), np.log10(max(y, 1e-12)))
        crowded = sum(abs(here[0] - a) < 0.12 and abs(here[1] - b) < 0.12 for a, b in placed)
        placed.append(here)
        # the first number by a point sits to its right, a crowded one to its left, further out each time
        ax.annotate(str(number), (p.intensity, y), fontsize=7, textcoords="offset points",
                    xytext=(4, 3) if not crowded else (-5 - 8 * (crowded - 1), 3), ha="left" if not crowded else "right")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attained GFLOP/s")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # 1, 2, 5 a decade, as plain numbers
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_title(title or f"Roofline of {peaks.device} ({peaks.dtype})")
    ax.grid(True, which="both", alpha=0.3)
    return ax
