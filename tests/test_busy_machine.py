"""Notebook 08 tells the same story on a busy machine (issue 23): run with a second process burning one core, its
claims give the same verdicts as in an idle run. The idle run is nbval's own run of the notebook earlier in this
session when there was one (tools/site/capture.py kept it, and puts this test after the notebooks); else this test
runs it idle first. tools/busy_check.py does the work; its verdict reading is checked here on made-up outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import busy_check  # noqa: E402  (repository upkeep, not part of the package)

NOTEBOOK = ROOT / "notebooks" / "08_serving.ipynb"


def _cell(cell_id: str, *outputs) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell("")
    cell.id, cell.outputs = cell_id, list(outputs)
    return cell


def _shown(text: str):
    return nbformat.v4.new_output("display_data", data={"text/plain": text})


def test_verdicts_read_claims_readings_and_errors():
    nb = nbformat.v4.new_notebook(cells=[
        _cell("a", _shown("\u2714 C15 holds: short requests waited less"), _shown("\u25b8 C15 on this machine: 3 s")),
        _cell("b", nbformat.v4.new_output("error", ename="ClaimFailed", evalue="C16 NOT shown on this machine: x",
                                          traceback=[])),
        _cell("c", nbformat.v4.new_output("error", ename="AssertionError", evalue="gaps", traceback=[])),
        _cell("d", nbformat.v4.new_output("stream", name="stdout", text="nothing to judge")),
        nbformat.v4.new_markdown_cell("\u2714 C1 holds: prose is not a verdict")])
    assert busy_check.verdicts(nb) == {"a": {"C15 holds", "C15 reading"}, "b": {"C16 not shown"},
                                       "c": {"raised AssertionError"}}


def test_a_changed_verdict_is_a_difference():
    idle = {"a": {"C15 holds"}, "b": {"C16 holds"}}
    assert busy_check.differences(idle, {"a": {"C15 holds"}, "b": {"C16 holds"}}) == []
    diff = busy_check.differences(idle, {"a": {"C15 not shown"}, "b": {"C16 holds"}, "c": {"raised NameError"}})
    assert diff == ["cell a: idle ['C15 holds'], busy ['C15 not shown']", "cell c: idle [], busy ['raised NameError']"]


def test_the_burner_keeps_a_core_busy_and_stops():
    import time

    with busy_check.burning(1, seconds=60) as burners:
        time.sleep(0.5)
        assert all(p.is_alive() for p in burners)
    assert not any(p.is_alive() for p in burners)


def _idle_run(config) -> nbformat.NotebookNode:
    recorder = config.pluginmanager.get_plugin("llm-anatomy-book-recorder")
    if recorder is not None and NOTEBOOK.name in recorder.seconds:  # nbval ran it in this session, and it was kept
        return nbformat.read(str(recorder.folder / NOTEBOOK.name), as_version=4)
    return busy_check.execute(NOTEBOOK)[0]


@pytest.mark.integration
@pytest.mark.timeout(1500)
def test_notebook_08_gives_the_same_verdicts_with_a_core_burned(pytestconfig):
    idle = busy_check.verdicts(_idle_run(pytestconfig))
    shown = {mark for marks in idle.values() for mark in marks}
    assert {"C13 holds", "C14 holds", "C15 holds", "C16 holds"} <= shown, f"the idle run's verdicts: {idle}"
    assert not [m for m in shown if "not shown" in m or m.startswith("raised")], f"the idle run failed: {idle}"
    with busy_check.burning(1):
        busy, seconds = busy_check.execute(NOTEBOOK)
    diff = busy_check.differences(idle, busy_check.verdicts(busy))
    assert not diff, f"with a core burned ({seconds:.0f} s) notebook 08 told another story:\n" + "\n".join(diff)
