"""Every timed notebook tells the same story on a busy machine (issues 23 and 35): run with a second process burning
one core, notebooks 05, 06, 07, 09 and 12 give the same claim verdicts as in an idle run (08 and the rest are run so by
`make busy-check`: CI's time goes to the five whose claims are most timing-bound). The idle run is nbval's own run of
each notebook earlier in this session when there was one (tools/site/capture.py kept it, and puts this test after the
notebooks); else this test runs it idle first. The busy run: in make test it ran beside the unit tests, a burner
topping their work up to a core (tests/busy_background.py, issue 46); run alone, this test burns a core and runs it.
tools/busy_check.py does the work (`make busy-check` runs every notebook with one and with both cores burned, and
prints the table of times); its verdict reading is checked here on made-up outputs."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import busy_check  # noqa: E402  (repository upkeep, not part of the package)

BUSY_NOTEBOOKS = {  # the timed notebooks, and the claims each must show in its idle run
    "05_generation.ipynb": {"C8"},
    "06_kv_cache.ipynb": {"C7", "C8", "C9", "C10"},
    "07_prefill_and_decode.ipynb": {"C6", "C11", "C12"},
    "09_making_decode_fast.ipynb": {"C17", "C18", "C19", "C20"},
    "12_structured_output.ipynb": {"C26"},  # the mask's cost against a decode step is timed
}


def _cell(cell_id: str, *outputs) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell("")
    cell.id, cell.outputs = cell_id, list(outputs)
    return cell


def _shown(text: str):
    return nbformat.v4.new_output("display_data", data={"text/plain": text})


def test_verdicts_read_claims_readings_and_errors():
    nb = nbformat.v4.new_notebook(cells=[
        _cell("a", _shown("\u2714 C15 holds: short requests waited less"), _shown("\u25b8 C15 on this machine: 3 s")),
        _cell("b", nbformat.v4.new_output("error", ename="ClaimFailed", evalue="C16 FAILED on this machine: x",
                                          traceback=[])),
        _cell("c", nbformat.v4.new_output("error", ename="AssertionError", evalue="gaps", traceback=[])),
        _cell("d", nbformat.v4.new_output("stream", name="stdout", text="nothing to judge")),
        _cell("e", _shown("\u25cc C22 not shown on this machine: two cores. What would show it: four")),
        nbformat.v4.new_markdown_cell("\u2714 C1 holds: prose is not a verdict")])
    assert busy_check.verdicts(nb) == {"a": {"C15 holds", "C15 reading"}, "b": {"C16 failed"},
                                       "c": {"raised AssertionError"}, "e": {"C22 not shown"}}
    assert busy_check.failures(busy_check.verdicts(nb)) == ["C16 failed", "raised AssertionError"]


def test_a_changed_verdict_is_a_difference():
    idle = {"a": {"C15 holds"}, "b": {"C16 holds"}}
    assert busy_check.differences(idle, {"a": {"C15 holds"}, "b": {"C16 holds"}}) == []
    diff = busy_check.differences(idle, {"a": {"C15 failed"}, "b": {"C16 holds"}, "c": {"raised NameError"}})
    assert diff == ["cell a: idle ['C15 holds'], busy ['C15 failed']", "cell c: idle [], busy ['raised NameError']"]


def test_a_claim_the_busy_machine_cannot_show_is_said_not_a_difference():
    idle = {"a": {"C23 holds"}, "b": {"C22 not shown"}}
    busy = {"a": {"C23 not shown"}, "b": {"C22 not shown"}}
    assert busy_check.differences(idle, busy) == []
    assert busy_check.not_shown_when_busy(idle, busy) == ["C23 (cell a)"]
    assert busy_check.differences(idle, {"a": {"C23 failed"}, "b": {"C22 not shown"}})  # failing is a difference
    assert busy_check.differences(idle, {"a": {"C23 not shown", "C23 reading"}, "b": {"C22 not shown"}})
    results = [{"notebook": "10_beyond_one_device.ipynb", "idle_s": 70.0, "idle_failures": [],
                "runs": [{"burn": 1, "seconds": 80.0, "ratio": 1.14, "differences": [],
                          "not_shown_when_busy": ["C23 (cell a)"]}]}]
    assert ("the same in every run; shown in one run, 'not shown on this machine' in another: C23 (cell a)"
            in busy_check.table(results, [1]))


def test_failures_and_the_table():
    found = {"a": {"C15 holds"}, "b": {"C16 failed"}, "c": {"raised NameError", "C8 holds"}}
    assert busy_check.failures(found) == ["C16 failed", "raised NameError"]
    results = [{"notebook": "06_kv_cache.ipynb", "idle_s": 50.0, "idle_failures": [],
                "runs": [{"burn": 1, "seconds": 120.0, "ratio": 2.4, "differences": []},
                         {"burn": 2, "seconds": 90.0, "ratio": 1.8, "differences": ["cell x: ..."]}]}]
    text = busy_check.table(results, [1, 2])
    assert "| 06_kv_cache.ipynb | 50 | 120 (2.40x, over 2.0x) | 90 (1.80x) | differ: 2 burned: 1 cells |" in text
    assert busy_check.too_slow(results[0]["runs"][0]) and not busy_check.too_slow(results[0]["runs"][1])


def test_an_executed_copy_is_found_in_a_folder_or_as_a_file(tmp_path):
    notebook = Path("notebooks/06_kv_cache.ipynb")
    assert busy_check.executed_copy(None, notebook) is None
    assert busy_check.executed_copy(tmp_path, notebook) is None  # no copy in the folder: run it idle
    (tmp_path / notebook.name).write_text("{}")
    assert busy_check.executed_copy(tmp_path, notebook) == tmp_path / notebook.name
    assert busy_check.executed_copy(tmp_path / notebook.name, notebook) == tmp_path / notebook.name


def test_the_burner_keeps_a_core_busy_and_stops():
    import time

    with busy_check.burning(1, seconds=60) as burners:
        time.sleep(0.5)
        assert all(p.is_alive() for p in burners)
    assert not any(p.is_alive() for p in burners)


def test_the_top_up_burner_spins_only_while_other_work_leaves_a_core_free():
    readings = iter([0.2, 1.4, 0.9, None, 2.0, 1.0] + [0.0] * 10_000)  # cores kept busy by others, window by window
    done = []
    busy_check._top_up(0.3, 1, 0, read_load=lambda: next(readings),
                       spin=lambda s: done.append("spin") or time.sleep(0.01),
                       rest=lambda s: done.append("rest") or time.sleep(0.01))
    assert done[:8] == ["spin", "spin", "rest", "spin", "spin", "rest", "rest", "spin"]


def test_the_load_beside_a_run_leaves_out_the_runs_own_processes():
    """Read over the same windows, a spinner this test started is other work for a process outside this test's tree
    (a sleeping child) and none of this test's own: theirs minus ours is the spinner's core."""
    code = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 6: pass"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(8)"])
    spinner = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert spinner.pid in busy_check._tree(os.getpid()) and spinner.pid not in busy_check._tree(sleeper.pid)
        gaps = []
        for _ in range(3):  # in turns, the median: another program's burst lands in both readings alike
            ours, theirs = busy_check.others_load(os.getpid())[1], busy_check.others_load(sleeper.pid)[1]
            time.sleep(0.5)
            gaps.append(busy_check.others_load(sleeper.pid, theirs)[0] - busy_check.others_load(os.getpid(), ours)[0])
        assert statistics.median(gaps) > 0.4, f"a spinning core read as {gaps} cores of other work"
    finally:
        for p in (sleeper, spinner):
            p.kill()
            p.wait()


def test_the_busy_runs_keep_each_copy_and_its_seconds(tmp_path):
    notebook = tmp_path / "tiny.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")]), str(notebook))
    seconds = busy_check.busy_runs([notebook], tmp_path / "out", top_up=True, log=lambda line: None)
    copy = nbformat.read(str(tmp_path / "out" / "tiny.burn1.ipynb"), as_version=4)
    assert copy.cells[0].outputs[0]["text"] == "42\n"
    assert json.loads((tmp_path / "out" / "busy.json").read_text()) == seconds and seconds["tiny.ipynb"] > 0


class _Item:
    def __init__(self, path, name=None, quiet=False):
        self.path, self.quiet = ROOT / path, quiet
        self.callspec = type("CallSpec", (), {"params": {"name": name}})() if name else None

    def get_closest_marker(self, name):
        return pytest.mark.quiet if name == "quiet" and self.quiet else None


def test_make_test_plans_the_reruns_beside_the_unit_tests_and_puts_them_first():
    from busy_background import MIN_UNIT_TESTS, BusyBackground

    busy = [_Item("tests/test_busy_machine.py", name) for name in ("05_generation.ipynb", "06_kv_cache.ipynb")]
    units = [_Item("tests/fast/test_fused.py") for _ in range(MIN_UNIT_TESTS)]
    browser, cell = _Item("tests/browser/test_05_generation.py"), _Item("notebooks/05_generation.ipynb")
    quiet = _Item("tests/test_device.py", quiet=True)
    items = [browser] + units + [quiet, cell] + busy
    plan = BusyBackground()
    plan.pytest_collection_modifyitems(None, None, items)
    assert plan.notebooks == ["05_generation.ipynb", "06_kv_cache.ipynb"]
    assert items == [quiet] + units + [browser, cell] + busy
    alone = BusyBackground()  # too little to hide them behind: the busy test runs them itself
    alone.pytest_collection_modifyitems(None, None, [cell] + busy + units[:-1])
    assert alone.notebooks == [] and alone.result("05_generation.ipynb") is None


def test_a_planned_rerun_that_left_no_copy_fails_with_its_log(tmp_path):
    from busy_background import BusyBackground

    plan = BusyBackground(tmp_path)
    plan.notebooks = ["06_kv_cache.ipynb"]
    plan.process = subprocess.Popen([sys.executable, "-c", "print('kernel died')"], stdout=subprocess.PIPE)
    plan.process.wait()
    plan.waited_s = 0.0
    (tmp_path / "log.txt").write_text("06_kv_cache.ipynb: the kernel died\n")
    with pytest.raises(pytest.fail.Exception, match="the kernel died"):
        plan.result("06_kv_cache.ipynb")
    plan.process.stdout.close()


def _idle_run(config, notebook: Path) -> nbformat.NotebookNode:
    recorder = config.pluginmanager.get_plugin("llm-anatomy-book-recorder")
    if recorder is not None and notebook.name in recorder.seconds:  # nbval ran it in this session, and it was kept
        nb = nbformat.read(str(recorder.folder / notebook.name), as_version=4)
        if busy_check.failures(busy_check.verdicts(nb)):  # nbval has named each failure once already
            pytest.skip(f"{notebook.name} failed in nbval's run of it, above: no idle verdicts to compare with")
        return nb
    return busy_check.execute(notebook)[0]


def _busy_run(config, notebook: Path):
    """The notebook run with a core burned: make test ran it beside the unit tests (tests/busy_background.py, the
    burner topping the other work up to a core), else it runs now with a core burned and nothing else."""
    background = config.pluginmanager.get_plugin("llm-anatomy-busy-background")
    done = background.result(notebook.name) if background is not None else None
    if done is not None:
        return done
    with busy_check.burning(1):
        busy, seconds = busy_check.execute(notebook)
    return busy, seconds, "alone"


@pytest.mark.integration
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", sorted(BUSY_NOTEBOOKS))
def test_a_timed_notebook_gives_the_same_verdicts_with_a_core_burned(pytestconfig, name):
    notebook = ROOT / "notebooks" / name
    idle = busy_check.verdicts(_idle_run(pytestconfig, notebook))
    shown = {mark.split()[0] for marks in idle.values() for mark in marks if mark.endswith(" holds")}
    assert BUSY_NOTEBOOKS[name] <= shown, f"the idle run's verdicts: {idle}"
    assert not busy_check.failures(idle), f"the idle run failed: {busy_check.failures(idle)}"
    busy, seconds, how = _busy_run(pytestconfig, notebook)
    diff = busy_check.differences(idle, busy_check.verdicts(busy))
    print(f"{name} with a core burned ({how}): {seconds:.0f} s")  # make busy-check prints the table of times
    assert not diff, f"with a core burned ({how}, {seconds:.0f} s) {name} told another story:\n" + "\n".join(diff)
