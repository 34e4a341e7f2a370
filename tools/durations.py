"""The slowest tests of a full run, kept in tests/DURATIONS.md (`make durations`), and the list `make test-fast` leaves
out.

    python tools/durations.py build/junit.xml            # writes tests/DURATIONS.md from the run's JUnit report

`make test` writes its JUnit report to build/junit.xml. DURATIONS.md lists the run (when, where, its total) and the 50
slowest tests with their seconds (setup and teardown included, as JUnit's `time` counts them), then every test over
FAST_LIMIT_S seconds: `make test-fast` deselects those (tests/conftest.py reads the list when LLM_ANATOMY_FAST=1), so a
contributor's quick run is the unit tests that were fast in the last full run, new ones included.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "DURATIONS.md"
FAST_LIMIT_S = 1.0  # a test slower than this in the last full run is left out of make test-fast
SLOW_HEADING = "## Left out of make test-fast"


def test_times(junit: Path) -> dict[str, float]:
    """{pytest node id: seconds} from a JUnit XML report (pytest's --junitxml)."""
    times = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        node = node_id(case.get("classname", ""), case.get("name", ""))
        times[node] = times.get(node, 0.0) + float(case.get("time", 0.0))
    return times


def node_id(classname: str, name: str) -> str:
    """pytest's node id from JUnit's classname (the module path with dots, then any class) and name."""
    if classname.endswith(".ipynb"):  # nbval: notebooks.08_serving.ipynb, "Cell 12"
        return classname[:-len(".ipynb")].replace(".", "/") + ".ipynb::" + name
    parts = classname.split(".")
    for k in range(len(parts), 0, -1):  # the longest prefix that is a file: the rest is a class
        path = "/".join(parts[:k]) + ".py"
        if (ROOT / path).exists():
            return "::".join([path, *parts[k:], name])
    return "/".join(parts) + ".py::" + name


def render(times: dict[str, float], machine: str, top: int = 50) -> str:
    total = sum(times.values())
    slowest = sorted(times.items(), key=lambda kv: -kv[1])
    lines = ["# The slowest tests", "",
             f"The last full run recorded here: {len(times)} tests, {total:.0f} s of test time, on {machine}, "
             f"{datetime.now(timezone.utc):%Y-%m-%d}. Refresh with `make durations` (a full `make test`, then "
             "`python tools/durations.py build/junit.xml`).", "",
             f"| seconds | test |", "|---:|---|"]
    lines += [f"| {s:.1f} | `{node}` |" for node, s in slowest[:top]]
    lines += ["", SLOW_HEADING, "",
              f"Every test over {FAST_LIMIT_S:g} s in that run, and every test of a file whose first test was (its "
              "shared fixtures are charged to it), notebooks and browser tests aside (make test-fast leaves them out "
              "whole); one per line, read by tests/conftest.py:", "", "```"]
    lines += sorted(slow_list(times))
    lines += ["```", ""]
    return "\n".join(lines)


def slow_list(times: dict[str, float]) -> set[str]:
    """The tests make test-fast leaves out: each over FAST_LIMIT_S, and every test of a file whose FIRST test was
    (a module's shared fixture is charged to its first test: leaving that one out would move the cost to the next).
    `times` keeps the run's order. Notebooks and browser tests are left out whole by make test-fast itself."""
    slow, first = set(), {}
    for node, seconds in times.items():
        first.setdefault(node.split("::")[0], (node, seconds))
    heavy = {path for path, (_, seconds) in first.items() if seconds > FAST_LIMIT_S}
    for node, seconds in times.items():
        if seconds > FAST_LIMIT_S or node.split("::")[0] in heavy:
            slow.add(node)
    return {node for node in slow if not node.startswith(("notebooks/", "tests/browser/"))}


def slow_tests(text: str) -> set[str]:
    """The node ids listed under SLOW_HEADING in DURATIONS.md's text."""
    if SLOW_HEADING not in text:
        return set()
    block = re.search(r"```\n(.*?)```", text.split(SLOW_HEADING, 1)[1], re.S)
    return {line.strip() for line in block.group(1).splitlines() if line.strip()} if block else set()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--machine", default=f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}")
    args = parser.parse_args(argv)
    OUT.write_text(render(test_times(args.junit), args.machine))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
