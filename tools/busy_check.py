"""Does a notebook tell the same story on a busy machine? Run it with other processes burning cores, and compare
its claims' verdicts and its time with an idle run's (issue 23: notebook 08 once published inverted results when
busy; issue 35: every notebook, with one and with both cores burned).

    python tools/busy_check.py notebooks/06_kv_cache.ipynb                  # idle, then with one core burned
    python tools/busy_check.py notebooks/*.ipynb --burn 1 --burn 2          # every notebook, both settings (make busy-check)
    python tools/busy_check.py notebooks/08_serving.ipynb --idle build/executed --burn 1

A verdict is what a code cell ended with, per claim: "holds" (a green `claim` line), "failed" (ClaimFailed),
"reading" (a `reading` line: a measurement the prose reads, never asserted), "not shown" (an amber `not_shown` line:
this machine cannot separate the claim from its counterfactual), and per cell whether it raised
anything else (an `assert` that a picture's story holds, say). Every run must give the idle run's verdicts; the
readings' numbers and the spread warnings beside them may differ, which is what they are for. The table gives each
notebook's seconds idle and busy; with one core burned no notebook should take more than MAX_RATIO times its idle
time (a busy run over it is flagged). --out DIR keeps the executed copies, summary.json and table.md. tests/test_busy_machine.py
runs this on notebooks 05, 06, 07 and 09 with a core burned, after nbval's own run of them (the idle one).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HOLDS = re.compile(r"\u2714 (C\d{1,2}) holds:")
READING = re.compile(r"\u25b8 (C\d{1,2}) on this machine:")
FAILED = re.compile(r"(C\d{1,2}) FAILED on this machine")
NOT_SHOWN = re.compile(r"\u25cc (C\d{1,2}) not shown on this machine:")
MAX_RATIO = 2.0  # with one core burned, at most this many times the idle run's seconds
BOOK_KEY = "llm_anatomy_book"  # where tools/site/capture.py keeps nbval's seconds in an executed copy


def _texts(output) -> list[str]:
    if output.get("output_type") == "stream":
        return [output.get("text", "")]
    data = output.get("data", {})
    return [data[key] if isinstance(data[key], str) else "".join(data[key])
            for key in ("text/plain", "text/html") if key in data]


def verdicts(nb) -> dict[str, set[str]]:
    """{cell id: {"C15 holds", "C15 reading", "C16 failed", "C22 not shown", "raised AssertionError", ...}} for every code cell
    that showed a verdict or raised."""
    found: dict[str, set[str]] = {}
    for number, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        marks = set()
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                failed = FAILED.search(output.get("evalue", ""))
                marks.add(f"{failed.group(1)} failed" if failed else f"raised {output.get('ename')}")
                continue
            for text in _texts(output):
                marks |= {f"{c} holds" for c in HOLDS.findall(text)}
                marks |= {f"{c} reading" for c in READING.findall(text)}
                marks |= {f"{c} not shown" for c in NOT_SHOWN.findall(text)}
        if marks:
            found[cell.get("id") or f"cell {number}"] = marks
    return found


def failures(found: dict[str, set[str]]) -> list[str]:
    """The marks of a run that are not a verdict a notebook may end with: 'failed' and 'raised'."""
    return sorted({m for marks in found.values() for m in marks if m.endswith(" failed") or m.startswith("raised")})


def _shown_or_not(marks: set[str]) -> set[str]:
    """The marks with 'holds' and 'not shown' made one: a cell that checks what the machine lets it check."""
    return {m.replace(" not shown", " holds") for m in marks}


def differences(idle: dict[str, set[str]], busy: dict[str, set[str]]) -> list[str]:
    """One line per cell whose verdicts differ between the two runs (empty: the same story).

    A claim that holds in one run and is 'not shown on this machine' in the other is no difference: the cell saw that
    the busy machine lacked what separates the claim from its counterfactual (a free core per stage, say) and said so
    instead of asserting; `not_shown_when_busy` lists those. A claim that holds in one run and fails in the other, a
    reading that appears or goes, or an error, is a difference."""
    return [f"cell {cell}: idle {sorted(idle.get(cell, ()))}, busy {sorted(busy.get(cell, ()))}"
            for cell in sorted(set(idle) | set(busy))
            if _shown_or_not(idle.get(cell, set())) != _shown_or_not(busy.get(cell, set()))]


def not_shown_when_busy(idle: dict[str, set[str]], busy: dict[str, set[str]]) -> list[str]:
    """The claims a cell showed in one run and said 'not shown on this machine' in the other: ['C23 (cell x)']."""
    return sorted({f"{m.split()[0]} (cell {cell})" for cell in set(idle) & set(busy)
                   for m in idle[cell] ^ busy[cell] if m.endswith(" not shown") or m.endswith(" holds")})


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


def executed_copy(idle: Path | None, notebook: Path) -> Path | None:
    """The idle run to compare with: `idle` itself (a file), or the notebook's name in it (a folder of executed
    copies, such as build/executed/); None when there is none."""
    if idle is None:
        return None
    path = idle / notebook.name if idle.is_dir() else idle
    return path if path.is_file() else None


def idle_seconds(nb) -> float | None:
    """The seconds nbval's cells took, as tools/site/capture.py kept them in an executed copy (None: not kept)."""
    return nb.metadata.get(BOOK_KEY, {}).get("seconds")


def check(notebook: Path, burns: list[int], idle: Path | None = None, out: Path | None = None, log=print) -> dict:
    """One notebook: its idle verdicts (the executed copy, or a run now), then a run per setting in `burns` (cores
    burned). Returns {"notebook", "idle_s", "idle_failures", "runs": [{"burn", "seconds", "ratio", "differences"}]}."""
    import nbformat

    copy = executed_copy(idle, notebook)
    if copy is not None:
        nb = nbformat.read(str(copy), as_version=4)
        seconds = idle_seconds(nb)
    else:
        nb, seconds = execute(notebook)
        log(f"{notebook.name}: idle run {seconds:.0f} s")
    found = verdicts(nb)
    result = {"notebook": notebook.name, "idle_s": seconds, "idle_failures": failures(found), "runs": []}
    for burn in burns:
        with burning(burn):
            busy_nb, busy_s = execute(notebook)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            nbformat.write(busy_nb, str(out / f"{notebook.stem}.burn{burn}.ipynb"))
        busy_found = verdicts(busy_nb)
        diff = differences(found, busy_found)
        ratio = busy_s / seconds if seconds else None
        result["runs"].append({"burn": burn, "seconds": round(busy_s, 1), "ratio": ratio and round(ratio, 2),
                               "differences": diff, "not_shown_when_busy": [] if diff else
                               not_shown_when_busy(found, busy_found)})
        log(f"{notebook.name}: {burn} core(s) burned {busy_s:.0f} s"
            + (f" ({ratio:.2f}x idle)" if ratio else "") + (": the same verdicts" if not diff else
                                                            ":\n  " + "\n  ".join(diff)))
    return result


def too_slow(run: dict) -> bool:
    """A run with one core burned that took more than MAX_RATIO times its idle seconds."""
    return run["burn"] == 1 and run["ratio"] is not None and run["ratio"] > MAX_RATIO


def table(results: list[dict], burns: list[int]) -> str:
    """The results as a Markdown table: idle seconds, each setting's seconds and ratio, and the verdicts."""
    head = "| notebook | idle (s) | " + " | ".join(f"{b} core{'s' if b > 1 else ''} burned (s)" for b in burns) + \
           " | verdicts |"
    rows = [head, "|" + "---|" * (len(burns) + 3)]
    for r in results:
        cells = []
        for run in r["runs"]:
            ratio = f" ({run['ratio']:.2f}x{', over ' + str(MAX_RATIO) + 'x' if too_slow(run) else ''})" \
                if run["ratio"] else ""
            cells.append(f"{run['seconds']:.0f}{ratio}")
        same = "idle run failed: " + ", ".join(r["idle_failures"]) if r["idle_failures"] else (
            "the same in every run" if not any(run["differences"] for run in r["runs"]) else
            "differ: " + "; ".join(f"{run['burn']} burned: {len(run['differences'])} cells" for run in r["runs"]
                                   if run["differences"]))
        unshown = sorted({c for run in r["runs"] for c in run.get("not_shown_when_busy", [])})
        if unshown:
            same += "; shown in one run, 'not shown on this machine' in another: " + ", ".join(unshown)
        idle = f"{r['idle_s']:.0f}" if r["idle_s"] else "?"
        rows.append(f"| {r['notebook']} | {idle} | " + " | ".join(cells) + f" | {same} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebooks", type=Path, nargs="+")
    p.add_argument("--idle", type=Path, help="an executed copy, or a folder of them, to compare with (default: run "
                                            "each notebook idle first)")
    p.add_argument("--burn", type=int, action="append", help="cores to keep busy during a run; repeat for several "
                                                             "settings (default: 1)")
    p.add_argument("--out", type=Path, help="keep the busy runs' executed copies and summary.json here")
    args = p.parse_args(argv)
    burns = args.burn or [1]
    if any(b < 1 for b in burns):
        p.error("--burn takes a number of cores, at least 1")
    results = [check(nb, burns, args.idle, args.out) for nb in args.notebooks]
    print(table(results, burns))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / "table.md").write_text(table(results, burns) + "\n")
    bad = [r["notebook"] for r in results if r["idle_failures"] or any(run["differences"] for run in r["runs"])]
    slow = [r["notebook"] for r in results if any(too_slow(run) for run in r["runs"])]
    if slow:
        print(f"over {MAX_RATIO}x their idle time with one core burned: {', '.join(slow)}")
    print(f"verdicts differ in: {', '.join(bad)}" if bad else "the same verdicts in every run")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
