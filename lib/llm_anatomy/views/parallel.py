"""Pictures of notebook 10: one block split across TP ranks, a TP step's timeline, an all-reduce's cost against its
size, the pipeline's schedule as a Gantt chart, and the bubble against the number of micro-batches. Matplotlib only."""

from __future__ import annotations

import statistics

from ..errors import CourseError

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


MEASURED_PARTS = (("compute", "outside the collectives (computing)", "#4c72b0"),
                  ("attention", "the all-reduces after attention", "#c44e52"),
                  ("mlp", "the all-reduces after the MLP", "#8c1c2c"),
                  ("ends", "the embedding's all-reduce and the logits' all-gather", "#dd8452"))


def _step_parts(step_s: float, calls: list[tuple[str, str, int, float]]) -> dict[str, float]:
    """A step's seconds by part: inside each site's collectives (embedding and logits together), the rest computing."""
    parts = {"attention": 0.0, "mlp": 0.0, "ends": 0.0}
    for _, site, _, seconds in calls:
        parts[site if site in parts else "ends"] += seconds
    return {"compute": max(step_s - sum(parts.values()), 0.0), **parts}


def plot_tp_measured(steps_s: list[float], calls: list[list[tuple[str, str, int, float]]], link, compute_s: float,
                     title: str | None = None):
    """One measured TP decode step, next to its prediction. Left: a bar per rank (the step as it timed it: inside
    each kind of collective, the rest computing) and one for the prediction (compute_s plus link.seconds of the same
    collectives); right: every collective of the step on rank 0, by layer, against the fitted latency + bytes.
    steps_s: each rank's step, seconds; calls: each rank's collectives of that step (op, site, bytes, seconds), as
    runs.cost_run returns them ("last_step"). Returns the two axes."""
    import matplotlib.pyplot as plt
    from matplotlib import ticker
    from matplotlib.patches import Patch

    if not calls or len(steps_s) != len(calls):
        raise CourseError("plot_tp_measured needs one step time and one list of collectives per rank.")
    fig, (bars, each) = plt.subplots(1, 2, figsize=(12, 3.4), gridspec_kw={"width_ratios": [3, 2]})
    predicted = _step_parts(0.0, [(op, site, n, link.seconds(n)) for op, site, n, _ in calls[0]])
    predicted["compute"] = compute_s
    rows = [("predicted", predicted)] + [(f"rank {r}, measured", _step_parts(t, c))
                                          for r, (t, c) in enumerate(zip(steps_s, calls))]
    for y, (_, parts) in enumerate(rows):
        left = 0.0
        for key, _, colour in MEASURED_PARTS:
            bars.barh(y, parts[key] * 1e3, left=left, height=0.6, color=colour, lw=0)
            left += parts[key] * 1e3
        bars.annotate(f"{left:.1f} ms", (left, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    bars.set_yticks(range(len(rows)), [name for name, _ in rows])
    bars.invert_yaxis()
    bars.set_xlim(0, 1.18 * max(sum(p.values()) for _, p in rows) * 1e3)
    bars.set_xlabel("one decode step (ms)")
    bars.set_title(title or "One TP decode step: where its time went")
    bars.legend(handles=[Patch(color=c, label=n) for _, n, c in MEASURED_PARTS], fontsize=7, ncol=2,
                loc="upper center", bbox_to_anchor=(0.5, -0.3))
    layer_calls = {site: [s * 1e3 for _, where, _, s in calls[0] if where == site] for site in ("attention", "mlp")}
    for (site, times), marker, colour in zip(layer_calls.items(), "os", ("#c44e52", "#8c1c2c")):
        each.plot(range(len(times)), times, marker, color=colour, ms=4,
                  label=f"after {'the MLP' if site == 'mlp' else site}")
    nbytes = calls[0][0][2]
    each.axhline(link.seconds(nbytes) * 1e3, color="grey", ls="--", lw=1,
                 label=f"fitted: {link.seconds(nbytes) * 1e3:.3f} ms")
    each.set(yscale="log", xlabel="layer", ylabel="one all-reduce (ms, log scale)",
             title="The blocks' all-reduces of that step, rank 0")
    each.yaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
    each.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    each.yaxis.set_minor_formatter(ticker.NullFormatter())
    each.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3)
    fig.tight_layout()
    return bars, each


def plot_link_fit(seconds_by_size: dict[int, list[float]], link, marks: dict[str, int] | None = None, ax=None,
                  title: str | None = None, fitted_to: str = "the medians"):
    """An all-reduce's time against its size: every repeat (dots), their median (circles) and the fitted line
    latency + bytes / bandwidth, its legend naming the points it was fitted to (`fitted_to`: fit_link's pick);
    `marks` draws labelled vertical lines at message sizes (bytes), each label left of its line in a band below
    every point, where no repeat can sit on it; the legend goes under the axes for the same reason. Log-log."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.6))
    sizes = sorted(seconds_by_size)
    for i, n in enumerate(sizes):
        ax.plot([n] * len(seconds_by_size[n]), [1e3 * t for t in seconds_by_size[n]], ".", color="#bbbbbb", ms=3,
                label="each repeat" if i == 0 else None)
    ax.plot(sizes, [1e3 * statistics.median(seconds_by_size[n]) for n in sizes], "o", color="#4c72b0",
            label="median of the repeats")
    line = np.geomspace(sizes[0], sizes[-1], 50)
    ax.plot(line, [1e3 * link.seconds(n) for n in line], "-", color="#c44e52",
            label=f"fitted to {fitted_to}: {link.latency_s * 1e3:.3f} ms + bytes / {link.bytes_per_s / 1e9:.2f} GB/s")
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="one all-reduce (ms)",
           title=title or "What one all-reduce costs here")
    rows = 0.065  # one label's height, as a fraction of the axes'
    if marks:  # a free band under the lowest point or line, a row per mark, for the marks' labels
        low = 1e3 * min(min(min(t) for t in seconds_by_size.values()), link.seconds(sizes[0]))
        top, band = ax.get_ylim()[1], 0.02 + rows * len(marks)
        ax.set_ylim(low / (top / low) ** (band / (1 - band)) / 1.1, top)
    renderer, placed = ax.figure.canvas.get_renderer(), []
    box = ax.get_window_extent(renderer)
    for label, n in (marks or {}).items():
        ax.axvline(n, color="grey", ls=":", lw=1)
        text = ax.annotate(label, (n, 0.02), xycoords=("data", "axes fraction"), fontsize=7, ha="right", va="bottom",
                           xytext=(-4, 0), textcoords="offset points")  # left of its dotted line, below every point
        if text.get_window_extent(renderer).x0 < box.x0 + 0.03 * box.width:  # no room left of it: to its right
            text.set(ha="left", position=(4, 0))
        row = 0
        # a row up while it would touch a label already placed (a margin: at a lower dpi the glyphs come out wider)
        while any(text.get_window_extent(renderer).expanded(1.25, 1).overlaps(other) for other in placed):
            row += 1
            text.xy = (n, 0.02 + rows * row)
        placed.append(text.get_window_extent(renderer).expanded(1.25, 1))
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
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


def plot_bubble(measured: dict[int, list[float]], stages: int, ax=None, fastest: dict[int, float] | None = None):
    """The bubble against the number of micro-batches: every measured run (dots), their median, and
    (p - 1) / (m + p - 1). measured: {micro-batches: [bubble of each run]}; fastest: {micro-batches: bubble of the
    run the printed lines read}, drawn instead of the median so that the plot and the lines show the same run.
    Returns the Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    ms = sorted(measured)
    for m in ms:
        ax.plot([m] * len(measured[m]), [100 * b for b in measured[m]], ".", color="#bbbbbb",
                label="each run" if m == ms[0] else None)
    if fastest is None:
        ax.plot(ms, [100 * statistics.median(measured[m]) for m in ms], "o", color="#4c72b0", label="measured (median)")
    else:
        ax.plot(ms, [100 * fastest[m] for m in ms], "o", color="#4c72b0", label="the fastest run (the lines below)")
    grid = [m / 4 for m in range(4, 4 * ms[-1] + 1)]
    ax.plot(grid, [100 * (stages - 1) / (m + stages - 1) for m in grid], "-", color="#c44e52",
            label="(p - 1) / (m + p - 1)")
    top = max(100 * (stages - 1) / stages + 10, 105 * max(map(max, measured.values())))  # every run on the plot
    ax.set(xlabel="micro-batches m", ylabel="time each stage idles (%)", ylim=(0, min(100, top)),
           title=f"The bubble of {stages} stages")
    ax.set_xticks(ms)
    ax.legend(fontsize=7)
    return ax
