"""tools/durations.py: the slowest tests of a full run (tests/DURATIONS.md) and the list make test-fast leaves out."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import durations  # noqa: E402


def test_node_ids_from_junit_names():
    assert durations.node_id("tests.serve.test_scheduler", "test_x[a-1]") == "tests/serve/test_scheduler.py::test_x[a-1]"
    assert durations.node_id("notebooks.08_serving.ipynb", "Cell 12") == "notebooks/08_serving.ipynb::Cell 12"
    assert durations.node_id("tests.test_claims.TestX", "test_y") == "tests/test_claims.py::TestX::test_y"


def test_the_report_lists_the_slowest_and_the_slow_list_reads_back(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites><testsuite name="pytest">'
                     '<testcase classname="tests.serve.test_scheduler" name="test_fast" time="0.2"/>'
                     '<testcase classname="tests.serve.test_scheduler" name="test_slow" time="4.5"/>'
                     '<testcase classname="tests.serve.test_metrics" name="test_first" time="6.0"/>'
                     '<testcase classname="tests.serve.test_metrics" name="test_second" time="0.1"/>'
                     '<testcase classname="notebooks.08_serving.ipynb" name="Cell 3" time="9.0"/>'
                     '<testcase classname="tests.browser.test_site" name="test_book" time="12.0"/>'
                     '</testsuite></testsuites>')
    times = durations.test_times(junit)
    assert times["tests/serve/test_scheduler.py::test_slow"] == 4.5 and len(times) == 6
    text = durations.render(times, "2 cores", top=3)
    assert text.index("tests/browser/test_site.py::test_book") < text.index("notebooks/08_serving.ipynb::Cell 3")
    assert "test_fast`" not in text.split(durations.SLOW_HEADING)[0]  # only the top 3
    # the slow test, and every test of a file whose first test was slow (its shared fixtures were charged to it);
    # notebooks and browser tests aside
    assert durations.slow_tests(text) == {"tests/serve/test_scheduler.py::test_slow",
                                          "tests/serve/test_metrics.py::test_first",
                                          "tests/serve/test_metrics.py::test_second"}
    assert durations.slow_tests("no list here") == set()


def test_the_committed_list_names_tests_that_exist():
    listed = ROOT / "tests" / "DURATIONS.md"
    slow = durations.slow_tests(listed.read_text())
    assert slow, "tests/DURATIONS.md lists the slow tests: make durations"
    files = {node.split("::")[0] for node in slow}
    assert all((ROOT / f).exists() for f in files), sorted(f for f in files if not (ROOT / f).exists())
