"""Committed notebooks are clean, carry the Colab badge and set-up cell, and follow the course's shape."""

from __future__ import annotations

import ast
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


def _discarded_verdicts(source: str) -> list[int]:
    """Lines where a cell calls claim(...) or reading(...) and drops the verdict it returns.

    Jupyter shows only the value of a cell's last top-level expression: any other verdict must be display()ed,
    or the learner never sees the evidence (a failing claim still raises).
    """
    source = "\n".join("" if line.lstrip().startswith(("!", "%")) else line for line in source.splitlines())
    dropped = []

    def walk(body, top):
        for i, statement in enumerate(body):
            shown = top and i == len(body) - 1
            value = statement.value if isinstance(statement, ast.Expr) else None
            calls = [value] if isinstance(value, ast.Call) else [value.body, value.orelse] if isinstance(
                value, ast.IfExp) else []
            if not shown and any(isinstance(c, ast.Call) and getattr(c.func, "id", None) in ("claim", "reading")
                                 for c in calls):
                dropped.append(statement.lineno)
            for part in (getattr(statement, name, None) for name in ("body", "orelse", "finalbody")):
                if isinstance(part, list) and part and isinstance(part[0], ast.stmt):
                    walk(part, False)
            for handler in getattr(statement, "handlers", []):
                walk(handler.body, False)

    walk(ast.parse(source).body, True)
    return dropped


def test_every_claim_verdict_is_shown(notebook):
    path, nb = notebook
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            lines = _discarded_verdicts(cell.source)
            assert not lines, (f"{path.name}, cell {index}, line {lines[0]}: the verdict of claim()/reading() is dropped "
                               "(only a cell's last top-level expression is shown): wrap it in display(...)")


def test_a_dropped_verdict_is_found():
    assert _discarded_verdicts("claim('C1', True, 'x')\nprint(1)") == [1]
    assert _discarded_verdicts("if gpu:\n    reading('C1', 'x')\nelse:\n    print(2)") == [2]
    assert _discarded_verdicts("claim('C1', ok, 'x') if cpu else reading('C1', 'x')\ny = 2") == [1]
    assert _discarded_verdicts("display(claim('C1', True, 'x'))\nprint(1)\nreading('C2', 'y')") == []


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


def _live_hint_calls(source: str) -> list[int]:
    """Lines where a cell calls chNN.hint(...) (or hint(...)) itself: Run All would reveal, and use up, a hint."""
    source = "\n".join("" if line.lstrip().startswith(("!", "%")) else line for line in source.splitlines())
    return sorted(node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                  and (getattr(node.func, "attr", None) == "hint" or getattr(node.func, "id", None) == "hint"))


def test_no_hint_is_revealed_on_run_all(notebook):
    """Hints are opt-in: every hint cell holds the call commented out, for the learner to uncomment."""
    path, nb = notebook
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            lines = _live_hint_calls(cell.source)
            assert not lines, (f"{path.name}, cell {index}, line {lines[0]}: a hint call runs on Run All; comment it "
                               "out: `# chNN.hint(chNN.check_...)  # uncomment for a hint; run again for the next one`")


def test_a_live_hint_call_is_found():
    assert _live_hint_calls("ch01.hint(ch01.check_train)") == [1]
    assert _live_hint_calls("x = 1\nshown = ch05.hint(ch05.check_top_p)") == [2]
    assert _live_hint_calls("# ch01.hint(ch01.check_train)  # uncomment for a hint") == []
    assert _live_hint_calls("ch01.check_train(train)\n%time ch01.hint(ch01.check_train)") == []
