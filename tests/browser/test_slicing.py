"""The widget slice (tests/browser/slicing.py) keeps what the widget's cell reads, transitively, and nothing else.

No browser: these run with the unit tests. The browser tests then run the slices for real, so a slice that missed
a name would fail there with a NameError.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slicing import needed_statements, reads_and_binds, write_widget_slice

ROOT = Path(__file__).resolve().parents[2]

CELLS = [
    "%matplotlib inline\nimport torch\nimport numpy as np",
    "loaded = torch.zeros(3)  # the model\nslow = [loaded.sum() for _ in range(10**6)]  # a measurement",
    "tok = loaded.tolist()\ntok.append(1)  # in place: binds nothing",
    "text = 'first'\n@staticmethod\ndef helper(x, *rest):\n    local = x + len(rest)\n    return local\n",
    "text = helper(2) * 'b'  # rebinds text: the last definer above the widget wins\nunused = np.ones(2)",
    "view = Widget(tok, text, [t for t in tok], key=lambda k: k)\nview",
]


def test_the_slice_follows_names_through_cells_and_leaves_measurements_out():
    kept = needed_statements(CELLS, 5)
    assert kept == {0: [0], 1: [0], 2: [0], 3: [1], 4: [0], 5: [0, 1]}
    # left out: numpy (only `unused` reads it), the measurement `slow`, the in-place append, the first `text`


def test_reads_skip_comprehension_lambda_and_def_locals_and_builtins():
    reads, binds = reads_and_binds(CELLS[5])
    assert reads == {"Widget", "tok", "text"}  # not t, not k, not view (bound by the line above)
    reads, binds = reads_and_binds(CELLS[3])
    assert binds == {"text", "helper"} and "local" not in binds and "staticmethod" not in reads
    assert reads_and_binds("import a.b as c, d.e")[1] == {"c", "d"}


def test_the_last_definer_above_wins():
    cells = ["x = 1", "x = 2\ny = x", "use(y)"]
    assert needed_statements(cells, 2) == {1: [0, 1], 2: [0]}


def test_a_marker_must_name_exactly_one_cell(tmp_path):
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
                    for s in ["a = 1", "W(a)", "W(a) + 1"]], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(nb))
    with pytest.raises(ValueError, match="2 code cells contain 'W\\(a\\)'"):
        write_widget_slice(path, "W(a)", tmp_path / "out.ipynb")
    assert write_widget_slice(path, "W(a) +", tmp_path / "out.ipynb") == {0: 1, 2: 1}
    written = json.loads((tmp_path / "out.ipynb").read_text())["cells"]
    assert [c["source"] for c in written[1:]] == ["a = 1", "W(a) + 1"]


@pytest.mark.parametrize("notebook, marker, must_skip", [
    ("05_generation.ipynb", "Stepper(loaded", "trace_greedy("),  # C8's check, call by call
    ("08_serving.ipynb", "SchedulerWidget(", "calibrate("),
])
def test_the_real_slices_leave_the_measurements_out(tmp_path, notebook, marker, must_skip):
    write_widget_slice(ROOT / "notebooks" / notebook, marker, tmp_path / "slice.ipynb")
    sources = "\n".join("".join(c["source"]) for c in json.loads((tmp_path / "slice.ipynb").read_text())["cells"])
    assert marker in sources and "load_model(" in sources
    assert must_skip in (ROOT / "notebooks" / notebook).read_text()  # the notebook has it; the slice does not
    assert must_skip not in sources
