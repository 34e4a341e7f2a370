"""Pictures for notebook 09 (making decode fast): plain matplotlib over numbers measured elsewhere."""

from __future__ import annotations


def _axes(ax, figsize=(6, 3.5)):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def plot_quantization(rows: dict[str, tuple[float, float]], axes=None):
    """Two bar charts side by side: megabytes of weights read per token, and the logit KL against fp32 (nats).

    rows: format -> (bytes per token, KL divergence in nats). Returns the two Axes.
    """
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    names = list(rows)
    left, right = axes
    left.bar(names, [rows[n][0] / 1e6 for n in names], color="tab:blue")
    left.set(ylabel="weights read per token (MB)", title="Bytes per decoded token")
    positive = [rows[n][1] for n in names if rows[n][1] > 0]
    floor = min(positive) / 10 if positive else 1e-6  # the log axis' bottom; a KL of 0 gets no bar, only a label
    right.bar(names, [rows[n][1] if rows[n][1] > 0 else 0 for n in names], color="tab:red", bottom=0)
    right.set(yscale="log", ylim=(floor, max(positive, default=1.0) * 3),
              ylabel="KL(fp32 || format), nats (log scale)", title="Quality lost")
    for i, n in enumerate(names):
        if rows[n][1] <= 0:  # log(0) has no place on the axis: say it instead of drawing a made-up bar
            right.annotate("0\n(the reference)", (i, floor), xytext=(0, 4), textcoords="offset points", ha="center",
                           va="bottom", fontsize=8)
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8)
    return axes


def plot_speculation(draft_lengths, acceptance, measured, predicted, axes=None, label: str = "prompt lookup",
                     from_widths=None):
    """Acceptance rate, and measured against predicted speedup, both against the draft length k; `from_widths`, the
    speedups predicted from each run's own rounds (each pass priced at its real width), as a third line."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    left, right = axes
    left.plot(draft_lengths, acceptance, marker="o", label=label)
    left.set(xlabel="draft length k (tokens)", ylabel="acceptance rate (fraction of drafts kept)", ylim=(0, 1.05),
             title="How many drafts the model keeps")
    right.plot(draft_lengths, measured, marker="o", label="measured")
    right.plot(draft_lengths, predicted, marker="s", ls="--", label="predicted from the acceptance rate")
    if from_widths is not None:
        right.plot(draft_lengths, from_widths, marker="^", ls="-.", label="predicted from the rounds' own widths")
    right.axhline(1.0, color="grey", lw=1, ls=":")
    right.set(xlabel="draft length k (tokens)", ylabel="speedup over plain decoding (x)", title="Speedup")
    drawn = [*measured, *predicted, *(from_widths or []), 1.0]
    right.set_ylim(0, max(drawn) * 1.7)  # headroom above the curves, where the legend sits
    right.legend(fontsize=8, loc="upper left")
    return axes


def plot_peak_memory(lengths, plain_bytes, tiled_bytes, ax=None, sdpa_bytes=None):
    """Peak extra memory of one attention call against the prompt length, plain and tiled (and PyTorch's fused SDPA
    when given), log-log."""
    ax = _axes(ax)
    ax.loglog(lengths, [b / 1e6 for b in plain_bytes], marker="o", label="plain: the whole score matrix")
    ax.loglog(lengths, [b / 1e6 for b in tiled_bytes], marker="s", label="tiled: one tile of scores at a time")
    if sdpa_bytes is not None:
        ax.loglog(lengths, [b / 1e6 for b in sdpa_bytes], marker="^", ls="--", label="SDPA: PyTorch's fused kernel")
    ax.set(xlabel="prompt length (tokens)", ylabel="peak extra memory (MB)", title="Attention memory, one layer")
    from matplotlib.ticker import NullFormatter

    ax.set_xticks(list(lengths), [str(n) for n in lengths])  # the lengths measured, as plain numbers
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def plot_step_times(names, ms_per_token, floor_ms: float, ax=None):
    """Milliseconds per decoded token for each way of running the step, beside the memory floor
    (weight bytes / measured bandwidth): the gap above the floor is overhead."""
    ax = _axes(ax)
    bars = ax.bar(names, ms_per_token, color="tab:blue")
    ax.axhline(floor_ms, color="black", ls="--", lw=1.5, label=f"bytes / bandwidth = {floor_ms:.1f} ms")
    for bar, ms in zip(bars, ms_per_token):
        ax.annotate(f"{ms:.1f}", (bar.get_x() + bar.get_width() / 2, ms), ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="milliseconds per token", title="One decode step, batch 1")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8)
    return ax


SPLIT_COLOURS = {"matmuls": "tab:blue", "casts": "tab:purple", "attention": "tab:green", "rest": "tab:orange"}


def plot_step_split(splits: dict[str, dict], kernels_ms: float | None = None, ax=None):
    """Each step's time split (measure.step_parts.step_split) as one stacked bar, milliseconds per step: the packed
    matmuls, the casts around them, attention, and the rest (the other ops and the gaps between ops), with each
    step's aten ops per step at its bar's end; kernels_ms: the packed kernels timed alone, a dashed line."""
    ax = _axes(ax, figsize=(7, 1.8 + 0.7 * len(splits)))
    names = list(splits)
    for row, name in enumerate(names):
        left = 0.0
        for part, colour in SPLIT_COLOURS.items():
            width = splits[name][part] * 1e3
            ax.barh(row, width, left=left, color=colour, label=part if row == 0 else None)
            left += width
        ax.annotate(f" {splits[name]['ops']:,} aten ops a step", (left, row), va="center", fontsize=8)
    if kernels_ms is not None:
        ax.axvline(kernels_ms, color="black", ls="--", lw=1.2, label=f"packed kernels alone, {kernels_ms:.1f} ms")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    right = max(sum(splits[n][p] for p in SPLIT_COLOURS) * 1e3 for n in names)
    ax.set_xlim(0, right * 1.45)  # room for the op counts
    ax.set(xlabel="milliseconds per decode step (under the profiler)", title="Where one packed int4 step's time goes")
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.24), frameon=False)
    return ax


ROUND_COLOURS = {"kept": "#c8e6c9", "rejected": "#ffcdd2", "own": "#bbdefb", "first": "#eeeeee"}


def speculation_rounds_html(result, label, max_rounds: int | None = None) -> str:
    """The rounds of a speculative generation over its text, as HTML: drafts the model kept (green), the draft it
    rejected (red, struck through; the drafts after it were never looked at, grey), and the token each pass adds
    of its own (blue: the correction after a rejection, or the bonus token when every draft was kept).

    result: a fast.speculative.SpeculativeResult; label: token id -> readable text (views.labels).
    """
    import html

    def chip(token, kind, title):
        style = f"background:{ROUND_COLOURS.get(kind, '#fff')};padding:0 2px;margin:0 1px;border-radius:3px"
        if kind in ("rejected", "unread"):
            style += ";text-decoration:line-through;color:" + ("#b71c1c" if kind == "rejected" else "#9e9e9e")
        return f'<span title="{html.escape(title)}" style="{style}">{html.escape(label(token))}</span>'

    parts = [chip(result.tokens[0], "first", "the prefill's token")]
    done = 1
    for i, (drafts, kept) in enumerate(zip(result.drafts_per_round, result.accepted_per_round)):
        if max_rounds is not None and i >= max_rounds:
            parts.append(" &hellip;")
            break
        chips = [chip(t, "kept", f"round {i + 1}: draft kept") for t in drafts[:kept]]
        if kept < len(drafts):
            chips.append(chip(drafts[kept], "rejected", f"round {i + 1}: draft rejected"))
            chips += [chip(t, "unread", f"round {i + 1}: after a rejection, not checked") for t in drafts[kept + 1:]]
        done += kept + 1
        if done - 1 < len(result.tokens):  # the round's own token (the run may have been cut at a stop token)
            own = "bonus: every draft kept" if kept == len(drafts) and drafts else (
                "the model's own token" + (" (no draft)" if not drafts else ", instead of the rejected draft"))
            chips.append(chip(result.tokens[done - 1], "own", f"round {i + 1}: {own}"))
        parts.append('<span style="border-left:2px solid #555;padding-left:2px;margin-left:2px">' + "".join(chips)
                     + "</span>")
    legend = " ".join(f'<span style="background:{c};padding:0 4px;border-radius:3px">{name}</span>' for name, c in
                      [("kept draft", ROUND_COLOURS["kept"]), ("rejected draft", ROUND_COLOURS["rejected"]),
                       ("the model's own token (bonus or correction)", ROUND_COLOURS["own"])])
    return (f'<div style="font-family:monospace;line-height:1.9">{"".join(parts)}</div>'
            f'<div style="font-size:85%">{legend}; a bar starts each pass of the model</div>')
