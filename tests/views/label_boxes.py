"""What the view tests check of a drawn picture's words: none prints over another, and each sits inside its box.

A view returns its axes and its boxes (matplotlib patches by name); the words are the axes' texts, measured as
Agg renders them.
"""

from __future__ import annotations


def rendered_labels(ax) -> tuple[object, list]:
    """(the renderer, [(text, its window extent)] for every non-empty text of `ax`), after one draw."""
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    return renderer, [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if t.get_text().strip()]


def assert_apart(labels) -> None:
    """No two labels' rendered boxes overlap."""
    for i, (a, box_a) in enumerate(labels):
        for b, box_b in labels[i + 1:]:
            assert not box_a.overlaps(box_b), f"{a!r} prints over {b!r}"


def labels_inside(patch, labels, renderer, name: str) -> list:
    """The labels whose centre lies in `patch`; each must lie within its left and right edges."""
    outline = patch.get_window_extent(renderer)
    inside = [(t, e) for t, e in labels if outline.contains((e.x0 + e.x1) / 2, (e.y0 + e.y1) / 2)]
    for text, extent in inside:
        assert outline.x0 <= extent.x0 and extent.x1 <= outline.x1, f"{text!r} spills out of the {name} box"
    return inside
