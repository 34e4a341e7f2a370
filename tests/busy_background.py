"""make test runs the busy-machine reruns beside the unit tests (issue 46, item 3).

tests/test_busy_machine.py compares each timed notebook's claim verdicts with a core burned against nbval's idle run
of it. Run one after the other, the reruns cost about 200 s of a make test on 2 cores with one core doing nothing
useful. Here they start in the background with the session's first unit test, in a process of their own
(`tools/busy_check.py --busy-only --top-up`), and the unit tests are the other work on the machine: the burner spins
only while the processes outside the rerun keep less than one core busy, so every notebook still has at least a
core's worth of other work beside it, as before, and often more. The browser tests and nbval's idle runs wait for the
reruns to finish (so that the idle run stays idle), and the busy test reads the copies the reruns kept. Tests marked
`quiet` read how busy the machine is (tests/test_device.py): they run first, before the reruns start.

It plans this only when the session holds the busy test and at least MIN_UNIT_TESTS other tests to run first; a busy
test run alone, or with the notebooks only, executes the reruns itself as before.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAME = "llm-anatomy-busy-background"
BUSY_TEST = "test_busy_machine.py"
MIN_UNIT_TESTS = 200  # fewer than this, and there is not enough other work to hide the reruns behind
JOIN_TIMEOUT_S = 2400
PID_VARIABLE = "LLM_ANATOMY_BUSY_RERUNS_PID"  # read by tests/distributed/test_launch.py


def _is_unit(item) -> bool:
    parts = item.path.relative_to(ROOT).parts if item.path.is_relative_to(ROOT) else ()
    return parts[:1] == ("tests",) and "browser" not in parts and item.path.name != BUSY_TEST


def _is_quiet(item) -> bool:
    """A test marked quiet reads how busy the machine is (tests/test_device.py): it runs before the reruns start."""
    return item.get_closest_marker("quiet") is not None


def _busy_notebook(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if item.path.name == BUSY_TEST and callspec is not None and "name" in callspec.params:
        return callspec.params["name"]
    return None


class BusyBackground:
    def __init__(self, folder: Path = ROOT / "build" / "busy-test"):
        self.folder, self.notebooks, self.process, self.log, self.waited_s = folder, [], None, None, None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        notebooks = [name for name in map(_busy_notebook, items) if name]
        if not notebooks or sum(map(_is_unit, items)) < MIN_UNIT_TESTS:
            return
        self.notebooks = notebooks
        # The tests that need a quiet machine, then the other unit tests beside the reruns; then the browser tests
        # and the notebooks, after them.
        quiet = [item for item in items if _is_unit(item) and _is_quiet(item)]
        units = [item for item in items if _is_unit(item) and not _is_quiet(item)]
        rest = [item for item in items if not _is_unit(item)]
        items[:] = quiet + units + rest

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        if self.notebooks and self.process is None and _is_unit(item) and not _is_quiet(item):
            self._start()
        elif self.process is not None and self.waited_s is None and not _is_unit(item):
            self._join()

    def _start(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        self.log = open(self.folder / "log.txt", "w")
        paths = [str(ROOT / "notebooks" / name) for name in self.notebooks]
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "tools" / "busy_check.py"), *paths, "--busy-only", "--top-up", "--burn", "1",
             "--out", str(self.folder)], stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
            start_new_session=True)  # its own process group: the kernels and burners stop with it
        os.environ[PID_VARIABLE] = str(self.process.pid)  # tests that count their own processes leave these out

    def _join(self) -> None:
        start = time.monotonic()
        try:
            self.process.wait(timeout=JOIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._stop()
        self.waited_s = time.monotonic() - start
        self.log.close()
        os.environ.pop(PID_VARIABLE, None)

    def _stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def pytest_sessionfinish(self, session):
        self._stop()
        if self.log is not None and not self.log.closed:
            self.log.close()

    def result(self, name: str):
        """(the executed busy copy, its seconds, how it ran) for notebook `name`, when the reruns of this session
        ran it; None when they were not planned for it. A planned rerun that did not finish fails the test, with the
        rerun's log."""
        if name not in self.notebooks or self.process is None:
            return None
        import nbformat

        if self.waited_s is None:
            self._join()
        copy = self.folder / f"{Path(name).stem}.burn1.ipynb"
        seconds = json.loads((self.folder / "busy.json").read_text()) if (self.folder / "busy.json").exists() else {}
        if not copy.exists() or name not in seconds:
            log = (self.folder / "log.txt").read_text()[-3000:]
            pytest.fail(f"the background rerun of {name} did not finish (exit {self.process.returncode}):\n{log}")
        return nbformat.read(str(copy), as_version=4), seconds[name], "beside the unit tests"
