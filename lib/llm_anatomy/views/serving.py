"""Pictures of serving: the pool's blocks over time, batch slots over time, decode speed over batch x context, and
the scheduler widget's HTML. Pure matplotlib and HTML, no ipywidgets."""

from __future__ import annotations

import html

import numpy as np

from ..errors import CourseError

FREE = -1  # a block nobody holds
SHARED = -2  # a block held by more than one owner
CACHED = -3  # a block that only the prefix cache holds (kept for later requests)
_FIXED = {FREE: "#ffffff", SHARED: "#212121", CACHED: "#bdbdbd"}


def colour_of(owner: int) -> str:
    """The colour of a request id (or FREE, SHARED, CACHED) as '#rrggbb', the same in every picture."""
    if owner in _FIXED:
        return _FIXED[owner]
    import matplotlib

    r, g, b, _ = matplotlib.colormaps["tab20"]((owner * 2 + owner // 10) % 20)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def block_table_grid(history, num_blocks: int | None = None) -> np.ndarray:
    """Snapshots of block tables -> `[steps, num_blocks]` int array of who holds each block, for a coloured grid.

    history: a list of (step, block_tables), block_tables being a list of block-id lists (the owner is
    the list's index, e.g. a copy of cache.block_tables) or a dict owner id -> block ids.
    Each cell is the owner id, FREE (-1) for a block nobody holds, SHARED (-2) for one held by several.
    num_blocks defaults to the highest block id seen + 1.
    """
    snapshots = [dict(enumerate(tables)) if isinstance(tables, (list, tuple)) else dict(tables)
                 for _, tables in history]
    seen = [b for snap in snapshots for blocks in snap.values() for b in blocks]
    if num_blocks is None:
        num_blocks = max(seen, default=-1) + 1
    if seen and (min(seen) < 0 or max(seen) >= num_blocks):
        raise CourseError(f"Block ids must be from 0 to num_blocks - 1 = {num_blocks - 1}; "
                          f"got {min(seen)} to {max(seen)}.")
    grid = np.full((len(snapshots), num_blocks), FREE, dtype=np.int64)  # [steps, num_blocks]
    for row, snap in zip(grid, snapshots):
        for owner, blocks in snap.items():
            for b in blocks:
                row[b] = owner if row[b] in (FREE, owner) else SHARED
    return grid


def block_grid(history, num_blocks: int) -> np.ndarray:
    """`[iterations, num_blocks]` owner of each block after each iteration (request id, FREE, SHARED or CACHED).

    history: ContinuousScheduler.history, entries (step, {request id: block table}, cached block ids).
    """
    grid = block_table_grid([(entry[0], entry[1]) for entry in history], num_blocks)
    for row, entry in zip(grid, history):
        for block in (entry[2] if len(entry) > 2 else []):
            if row[block] == FREE:
                row[block] = CACHED
    return grid


def plot_block_grid(history, num_blocks: int, ax=None, title: str | None = None):
    """The pool over time: a row per iteration, a column per block, coloured by the request that holds it."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    grid = block_grid(history, num_blocks)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4))
    image = np.array([[to_rgb(colour_of(int(v))) for v in row] for row in grid])  # [iterations, blocks, 3]
    ax.imshow(image, aspect="auto", interpolation="nearest",
              extent=(-0.5, num_blocks - 0.5, len(grid) + 0.5, 0.5))
    ax.set(xlabel="block id in the pool", ylabel="iteration (scheduler step)",
           title=title or "Who holds each KV block, step by step")
    owners = sorted({int(v) for v in grid.flat if v >= 0})
    handles = [Patch(facecolor=colour_of(o), label=f"request {o}") for o in owners[:12]]
    present = {int(v) for v in grid.flat}  # only the kinds the drawing shows get a legend entry
    handles += [Patch(facecolor=colour_of(k), edgecolor="grey", label=n)
                for k, n in ((SHARED, "shared"), (CACHED, "prefix cache only"), (FREE, "free")) if k in present]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax


def plot_gantt(requests, ax=None, title: str | None = None):
    """Batch slots over time: each request's stay in a slot, pale while it waits for its first token, full colour
    while it produces tokens, and hatched grey while a finished request still holds its row (static batching)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3))
    for r in requests:
        first = r.token_times[0] if r.token_times else None
        for slot, start, end in r.spans:
            done = min(end, r.finished_s) if r.finished_s is not None else end
            first_in = start if first is None else min(max(first, start), done)
            ax.barh(slot, first_in - start, left=start, color=colour_of(r.id), alpha=0.35, edgecolor="none")
            ax.barh(slot, done - first_in, left=first_in, color=colour_of(r.id), edgecolor="white", lw=0.5)
            if end > done:
                ax.barh(slot, end - done, left=done, color="#eeeeee", hatch="///", edgecolor="#9e9e9e", lw=0)
            if done - start > 0:
                ax.text((start + done) / 2, slot, str(r.id), ha="center", va="center", fontsize=7)
    slots = max((slot for r in requests for slot, _, _ in r.spans), default=0)
    ax.set_yticks(range(slots + 1))
    ax.set(xlabel="time on the scheduler's clock (s)", ylabel="batch slot", title=title or "Batch slots over time")
    ax.invert_yaxis()
    return ax


def plot_decode_heatmap(speeds, batches, contexts, crossover_tokens: float, ax=None, title: str | None = None):
    """Decode tokens/s (all rows) over batch x context, with the line where the KV cache's bytes equal the weights'.

    speeds: `[len(batches), len(contexts)]` tokens/s, NaN where not measured. crossover_tokens: batch x context at
    which one step reads as many bytes of cache as of weights (weight bytes / KV bytes per token).
    """
    import matplotlib.pyplot as plt

    speeds = np.asarray(speeds, dtype=float)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    shown = ax.imshow(speeds, origin="lower", aspect="auto", cmap="viridis")
    for (i, j), v in np.ndenumerate(speeds):
        ax.text(j, i, "-" if np.isnan(v) else f"{v:,.0f}", ha="center", va="center", fontsize=8,
                color="grey" if np.isnan(v) else ("white" if v < np.nanmax(speeds) / 2 else "black"))
    ax.set_xticks(range(len(contexts)), [f"{c:,}" for c in contexts])
    ax.set_yticks(range(len(batches)), [str(b) for b in batches])
    # the line batch x context = crossover, in cell coordinates (the axes are spaced by powers)
    b_fine = np.geomspace(batches[0], batches[-1], 100)
    x = np.interp(np.log(crossover_tokens / b_fine), np.log(contexts), np.arange(len(contexts)), left=np.nan,
                  right=np.nan)
    y = np.interp(np.log(b_fine), np.log(batches), np.arange(len(batches)))
    ax.plot(x, y, color="red", lw=2, label=f"cache bytes = weight bytes ({crossover_tokens:,.0f} tokens)")
    ax.set(xlabel="context per sequence (tokens)", ylabel="batch (sequences)", title=title or "Decode tokens/s")
    ax.legend(fontsize=7, loc="lower left")
    plt.colorbar(shown, ax=ax, label="decode tokens/s, all sequences")
    return ax


# --------------------------------------------------------------------------- the widget's HTML

_STATE_COLOUR = {"waiting": "#9e9e9e", "prefilling": "#fb8c00", "decoding": "#1e88e5", "finished": "#43a047"}


def request_state(request, admission=None) -> str:
    """'waiting', 'prefilling', 'decoding' or 'finished' for a request of a ContinuousScheduler, given its admission
    (scheduler.admission_of(request); None while it waits)."""
    if request.finished_s is not None:
        return "finished"
    if admission is None:
        return "waiting"
    return "decoding" if admission.pending <= 1 else "prefilling"


def scheduler_html(scheduler, max_finished: int = 8) -> str:
    """The pool as a row of blocks coloured by owner, a summary line, and one line per request."""
    alloc = scheduler.pool.allocator
    owners: dict[int, list[int]] = {}
    for a in scheduler.running:
        for b in a.blocks:
            owners.setdefault(b, []).append(a.request.id)
    cached = scheduler.prefix_cache.blocks() if scheduler.prefix_cache is not None else set()
    cells = []
    for b in range(alloc.num_blocks):
        who = owners.get(b, [])
        kind = ("shared" if len(who) > 1 else "used") if who else ("cached" if b in cached else "free")
        colour = colour_of({"shared": SHARED, "cached": CACHED, "free": FREE}.get(kind, who[0] if who else FREE))
        text = ",".join(map(str, who)) if who else ("c" if kind == "cached" else "")
        tip = f"block {b}: {kind}" + (f", held by request {text}" if who else "") + f", refcount {alloc.refcount(b)}"
        fg = "white" if kind in ("shared", "used") else "#555"
        cells.append(f'<div class="la-serving-block la-serving-{kind}" data-block="{b}" title="{html.escape(tip)}" '
                     f'style="width:26px;height:22px;border:1px solid #999;background:{colour};color:{fg};'
                     f'font-size:9px;text-align:center;line-height:22px;overflow:hidden">{text}</div>')
    counts = {k: sum(1 for c in cells if f"la-serving-{k}" in c) for k in ("used", "shared", "cached", "free")}
    stats = scheduler.stats()
    summary = (f"iteration {stats.steps}, clock {stats.now_s:.3f} s; {stats.running} in the batch, "
               f"{stats.waiting} waiting, {stats.finished} finished; blocks: {counts['used']} used, "
               f"{counts['shared']} shared, {counts['cached']} cached, {counts['free']} free of {alloc.num_blocks} "
               f"({scheduler.pool.block_size} positions each)")
    shown = ([(a.request, a) for a in scheduler.running] + [(r, None) for r in scheduler.waiting]
             + [(r, None) for r in list(scheduler.finished)[-max_finished:]])
    rows = []
    for r, a in shown:
        state = request_state(r, a)
        computed, blocks = (a.computed, a.blocks) if a is not None else (0, [])
        rows.append(f'<tr class="la-serving-request la-serving-{state}" data-request="{r.id}">'
                    f'<td><span style="background:{colour_of(r.id)};padding:0 6px">&nbsp;</span> {r.id}</td>'
                    f'<td style="color:{_STATE_COLOUR[state]}"><b>{state}</b></td><td>{len(r.prompt)}</td>'
                    f'<td>{len(r.output)} / {r.max_new_tokens}</td><td>{computed}</td><td>{r.cached}</td>'
                    f'<td>{html.escape(str(blocks))}</td><td>{r.preempted}</td></tr>')
    head = ("<tr><th>request</th><th>state</th><th>prompt</th><th>output</th><th>positions cached</th>"
            "<th>from prefix cache</th><th>block table</th><th>preempted</th></tr>")
    return (f'<div class="la-serving-pool" style="display:flex;flex-wrap:wrap;gap:2px;margin:4px 0">{"".join(cells)}'
            f'</div><div class="la-serving-summary" style="font-size:12px;color:#333">{html.escape(summary)}</div>'
            f'<table style="font-size:12px;border-spacing:12px 1px;text-align:left">{head}{"".join(rows)}</table>')


def plot_load_sweep(rows, capacity_req_s: float, fig=None):
    """Latency against load: TTFT, TPOT, ITL and end-to-end latency at p50 (solid) and p99 (dashed), in ms, against
    the arrival rate as a fraction of the measured capacity, one colour per server (rows: serve.load.load_sweep's)."""
    import matplotlib.pyplot as plt

    if fig is None:
        fig = plt.figure(figsize=(10, 5.5))
    axes = fig.subplots(2, 2, sharex=True).flat
    colours = {"static": "tab:grey", "continuous": "tab:blue"}
    for ax, (key, name) in zip(axes, (("ttft", "TTFT"), ("tpot", "TPOT (mean gap per request)"),
                                      ("itl", "ITL (every gap)"), ("e2e", "end-to-end latency"))):
        for server in sorted({r["server"] for r in rows}, reverse=True):
            mine = sorted((r for r in rows if r["server"] == server), key=lambda r: r["fraction"])
            x = [r["fraction"] for r in mine]
            for pct, style in (("p50", "o-"), ("p99", "s--")):
                ax.plot(x, [1e3 * r[f"{key}_{pct}_s"] for r in mine], style, color=colours.get(server),
                        label=f"{server} {pct}", ms=4)
        ax.axvline(1.0, color="red", lw=0.8, ls=":")
        ax.set(title=name, ylabel="ms")
        ax.set_yscale("log")
    for ax in list(fig.axes)[2:]:
        ax.set_xlabel(f"arrival rate / capacity ({capacity_req_s:.2f} req/s = 1)")
    fig.axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig
