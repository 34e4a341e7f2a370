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
    right.bar(names, [max(rows[n][1], 1e-6) for n in names], color="tab:red")
    right.set(yscale="log", ylabel="KL(fp32 || format), nats (log scale)", title="Quality lost")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8)
    return axes


def plot_speculation(draft_lengths, acceptance, measured, predicted, axes=None, label: str = "prompt lookup"):
    """Acceptance rate, and measured against predicted speedup, both against the draft length k."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    left, right = axes
    left.plot(draft_lengths, acceptance, marker="o", label=label)
    left.set(xlabel="draft length k (tokens)", ylabel="acceptance rate (fraction of drafts kept)", ylim=(0, 1.05),
             title="How many drafts the model keeps")
    right.plot(draft_lengths, measured, marker="o", label="measured")
    right.plot(draft_lengths, predicted, marker="s", ls="--", label="predicted from the acceptance rate")
    right.axhline(1.0, color="grey", lw=1, ls=":")
    right.set(xlabel="draft length k (tokens)", ylabel="speedup over plain decoding (x)", title="Speedup")
    right.legend(fontsize=8)
    return axes


def plot_peak_memory(lengths, plain_bytes, tiled_bytes, ax=None):
    """Peak extra memory of one attention call against the prompt length, plain and tiled, log-log."""
    ax = _axes(ax)
    ax.loglog(lengths, [b / 1e6 for b in plain_bytes], marker="o", label="plain: the whole score matrix")
    ax.loglog(lengths, [b / 1e6 for b in tiled_bytes], marker="s", label="tiled: one tile of scores at a time")
    ax.set(xlabel="prompt length (tokens)", ylabel="peak extra memory (MB)", title="Attention memory, one layer")
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
