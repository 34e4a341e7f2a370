"""Labels beside scatter points that never print over one another: `place_labels(ax, points, texts)`.

Each label tries a few spots around its point, in order (upper right first), and keeps the first whose rendered
text box overlaps no label already placed, no point but its own, and no legend, and stays inside the axes. A label
with no free spot is left out, and the caller is told which (so the prose can say so, or the figure can grow).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import CourseError

# offsets in points from the data point, with the alignment that keeps the text on that side of it
SPOTS = [((4, 3), "left", "bottom"), ((4, -3), "left", "top"), ((-4, 3), "right", "bottom"),
         ((-4, -3), "right", "top"), ((0, 6), "center", "bottom"), ((0, -6), "center", "top"),
         ((10, 0), "left", "center"), ((-10, 0), "right", "center"), ((12, 10), "left", "bottom"),
         ((-12, -10), "right", "top")]
POINT_PX = 3.0  # half the side of the box kept free around each point (a default scatter marker is about 6 px)


@dataclass
class PlacedLabels:
    """What place_labels did: the annotations it kept (one per placed label) and the texts it left out."""

    placed: list = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def place_labels(ax, points, texts, fontsize: float = 8) -> PlacedLabels:
    """Annotate each point `(x, y)` (data units) with its text where it overprints nothing; returns PlacedLabels.

    Call it after the points, limits and legend are drawn: it renders the figure to measure the text boxes."""
    from matplotlib.transforms import Bbox

    points = [(float(x), float(y)) for x, y in points]
    texts = list(texts)
    if len(points) != len(texts):
        raise CourseError(f"{len(points)} points but {len(texts)} labels: give one label per point.")
    figure = ax.figure
    ax.autoscale_view()  # fixes the limits now (a draw would too, but costs a whole render), so the boxes
    renderer = figure.canvas.get_renderer()  # measured below are those shown
    frame = ax.get_window_extent(renderer)
    screen = ax.transData.transform(points) if points else []
    dots = [Bbox.from_extents(px - POINT_PX, py - POINT_PX, px + POINT_PX, py + POINT_PX) for px, py in screen]
    taken = [legend.get_window_extent(renderer) for legend in [ax.get_legend()] if legend is not None]
    result = PlacedLabels()
    for i, ((x, y), text) in enumerate(zip(points, texts)):
        others = taken + dots[:i] + dots[i + 1:]
        for offset, ha, va in SPOTS:
            label = ax.annotate(text, (x, y), xytext=offset, textcoords="offset points", ha=ha, va=va,
                                fontsize=fontsize)
            box = label.get_window_extent(renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(other) for other in others):
                taken.append(box)
                result.placed.append(label)
                break
            label.remove()
        else:
            result.skipped.append(text)
    return result
