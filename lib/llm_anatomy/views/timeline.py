"""A request on a time axis: the prefill bar (time to first token), then one tick per decode step."""

from __future__ import annotations

from ..measure.timing import median_decode_step_s


def plot_request_timeline(requests: dict[str, list[float]], ax=None, title: str | None = None):
    """One row per request: `requests` maps a label to its step times in seconds (the first is the prefill).

    The orange bar is the prefill, which ends when the first token arrives (TTFT); each later token arrives at a
    tick, one decode step (TPOT) after the one before. The figures drawn are those of the run given (the caller's
    TTFT and TPOT may be medians over several runs). Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.9 + 0.7 * len(requests)))
    for row, (label, steps) in enumerate(requests.items()):
        ttft_ms, decode_ms = steps[0] * 1e3, [s * 1e3 for s in steps[1:]]
        ax.barh(row, ttft_ms, height=0.5, color="tab:orange", label="prefill (until the first token)" if row == 0 else None)
        start = ttft_ms
        for i, ms in enumerate(decode_ms):
            ax.barh(row, ms, left=start, height=0.5, color=("tab:blue", "lightsteelblue")[i % 2],
                    label="decode steps (one token each)" if row == 0 and i == 0 else None)
            start += ms
        arrivals = [ttft_ms] + [ttft_ms + sum(decode_ms[:i + 1]) for i in range(len(decode_ms))]
        ax.plot(arrivals, [row + 0.35] * len(arrivals), "v", color="black", ms=4,
                label="a token arrives" if row == 0 else None)
        gap = f", then one every {median_decode_step_s(steps[1:]) * 1e3:.1f} ms (median)" if decode_ms else ""
        ax.annotate(f"first token at {ttft_ms:.0f} ms{gap}", (start, row), xytext=(6, -3),
                    textcoords="offset points", fontsize=8)
    _label_rows(ax, list(requests), "time since the request reached the model (ms)",
                title or "One request: prefill, then one decode step per token", top=0.2)
    ax.margins(x=0.45)
    return ax


def _label_rows(ax, labels: list[str], xlabel: str, title: str, top: float) -> None:
    """One labelled row per entry, the first at the top, the legend outside the plot on the right."""
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(-0.6, len(labels) - top)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)


MATMUL_OPS = ("linear", "mm", "addmm", "bmm", "matmul", "_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu")


def is_matmul(name: str) -> bool:
    """Whether an op (aten name) or a GPU kernel (its name) is a matrix product: what the timeline draws in blue."""
    name = name.lower()
    return name in MATMUL_OPS or "gemm" in name or "gemv" in name or "matmul" in name


def plot_step_timeline(rows: dict[str, list], ax=None, title: str | None = None):
    """One row per label: the spans of one step (`llm_anatomy.measure.step_parts.Span`, seconds) as bars on a time
    axis in ms, matrix products in blue and every other op or kernel in orange; the white between them is time no op
    ran (Python, the dispatcher, a launch). Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.9 + 0.7 * len(rows)))
    labelled = set()
    for row, (label, spans) in enumerate(rows.items()):
        for span in spans:
            kind = "matrix products" if is_matmul(span.name) else "other ops and kernels"
            ax.barh(row, (span.end_s - span.start_s) * 1e3, left=span.start_s * 1e3, height=0.5,
                    color="tab:blue" if kind == "matrix products" else "tab:orange",
                    label=None if kind in labelled else kind)
            labelled.add(kind)
    _label_rows(ax, list(rows), "time since the step's first op (ms)", title or "One decode step, op by op", top=0.4)
    return ax
