"""The serving pictures: the block grid's cells (from block tables, then from the scheduler's history), the Gantt
bars, the heatmap's line, the widget's HTML."""

from __future__ import annotations

import re

import matplotlib
import numpy as np
import pytest
from llm_anatomy.weights.random import random_llama
import torch

matplotlib.use("Agg")

from llm_anatomy.serve.batching import Request, run_static  # noqa: E402
from llm_anatomy.serve.paged_kv import PagedKVPool  # noqa: E402
from llm_anatomy.serve.scheduler import ContinuousScheduler  # noqa: E402
from llm_anatomy.model.scratch import ScratchLlama  # noqa: E402
from llm_anatomy.errors import CourseError  # noqa: E402
from llm_anatomy.views.serving import (CACHED, FREE, SHARED, block_grid, block_table_grid, colour_of,  # noqa: E402
                                       plot_block_grid, plot_decode_heatmap, plot_gantt, plot_load_sweep, request_state,
                                       scheduler_html)

COST = lambda tokens, rows, **_: 0.01 + 0.001 * tokens  # noqa: E731


@pytest.fixture(scope="module")
def tiny():
    return ScratchLlama.from_hf(random_llama())


def test_block_table_grid_marks_owner_free_and_shared():
    history = [
        (0, [[0, 1], []]),
        (1, [[0, 1], [0, 1]]),  # sequence 1 forked from 0: both blocks shared
        (2, [[0, 1, 3], [0, 2]]),  # copy-on-write: 1 gave its copy of block 1 up for block 2
        (3, {5: [4]}),  # a dict snapshot: owner ids need not be indices
    ]
    grid = block_table_grid(history)
    expected = np.array([[0, 0, FREE, FREE, FREE],
                         [SHARED, SHARED, FREE, FREE, FREE],
                         [SHARED, 0, 1, 0, FREE],
                         [FREE, FREE, FREE, FREE, 5]])
    assert grid.shape == (4, 5) and grid.dtype.kind == "i"
    np.testing.assert_array_equal(grid, expected)
    assert block_table_grid(history[:1], num_blocks=8).shape == (1, 8)
    with pytest.raises(CourseError):
        block_table_grid(history, num_blocks=3)


def test_block_table_grid_from_a_real_recording(tiny):
    pool = PagedKVPool.for_model(tiny, num_blocks=6, block_size=2)
    cache = pool.new_cache(1)
    history = []
    ids = torch.tensor([[5, 6, 7]])
    for step in range(3):
        ids = tiny(ids, cache)[:, -1:].argmax(-1)
        history.append((step, [list(t) for t in cache.block_tables]))
    grid = block_table_grid(history, num_blocks=pool.num_blocks)
    # lengths 3, 4, 5 -> 2, 2, 3 blocks held by sequence 0; the rest free
    assert (grid == 0).sum(axis=1).tolist() == [2, 2, 3]
    assert (grid == FREE).sum(axis=1).tolist() == [4, 4, 3]


def test_block_grid_marks_owners_shared_cached_and_free():
    history = [(1, {0: [0, 1], 1: [2]}, []), (2, {1: [2, 0], 2: [0]}, [1]), (3, {}, [1, 2])]
    grid = block_grid(history, 4)
    np.testing.assert_array_equal(grid, [[0, 0, 1, FREE], [SHARED, CACHED, 1, FREE], [FREE, CACHED, CACHED, FREE]])
    assert len({colour_of(v) for v in (0, 1, 2, FREE, SHARED, CACHED)}) == 6
    assert colour_of(3) == colour_of(3) and re.fullmatch(r"#[0-9a-f]{6}", colour_of(17))


def test_plots_draw_and_label_their_axes(tiny):
    import matplotlib.pyplot as plt

    reqs = [Request([5, 6, 7], n, arrival_s=0.01 * i) for i, n in enumerate([1, 6, 2, 3])]
    static = run_static(tiny, reqs, max_batch=2, cost=COST)
    ax = plot_gantt(static)
    assert "(s)" in ax.get_xlabel() and ax.get_ylabel() == "batch slot"
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert hatched, "a finished request holding its static row is drawn hatched"
    sched = ContinuousScheduler(tiny, PagedKVPool.for_model(tiny, 16, 4), max_batch=2, prefix_cache=True, cost=COST)
    sched.run(reqs)
    ax = plot_block_grid(sched.history, 16)
    assert ax.get_xlabel() == "block id in the pool" and "iteration" in ax.get_ylabel()
    assert ax.images[0].get_array().shape == (len(sched.history), 16, 3)
    speeds = np.array([[10.0, 9.0, 8.0], [35.0, 25.0, np.nan]])
    ax = plot_decode_heatmap(speeds, [1, 4], [256, 1024, 4096], 2000.0)
    assert "tokens" in ax.get_xlabel() and "sequences" in ax.get_ylabel()
    line = ax.lines[0]
    x, y = line.get_xdata(), line.get_ydata()
    ok = ~np.isnan(x)
    assert ok.any()
    # along the line, batch x context stays 2000 tokens (cell coordinates back to values on the power axes)
    batch = np.exp(np.interp(y[ok], [0, 1], np.log([1, 4])))
    context = np.exp(np.interp(x[ok], [0, 1, 2], np.log([256, 1024, 4096])))
    np.testing.assert_allclose(batch * context, 2000.0, rtol=1e-6)
    assert [t.get_text() for t in ax.texts][-1] == "-"  # the cell not measured
    plt.close("all")


def test_scheduler_html_shows_blocks_requests_and_states(tiny):
    sched = ContinuousScheduler(tiny, PagedKVPool.for_model(tiny, 8, 4), max_batch=1, max_batched_tokens=4,
                                prefix_cache=True, cost=COST)
    a = sched.submit(Request([5, 6, 7, 8, 9, 10], 2))
    b = sched.submit(Request([5, 6, 7, 8, 11], 2))
    state = lambda r: request_state(r, sched.admission_of(r))  # noqa: E731
    assert [state(a), state(b)] == ["waiting", "waiting"]
    html = scheduler_html(sched)
    assert html.count('class="la-serving-block la-serving-free"') == 8 and "la-serving-summary" in html
    sched.step()  # a: admitted, its first chunk of 4 prompt tokens
    assert state(a) == "prefilling" and state(b) == "waiting"
    html = scheduler_html(sched)
    assert html.count("la-serving-block la-serving-used") == 1 and 'data-request="0"' in html
    assert "iteration 1" in html and "1 in the batch, 1 waiting" in html
    sched.step()  # the rest of the prompt: the first token
    assert state(a) == "decoding"
    while sched.step():
        pass
    assert state(a) == state(b) == "finished"
    html = scheduler_html(sched)
    assert html.count("la-serving-block la-serving-cached") == len(sched.prefix_cache) >= 1
    assert re.search(r'title="block \d+: cached, refcount 1"', html)
    assert b.cached == 4  # b found a's first block in the cache


def test_the_load_sweep_draws_four_latencies_p50_and_p99_per_engine_against_the_load():
    rows = [{"fraction": f, "server": s, **{f"{k}_{p}_s": f * (2 if s == "static" else 1) * (3 if p == "p99" else 1)
                                            for k in ("ttft", "tpot", "itl", "e2e") for p in ("p50", "p99")}}
            for f in (0.3, 0.7, 1.2) for s in ("static", "continuous")]
    fig = plot_load_sweep(rows, 2.5)
    assert [ax.get_title() for ax in fig.axes] == ["TTFT", "TPOT (mean gap per request)", "ITL (every gap)",
                                                   "end-to-end latency"]
    first = fig.axes[0]
    assert len(first.get_lines()) == 5  # 2 engines x (p50, p99) and the capacity line
    static_p99 = next(line for line in first.get_lines() if line.get_label() == "static p99")
    assert list(static_p99.get_ydata()) == pytest.approx([1e3 * 0.3 * 6, 1e3 * 0.7 * 6, 1e3 * 1.2 * 6])
    assert "2.50 req/s" in fig.axes[-1].get_xlabel() and first.get_ylabel() == "ms"
    matplotlib.pyplot.close(fig)


def test_the_block_grids_legend_names_only_the_kinds_it_draws():
    from llm_anatomy.views.serving import CACHED, FREE, SHARED, block_grid

    history = [(0, {0: [0, 1]}), (1, {0: [0, 1], 1: [2]})]  # two requests, nothing shared, nothing cached
    ax = plot_block_grid(history, 4)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["request 0", "request 1", "free"]
    ax = plot_block_grid([(0, {0: [0], 1: [0]}, [1])], 3)  # block 0 held by two, block 1 kept by the prefix cache
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["shared", "prefix cache only", "free"]
    assert {int(v) for v in block_grid([(0, {0: [0], 1: [0]}, [1])], 3).flat} == {SHARED, CACHED, FREE}
    import matplotlib.pyplot as plt

    plt.close("all")
