"""views/placing.py: labels beside scatter points never print over one another, a point or the legend; a label
with no free spot is left out and named (checked on the rendered figure's text boxes)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from llm_anatomy.errors import CourseError  # noqa: E402
from llm_anatomy.views.placing import place_labels  # noqa: E402


def _boxes(ax):
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts], renderer


def _scatter(points, labels, legend=False):
    fig, ax = plt.subplots(figsize=(6.5, 5))
    xy = np.array(points, dtype=float)
    ax.scatter(xy[:, 0], xy[:, 1], label="words")
    if legend:
        ax.legend(loc="upper left")
    return ax, place_labels(ax, points, labels)


@pytest.mark.parametrize("seed", [0])
def test_crowded_labels_never_overlap_and_the_left_out_are_named(seed):
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(40, 2)) * 0.3  # forty points in a small cloud: most spots collide
    names = [f"word{i}" for i in range(40)]
    ax, result = _scatter(points.tolist(), names, legend=True)
    boxes, renderer = _boxes(ax)
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            assert not box_a.overlaps(box_b), f"{a!r} prints over {b!r}"
        assert not box_a.overlaps(ax.get_legend().get_window_extent(renderer)), f"{a!r} prints over the legend"
    assert len(result.placed) + len(result.skipped) == 40 and result.skipped  # a cloud this tight cannot hold all
    assert sorted(t.get_text() for t in result.placed) == sorted(set(names) - set(result.skipped))
    plt.close(ax.figure)


def test_a_label_never_covers_another_point():
    points = [(0.0, 0.0), (0.02, 0.02), (1.0, 1.0)]  # the second point sits where the first's label would go
    ax, result = _scatter(points, ["first", "second", "far"])
    _, renderer = _boxes(ax)
    screen = ax.transData.transform(points)
    for label in result.placed:
        box = label.get_window_extent(renderer)
        own = points.index(label.xy)
        for j, (px, py) in enumerate(screen):
            if j != own:
                assert not (box.x0 - 2 <= px <= box.x1 + 2 and box.y0 - 2 <= py <= box.y1 + 2), (label.get_text(), j)
    plt.close(ax.figure)


def test_spread_out_points_keep_every_label_upper_right_first():
    points = [(i, i % 3) for i in range(6)]
    ax, result = _scatter(points, list("abcdef"))
    assert not result.skipped and [t.get_text() for t in result.placed] == list("abcdef")
    assert all(t.get_ha() == "left" and t.get_va() == "bottom" for t in result.placed)
    plt.close(ax.figure)


def test_one_label_per_point():
    fig, ax = plt.subplots()
    with pytest.raises(CourseError, match="one label per point"):
        place_labels(ax, [(0, 0), (1, 1)], ["only one"])
    plt.close(fig)


def test_the_scatters_of_notebooks_00_to_04_place_their_labels_with_it():
    import nbformat
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    scatters = 0
    for path in sorted((root / "notebooks").glob("0[0-4]_*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and ".scatter(" in cell.source:
                scatters += 1
                assert "place_labels(" in cell.source and "annotate(" not in cell.source, path.name
    assert scatters >= 1  # notebook 02's PCA map
