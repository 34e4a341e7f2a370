"""The first code cell of every notebook installs the course in Colab, and only there.

Colab is simulated: a fake `google.colab` module, and a recorder instead of subprocess.run,
so no network is used.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _setup_source(path: Path) -> str:
    return nbformat.read(path, as_version=4).cells[1].source


def _run_cell(source: str, monkeypatch, tmp_path, in_colab: bool, installed: bool = False):
    """Run the set-up cell as Colab (or plain Jupyter) would; return the commands it ran."""
    import importlib.util

    calls = []
    real_find_spec = importlib.util.find_spec
    if not installed:  # a fresh Colab runtime: the course is not importable yet
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "llm_anatomy" else real_find_spec(name, *a))

    def fake_run(cmd, check=False, **kwargs):
        calls.append(list(cmd))
        if cmd[:2] == ["git", "clone"]:  # what a clone would leave behind
            (tmp_path / cmd[-1] / "notebooks").mkdir(parents=True)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(sys, "path", list(sys.path))
    if in_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(source, "setup-cell", "exec"), {})
    return calls


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_outside_colab_the_setup_cell_does_nothing(path, monkeypatch, tmp_path):
    assert _run_cell(_setup_source(path), monkeypatch, tmp_path, in_colab=False) == []
    assert Path.cwd() == tmp_path


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_in_colab_it_clones_and_installs_without_replacing_torch(path, monkeypatch, tmp_path):
    calls = _run_cell(_setup_source(path), monkeypatch, tmp_path, in_colab=True)
    assert calls[0][:5] == ["git", "clone", "--depth", "1", "--branch"]
    assert calls[0][-2].startswith("https://github.com/")
    pip = calls[1]
    assert pip[1:4] == ["-m", "pip", "install"]
    assert "llm-anatomy/requirements.txt" in pip and "-e" in pip
    assert not any(arg.startswith("torch") for arg in pip), "must not ask for a torch of its own"
    nodeps = calls[2]  # xgrammar without triton: Colab's torch brings its own
    assert nodeps[1:5] == ["-m", "pip", "install", "-q"] and "--no-deps" in nodeps
    assert "llm-anatomy/requirements-nodeps.txt" in nodeps and len(calls) == 3
    assert Path.cwd() == tmp_path / "llm-anatomy" / "notebooks"
    assert str(tmp_path / "llm-anatomy" / "lib") in sys.path


def test_requirements_leave_colabs_torch_alone():
    lines = [l.split("#")[0].strip() for l in (ROOT / "requirements.txt").read_text().splitlines()]
    torch_lines = [l for l in lines if l.startswith("torch")]
    assert torch_lines == ["torch>=2.4"], "a range Colab's torch satisfies, never a pin"


def test_a_second_run_in_colab_installs_nothing(monkeypatch, tmp_path):
    source = _setup_source(NOTEBOOKS[0])
    assert _run_cell(source, monkeypatch, tmp_path, in_colab=True, installed=True) == []


def test_an_existing_clone_is_installed_not_cloned_again(monkeypatch, tmp_path):
    (tmp_path / "llm-anatomy" / "notebooks").mkdir(parents=True)
    calls = _run_cell(_setup_source(NOTEBOOKS[0]), monkeypatch, tmp_path, in_colab=True)
    assert len(calls) == 2 and all(call[1:4] == ["-m", "pip", "install"] for call in calls)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_the_setup_cell_carries_the_tag_the_book_leaves_it_out_by(path):
    sys.path.insert(0, str(ROOT / "tools"))
    from colab import SETUP_MARKER, SETUP_TAG

    cell = nbformat.read(path, as_version=4).cells[1]
    assert cell.source.startswith(SETUP_MARKER) and cell.metadata.get("tags") == [SETUP_TAG]


def test_stamping_tags_the_setup_cell_once_and_keeps_other_tags():
    sys.path.insert(0, str(ROOT / "tools"))
    import stamp_notebooks
    from colab import SETUP_TAG

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 01 · A chapter"),
                                         nbformat.v4.new_code_cell("print(1)")])
    stamp_notebooks.stamp(nb, "notebooks/01_a.ipynb", "https://github.com/x/y")
    assert nb.cells[1].metadata["tags"] == [SETUP_TAG] and nb.cells[2].metadata.get("tags") is None
    nb.cells[1].metadata["tags"] = ["keep-me", SETUP_TAG]
    stamp_notebooks.stamp(nb, "notebooks/01_a.ipynb", "https://github.com/x/y")  # stamping again changes nothing
    assert nb.cells[1].metadata["tags"] == ["keep-me", SETUP_TAG] and len(nb.cells) == 4  # badge, set-up, two
