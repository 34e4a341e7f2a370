"""Committed notebooks are clean, carry the Colab badge and set-up cell, and follow the course's shape."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from colab import badge_markdown, setup_cell_source  # noqa: E402  (repository upkeep, not part of the package)

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REPO = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
# An absolute path from someone's machine: /home/..., /Users/..., /root/..., /tmp/..., C:\...
ABSOLUTE = re.compile(r"(?<![\w.:/])(/(home|Users|root|tmp|work|mnt|opt|var)/[\w.-]|[A-Za-z]:\\\\?\w)")
SECTIONS = ["objectives", "prerequisites", "time", "summary", "what this means for developers"]


def _ids(paths):
    return [p.name for p in paths]


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb file"
    for path in NOTEBOOKS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), f"{path.name}: name it NN_topic.ipynb"


@pytest.fixture(params=NOTEBOOKS, ids=_ids(NOTEBOOKS))
def notebook(request):
    path = request.param
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    return path, nb


def test_committed_without_outputs(notebook):
    path, nb = notebook
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {index} has outputs: run `make notebooks`"
            assert cell.execution_count is None, f"{path.name} cell {index} has an execution count"
    assert "widgets" not in nb.metadata, f"{path.name} has saved widget state"


def test_badge_and_colab_setup_cell_come_first(notebook):
    path, nb = notebook
    rel = path.relative_to(ROOT).as_posix()
    assert nb.cells[0].cell_type == "markdown"
    assert nb.cells[0].source.splitlines()[0] == badge_markdown(REPO, rel), f"{path.name}: badge missing or stale"
    assert nb.cells[1].cell_type == "code" and nb.cells[1].source == setup_cell_source(REPO), \
        f"{path.name}: the Colab set-up cell is missing or stale: run `make notebooks`"


def test_no_absolute_paths(notebook):
    path, nb = notebook
    for index, cell in enumerate(nb.cells):
        found = ABSOLUTE.search(cell.source)
        assert not found, f"{path.name} cell {index} has an absolute path: {found.group(0)!r}"


def test_opens_and_closes_as_every_chapter_does(notebook):
    path, nb = notebook
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown").lower()
    for section in SECTIONS:
        assert section in text, f"{path.name} lacks a '{section}' section"


def test_chapters_name_the_claims_they_demonstrate(notebook):
    path, nb = notebook
    if path.name.startswith("00"):
        pytest.skip("the tour demonstrates no claim of its own")
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert re.search(r"\bC\d{1,2}\b", text), f"{path.name} does not say which claims (C1..C12) it demonstrates"


def test_readme_lists_every_notebook():
    readme = (ROOT / "README.md").read_text()
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in readme, f"README's table of contents lacks {path.name}"


def test_the_stamp_tool_finds_nothing_to_change():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "stamp_notebooks.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
