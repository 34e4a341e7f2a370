"""A pytest plugin that keeps what nbval executed, so that the book never runs a notebook a second time.

    python -m pytest notebooks --nbval-lax --nbval-current-env -p tools.site.capture --executed-to=build/executed

nbval runs every code cell of a notebook in one kernel and keeps each cell's outputs on its test item
(`IPyNbCell.test_outputs`: streams, rich displays and images, the error of a failing cell). This plugin only
reads them after each cell has run; it changes nothing in how nbval runs a notebook. When the last cell of a
notebook is done it writes that notebook, with its outputs, execution counts and how each cell ended, to
DIR/<name>.ipynb, and DIR/environment.json says what it ran on. Without --executed-to (or
$LLM_ANATOMY_EXECUTED_TO) the plugin does nothing but put the book's browser checks last (see below).

It also moves tests/test_busy_machine.py and then tests/browser/test_site.py to the end of the run, after every
notebook: the first compares notebook 08's claims with nbval's idle run of it, the second checks the book built
from this very run (and the widget stills that the other browser tests saved earlier in it).
"""

from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import pytest

ENV_VAR = "LLM_ANATOMY_EXECUTED_TO"
META_KEY = "llm_anatomy_book"  # notebook and cell metadata written here (never in notebooks/)
SITE_TESTS = "test_site.py"
LAST = ("test_busy_machine.py", SITE_TESTS)  # after the notebooks, in this order


def source_digest(nb) -> str:
    """What identifies a notebook's content: its cells' kinds and sources (not outputs or metadata)."""
    cells = [[cell.get("cell_type"), cell.get("source") if isinstance(cell.get("source"), str)
              else "".join(cell.get("source", []))] for cell in nb["cells"]]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode()).hexdigest()


def pytest_addoption(parser):
    group = parser.getgroup("llm-anatomy book")
    group.addoption("--executed-to", metavar="DIR", default=os.environ.get(ENV_VAR) or None,
                    help="write every notebook nbval executes, with its outputs, to DIR for the book "
                         f"(also ${ENV_VAR})")


def pytest_configure(config):
    folder = config.getoption("executed_to")
    if folder:
        config.pluginmanager.register(Recorder(Path(folder), config), "llm-anatomy-book-recorder")


def pytest_collection_modifyitems(session, config, items):
    """The busy-machine check and the book's checks come last: after the notebooks they read."""
    last = sorted((item for item in items if item.path.name in LAST), key=lambda item: LAST.index(item.path.name))
    if last:
        items[:] = [item for item in items if item.path.name not in LAST] + last


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and type(item).__module__.startswith("nbval")


def environment() -> dict:
    """The machine and versions a run executed on (written once per run, and into each notebook)."""
    info = {"executed_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
            "machine": platform.machine(), "processor": _cpu_name()}
    try:
        from llm_anatomy.measure.environment import environment_report

        report = environment_report(check_hashes=False)
        info.update({key: report[key] for key in ("python", "platform", "device", "dtype", "cpu_cores",
                                                  "ram_total_gb", "default_model", "packages")})
        if "gpu_memory_total_gb" in report:
            info["gpu_memory_total_gb"] = report["gpu_memory_total_gb"]
    except Exception as err:  # the book still says what it can
        info.update(python=platform.python_version(), platform=platform.platform(terse=True),
                    report_error=f"{type(err).__name__}: {err}")
    info["commit"] = _git_commit()
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        proc = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], capture_output=True,
                              text=True, timeout=10, cwd=Path(__file__).resolve().parents[2])
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None


class Recorder:
    """Collects each nbval cell's outputs and writes the notebook when its last cell is done."""

    def __init__(self, folder: Path, config):
        self.folder = folder
        self.config = config
        self.pending: dict[Path, dict] = {}  # notebook path -> {"file": IPyNbFile, "cells": {num: record}}
        self._environment: dict | None = None
        self.seconds: dict[str, float] = {}  # notebook file name -> seconds its cells ran

    # -- collecting

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        if not _is_nbval_cell(item) or call.when == "teardown":
            return
        report = outcome.get_result()
        entry = self.pending.setdefault(Path(str(item.parent.fspath)), {"file": item.parent, "cells": {}})
        record = entry["cells"].setdefault(item.cell_num, {"status": "not run", "outputs": [], "seconds": 0.0})
        if call.when == "setup" and report.outcome != "passed":
            record["status"] = "skipped" if report.skipped else "not run"
            record["detail"] = _short(report)
        elif call.when == "call":
            outputs = getattr(item, "test_outputs", None) or []
            record["outputs"] = [copy.deepcopy(out) for out in outputs]
            record["seconds"] = round(call.duration, 3)
            if hasattr(report, "wasxfail"):  # nbval marks the cells after a timed-out one
                record["status"] = "not run"
                record["detail"] = f"not run: {report.wasxfail}"
            elif report.skipped:
                record["status"] = "skipped"
            elif report.failed:
                record["status"] = "failed"
                record["detail"] = _short(report)
            else:
                record["status"] = "passed"

    def pytest_runtest_teardown(self, item, nextitem):
        if _is_nbval_cell(item) and (nextitem is None or getattr(nextitem, "parent", None) is not item.parent):
            self._write(Path(str(item.parent.fspath)))

    def pytest_sessionstart(self, session):
        self.started = time.time()

    def pytest_sessionfinish(self, session):
        for path in list(self.pending):  # a run stopped early (-x, Ctrl-C): write what ran
            self._write(path)

    def pytest_terminal_summary(self, terminalreporter):
        """Say what each notebook took (the course's time budget is read here) and where the book is when this run
        built it (tests/browser/test_site.py does, last)."""
        if self.seconds:
            terminalreporter.write_sep("-", "nbval seconds per notebook")
            for name, seconds in sorted(self.seconds.items()):
                terminalreporter.write_line(f"{seconds:8.1f} s  {name}")
            load = " / ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
            terminalreporter.write_line(f"{sum(self.seconds.values()):8.1f} s  all notebooks "
                                        f"({os.cpu_count()} cores, load average now {load})")
        index = Path(__file__).resolve().parents[2] / "build" / "site" / "index.html"
        if index.is_file() and index.stat().st_mtime >= getattr(self, "started", time.time()):
            size = sum(p.stat().st_size for p in index.parent.rglob("*") if p.is_file())
            terminalreporter.write_line(f"the executed book: {index.as_uri()} ({size / 1e6:.1f} MB)")

    # -- writing

    def _write(self, path: Path) -> None:
        entry = self.pending.pop(path, None)
        if entry is None or not hasattr(entry["file"], "nb"):
            return
        if self._environment is None:
            self._environment = environment()
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / "environment.json").write_text(json.dumps(self._environment, indent=1) + "\n")
        nb = copy.deepcopy(entry["file"].nb)
        total, count, code_num = 0.0, 0, 0
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            record = entry["cells"].get(code_num, {"status": "not run", "outputs": [], "seconds": 0.0})
            code_num += 1
            cell.outputs = record["outputs"]
            if record["status"] in ("passed", "failed"):
                count += 1
                cell.execution_count = count
                for out in cell.outputs:
                    if out.get("output_type") == "execute_result":
                        out["execution_count"] = count
            else:
                cell.execution_count = None
            total += record["seconds"]
            cell.metadata[META_KEY] = {key: record[key] for key in ("status", "seconds", "detail") if key in record}
        self.seconds[path.name] = round(total, 1)
        nb.metadata[META_KEY] = {"source": path.name, "source_digest": source_digest(nb), "seconds": round(total, 1),
                                 "environment": self._environment}
        nb.metadata.pop("widgets", None)
        import nbformat

        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.folder / path.name
        tmp = target.with_suffix(".ipynb.tmp")
        nbformat.write(nb, str(tmp))
        os.replace(tmp, target)


def _short(report) -> str:
    text = str(report.longrepr) if report.longrepr is not None else ""
    return text[-2000:]
