"""Pictures of notebook 10: one block split across TP ranks, a TP step's timeline, an all-reduce's cost against its
size, the pipeline's schedule as a Gantt chart, and the bubble against the number of micro-batches. Matplotlib only."""

from __future__ import annotations

import statistics

COLOURS = {"compute": "#4c72b0", "all_reduce": "#c44e52", "all_gather": "#dd8452", "wait": "#dddddd"}


def plot_block_split(cfg, tp: int, ax=None):
    """One transformer block cut across `tp` ranks: each rank's share of every matrix, and the two all-reduces.

    cfg: the model's ScratchConfig (the whole model's sizes). Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    if ax is None:
        _, ax = plt.subplots(figsize=(12.5, 1.0 + 1.1 * tp))
    d, heads, kv = cfg.head_dim, cfg.num_heads // tp, cfg.num_kv_heads // tp
    width = cfg.intermediate_size // tp
    steps = [("x [tokens, %d]\nwhole, on\nevery rank" % cfg.hidden_size, None),
             ("q, k, v: columns\nquery heads {q0}-{q1}\n" + ("KV head {k0}" if kv == 1 else "KV heads {k0}-{k1}"),
              "column"),
             ("attention over\nits own heads", None),
             ("o_proj: rows\ninputs {o0}-{o1}\na partial sum", "row"),
             ("all-\nreduce\n1", "reduce"),
             ("gate, up: columns\nwidth {f0}-{f1}\nof %d" % cfg.intermediate_size, "column"),
             ("down: rows\ninputs {f0}-{f1}\na partial sum", "row"),
             ("all-\nreduce\n2", "reduce")]
    colour = {"column": "#c6dbef", "row": "#fdd0a2", None: "#f0f0f0"}
    for r in range(tp):
        y = tp - 1 - r
        names = dict(q0=r * heads, q1=(r + 1) * heads - 1, k0=r * kv, k1=(r + 1) * kv - 1, o0=r * heads * d,
                     o1=(r + 1) * heads * d - 1, f0=r * width, f1=(r + 1) * width - 1)
        ax.text(-0.1, y, f"rank {r}", ha="right", va="center", fontsize=9, weight="bold")
        for i, (text, kind) in enumerate(steps):
            if kind == "reduce":
                continue
            ax.add_patch(FancyBboxPatch((i + 0.05, y - 0.38), 0.9, 0.76, boxstyle="round,pad=0.02",
                                        facecolor=colour[kind], edgecolor="#555555", lw=0.6))
            ax.text(i + 0.5, y, text.format(**names), ha="center", va="center", fontsize=7.5)
    for i, (text, kind) in enumerate(steps):
        if kind == "reduce":
            ax.add_patch(FancyBboxPatch((i + 0.2, -0.45), 0.6, tp - 0.1, boxstyle="round,pad=0.02",
                                        facecolor="#c44e52", edgecolor="none", alpha=0.85))
            ax.text(i + 0.5, (tp - 1) / 2, text, ha="center", va="center", fontsize=8,
                    color="white", weight="bold")
    ax.set_xlim(-0.8, len(steps) + 0.1)
    ax.set_ylim(-0.7, tp - 0.3)
    ax.axis("off")
    ax.set_title(f"One block on {tp} ranks: columns need no talk, rows end in an all-reduce (blue: split by columns, "
                 "orange: by rows)", fontsize=9)
    return ax


def plot_tp_timeline(ranks: list[list[tuple[str, str, float, float]]], ax=None, title: str | None = None):
    """One TP decode step on each rank: compute (blue) against time inside a collective (red: all-reduce, orange:
    all-gather), grey where a rank waits for a CPU core. ranks: each rank's segments (kind, site, start_s, end_s), from collectives.tp_step_timeline."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tp = len(ranks)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.8 + 0.5 * tp))
    for r, segments in enumerate(ranks):
        for kind, _, start, end in segments:
            ax.barh(r, (end - start) * 1e3, left=start * 1e3, height=0.6, color=COLOURS[kind], lw=0)
    ax.set_yticks(range(tp), [f"rank {r}" for r in range(tp)])
    ax.invert_yaxis()
    ax.set_xlabel("time within one decode step (ms)")
    ax.set_title(title or "One TP decode step: computing, and waiting inside the collectives")
    kinds = {kind for segments in ranks for kind, *_ in segments}
    names = (("compute", "computing its share"), ("wait", "waiting for a core"), ("all_reduce", "inside an all-reduce"),
             ("all_gather", "inside the all-gather"))
    ax.legend(handles=[Patch(color=COLOURS[k], label=n) for k, n in names if k in kinds],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax


def plot_link_fit(seconds_by_size: dict[int, list[float]], link, marks: dict[str, int] | None = None, ax=None,
                  title: str | None = None):
    """An all-reduce's time against its size: every repeat (dots), their median (circles) and the fitted line
    latency + bytes / bandwidth; `marks` draws labelled vertical lines at message sizes (bytes). Log-log."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.6))
    sizes = sorted(seconds_by_size)
    for n in sizes:
        ax.plot([n] * len(seconds_by_size[n]), [1e3 * t for t in seconds_by_size[n]], ".", color="#bbbbbb", ms=3)
    ax.plot(sizes, [1e3 * statistics.median(seconds_by_size[n]) for n in sizes], "o", color="#4c72b0",
            label="median of the repeats")
    line = np.geomspace(sizes[0], sizes[-1], 50)
    ax.plot(line, [1e3 * link.seconds(n) for n in line], "-", color="#c44e52",
            label=f"{link.latency_s * 1e3:.3f} ms + bytes / {link.bytes_per_s / 1e9:.2f} GB/s")
    for i, (label, n) in enumerate((marks or {}).items()):
        ax.axvline(n, color="grey", ls=":", lw=1)
        ax.annotate(label, (n, 0.97 - 0.1 * i), xycoords=("data", "axes fraction"), fontsize=7, ha="left",
                    xytext=(3, 0), textcoords="offset points", va="top")
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="one all-reduce (ms)",
           title=title or "What one all-reduce costs here")
    ax.legend(fontsize=7, loc="lower right")
    return ax


def plot_pipeline_gantt(slots: list[tuple[int, int, float, float]], stages: int, ax=None, title: str | None = None):
    """The pipeline's schedule: a row per stage, a bar per micro-batch (numbered), grey where the stage idles.

    slots: (stage, micro-batch, start_s, end_s), from pipeline.schedule. Returns the Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.8 + 0.55 * stages))
    end = max(e for *_, e in slots) * 1e3
    palette = plt.get_cmap("tab10")
    for s in range(stages):
        ax.barh(s, end, color=COLOURS["wait"], height=0.6, lw=0, label="idle: the bubble" if s == 0 else None)
    for s, i, start, stop in slots:
        ax.barh(s, (stop - start) * 1e3, left=start * 1e3, height=0.6, color=palette(i % 10), edgecolor="white")
        ax.text((start + stop) / 2 * 1e3, s, str(i), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "Pipeline schedule: micro-batches (numbered) flowing through the stages")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax


def plot_bubble(measured: dict[int, list[float]], stages: int, ax=None):
    """The bubble against the number of micro-batches: every measured run (dots), their median, and
    (p - 1) / (m + p - 1). measured: {micro-batches: [bubble of each run]}. Returns the Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    ms = sorted(measured)
    for m in ms:
        ax.plot([m] * len(measured[m]), [100 * b for b in measured[m]], ".", color="#bbbbbb")
    ax.plot(ms, [100 * statistics.median(measured[m]) for m in ms], "o", color="#4c72b0", label="measured (median)")
    grid = [m / 4 for m in range(4, 4 * ms[-1] + 1)]
    ax.plot(grid, [100 * (stages - 1) / (m + stages - 1) for m in grid], "-", color="#c44e52",
            label="(p - 1) / (m + p - 1)")
    ax.set(xlabel="micro-batches m", ylabel="time each stage idles (%)", ylim=(0, 100 * (stages - 1) / stages + 10),
           title=f"The bubble of {stages} stages")
    ax.set_xticks(ms)
    ax.legend(fontsize=7)
    return ax
