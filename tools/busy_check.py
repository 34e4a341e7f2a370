"""Does a notebook tell the same story on a busy machine? Run it with other processes burning cores, and compare
its claims' verdicts with an idle run's (issue 23: notebook 08 once published inverted results when busy).

    python tools/busy_check.py notebooks/08_serving.ipynb                 # an idle run, then one with a core burned
    python tools/busy_check.py notebooks/08_serving.ipynb --idle build/executed/08_serving.ipynb --burn 1

A verdict is what a code cell ended with, per claim: "holds" (a green `claim` line), "not shown" (ClaimFailed),
"reading" (a `reading` line: a measurement the prose reads, never asserted), and per cell whether it raised
anything else (an `assert` that a picture's story holds, say). Both runs must give the same verdicts; the readings'
numbers and the spread warnings beside them may differ, which is what they are for. tests/test_busy_machine.py
runs this on notebook 08 after nbval's own run of it (the idle one).
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HOLDS = re.compile(r"\u2714 (C\d{1,2}) holds:")
READING = re.compile(r"\u25b8 (C\d{1,2}) on this machine:")
NOT_SHOWN = re.compile(r"(C\d{1,2}) NOT shown on this machine")


def _texts(output) -> list[str]:
    if output.get("output_type") == "stream":
        return [output.get("text", "")]
    data = output.get("data", {})
    return [data[key] if isinstance(data[key], str) else "".join(data[key])
            for key in ("text/plain", "text/html") if key in data]


def verdicts(nb) -> dict[str, set[str]]:
    """{cell id: {"C15 holds", "C15 reading", "C16 not shown", "raised AssertionError", ...}} for every code cell
    that showed a verdict or raised."""
    found: dict[str, set[str]] = {}
    for number, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        marks = set()
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                failed = NOT_SHOWN.search(output.get("evalue", ""))
                marks.add(f"{failed.group(1)} not shown" if failed else f"raised {output.get('ename')}")
                continue
            for text in _texts(output):
                marks |= {f"{c} holds" for c in HOLDS.findall(text)}
                marks |= {f"{c} reading" for c in READING.findall(text)}
        if marks:
            found[cell.get("id") or f"cell {number}"] = marks
    return found


def differences(idle: dict[str, set[str]], busy: dict[str, set[str]]) -> list[str]:
    """One line per cell whose verdicts differ between the two runs (empty: the same story)."""
    return [f"cell {cell}: idle {sorted(idle.get(cell, ()))}, busy {sorted(busy.get(cell, ()))}"
            for cell in sorted(set(idle) | set(busy)) if idle.get(cell, set()) != busy.get(cell, set())]


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # one core kept busy, bounded in time even if nobody stops it
        pass


@contextmanager
def burning(cores: int, seconds: float = 1800):
    """`cores` processes spinning (spawned, stopped on the way out) while the block runs."""
    context = multiprocessing.get_context("spawn")
    burners = [context.Process(target=_burn, args=(seconds,), daemon=True) for _ in range(cores)]
    for p in burners:
        p.start()
    try:
        yield burners
    finally:
        for p in burners:
            p.terminate()
        for p in burners:
            p.join(timeout=10)


def execute(path: Path, timeout_s: int = 900):
    """The notebook run top to bottom in a fresh kernel of this Python, in its own folder; a cell that raises is
    kept (its error is a verdict) and the run goes on. Returns (notebook with outputs, seconds)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebook", type=Path)
    p.add_argument("--idle", type=Path, help="an executed copy to compare with (default: run it idle first)")
    p.add_argument("--burn", type=int, default=1, help="cores to keep busy during the second run (default 1)")
    args = p.parse_args(argv)
    import nbformat

    if args.idle:
        idle = verdicts(nbformat.read(str(args.idle), as_version=4))
    else:
        nb, seconds = execute(args.notebook)
        idle = verdicts(nb)
        print(f"idle run: {seconds:.0f} s")
    with burning(args.burn):
        nb, seconds = execute(args.notebook)
    busy = verdicts(nb)
    print(f"run with {args.burn} core(s) burned: {seconds:.0f} s")
    for cell in sorted(busy):
        print(f"  {cell}: {', '.join(sorted(busy[cell]))}")
    diff = differences(idle, busy)
    print("\n".join(diff) if diff else "the same verdicts in both runs")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
