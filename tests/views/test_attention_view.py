"""The GQA picture of notebook 03: 9 query heads, 3 key/value heads, the grouping h // 3, labels that do not
overprint (checked on the rendered figure's text boxes)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from llm_anatomy.errors import CourseError  # noqa: E402
from label_boxes import assert_apart, labels_inside, rendered_labels  # noqa: E402

from llm_anatomy.views.attention import draw_gqa_shapes  # noqa: E402

Q, KV = (1, 9, 12, 64), (1, 3, 12, 64)  # SmolLM2-135M's layer on a 12-token prompt


def _render(drawn):
    drawn.ax.figure.canvas.draw()
    return drawn.ax.figure.canvas.get_renderer()


def test_nine_query_heads_three_kv_heads_and_nine_score_slabs_with_their_shapes():
    drawn = draw_gqa_shapes(Q, KV)
    kinds = [kind for kind, _ in drawn.boxes]
    assert (kinds.count("q"), kinds.count("kv"), kinds.count("scores")) == (9, 3, 9)
    texts = {t.get_text() for t in drawn.ax.texts}
    for shape in ("[1, 9, seq, 64]", "[1, 3, seq, 64]", "[1, 9, seq, seq]"):
        assert any(shape in t for t in texts), shape
    assert any("seq = 12" in t for t in texts)
    plt.close(drawn.ax.figure)


def test_query_head_h_is_joined_to_kv_head_h_floor_3_not_h_mod_3():
    drawn = draw_gqa_shapes(Q, KV)
    read = {q[1]: kv[1] for q, kv in drawn.edges if q[0] == "q"}
    assert read == {h: h // 3 for h in range(9)}
    assert read != {h: h % 3 for h in range(9)}
    assert {(kv[1], s[1]) for kv, s in drawn.edges if kv[0] == "kv"} == {(h // 3, h) for h in range(9)}
    # each drawn line starts on its query head's slab and ends on the K/V head's slab
    renderer = _render(drawn)
    lines = [line for line in drawn.ax.lines]
    assert len(lines) == len(drawn.edges) == 18
    for line, (start, end) in zip(lines, drawn.edges):
        (x0, x1), (y0, y1) = line.get_xdata(), line.get_ydata()
        for (x, y), name in [((x0, y0), start), ((x1, y1), end)]:
            patch = drawn.boxes[name]
            assert patch.get_x() - 0.05 <= x <= patch.get_x() + patch.get_width() + 0.05, (name, x)
            assert patch.get_y() <= y <= patch.get_y() + patch.get_height(), (name, y)
    assert renderer is not None
    plt.close(drawn.ax.figure)


@pytest.mark.parametrize("q, kv", [(Q, KV), ((1, 8, 5, 16), (1, 1, 5, 16)), ((2, 4, 7, 32), (2, 4, 7, 32))])
def test_no_label_prints_over_another_or_out_of_its_slab(q, kv):
    drawn = draw_gqa_shapes(q, kv)
    renderer, labels = rendered_labels(drawn.ax)
    assert_apart(labels)
    for name, patch in drawn.boxes.items():
        inside = labels_inside(patch, labels, renderer, f"{name} slab")
        assert len(inside) == 1, f"the {name} slab has {len(inside)} labels"
        outline = patch.get_window_extent(renderer)
        assert outline.y0 <= inside[0][1].y0 and inside[0][1].y1 <= outline.y1, f"{inside[0][0]!r} spills out"
    plt.close(drawn.ax.figure)


def test_shapes_that_do_not_fit_are_refused_in_one_sentence():
    with pytest.raises(CourseError, match="cannot be shared evenly"):
        draw_gqa_shapes((1, 9, 12, 64), (1, 2, 12, 64))
    with pytest.raises(CourseError, match="same batch, seq and head_dim"):
        draw_gqa_shapes((1, 9, 12, 64), (1, 3, 11, 64))
    with pytest.raises(CourseError, match="batch, heads, seq, head_dim"):
        draw_gqa_shapes((9, 12, 64), (3, 12, 64))
    plt.close("all")
