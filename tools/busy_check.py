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
runs this on notebooks 05, 06, 07, 09 and 12 with a core burned, after nbval's own run of them (the idle one).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
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


WINDOW_S = 0.2  # a top-up burner decides every this many seconds whether to spin or to sleep


def _tree(root: int) -> set[int]:
    """`root` and every process below it (Linux: /proc/<pid>/task/<tid>/children)."""
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split() if int(c) not in found]
        except OSError:
            continue
    return found


def _jiffies(pid: int) -> int:
    """The CPU time of one process, every thread (user + system), in clock ticks; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def _machine_busy() -> int:
    """Every core's busy time since boot (all but idle and iowait), in clock ticks."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4]


def others_load(root: int, before: tuple[float, int, dict[int, int]] | None = None):
    """The cores that processes outside `root`'s tree kept busy since `before` (None: start counting); returns
    (cores or None, the state to pass next time)."""
    now = (time.monotonic(), _machine_busy(), {pid: _jiffies(pid) for pid in _tree(root)})
    if before is None:
        return None, now
    seconds = now[0] - before[0]
    mine = sum(j - before[2].get(pid, 0) for pid, j in now[2].items())
    hz = os.sysconf("SC_CLK_TCK")
    return max(0.0, (now[1] - before[1] - mine) / hz / seconds) if seconds > 0 else None, now


def _top_up(seconds: float, cores: float, root: int, read_load=None, spin=None, rest=time.sleep) -> None:
    """Spin only while the processes outside `root`'s tree (the runner, its kernel and the burners) keep fewer than
    `cores` cores busy: the notebook always has at least that much other work beside it, and no core is burned
    when other work (the unit tests of the same pytest session, say) already keeps it busy. The first window spins;
    each later one spins or rests on the last window's reading (`read_load`, `spin` and `rest` stand in for the
    machine in tests)."""
    end = time.monotonic() + seconds
    if read_load is None:
        try:
            state = others_load(root)[1]
        except (OSError, ValueError):  # no /proc: burn as _burn does
            return _burn(seconds)

        def read_load():
            nonlocal state
            load, state = others_load(root, state)
            return load

    spin = spin or _burn
    busy = True
    while time.monotonic() < end:
        (spin if busy else rest)(WINDOW_S)
        load = read_load()
        busy = load is None or load < cores


@contextmanager
def burning(cores: int, seconds: float = 1800, top_up: bool = False):
    """`cores` processes spinning (spawned, stopped on the way out) while the block runs. With `top_up`, burner k
    spins only while other programs keep fewer than k + 1 cores busy (see _top_up)."""
    context = multiprocessing.get_context("spawn")
    burners = [context.Process(target=_top_up, args=(seconds, k + 1, os.getpid()), daemon=True) if top_up else
               context.Process(target=_burn, args=(seconds,), daemon=True) for k in range(cores)]
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


def check(notebook: Path, burns: list[int], idle: Path | None = None, out: Path | None = None, log=print,
          top_up: bool = False) -> dict:
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
        with burning(burn, top_up=top_up):
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


def busy_runs(notebooks: list[Path], out: Path, burn: int = 1, top_up: bool = False, log=print) -> dict:
    """Each notebook run with `burn` cores burned (topped up, with `top_up`), its executed copy kept as
    out/<stem>.burn<burn>.ipynb and its seconds in out/busy.json, written after each notebook; the comparison with an
    idle run is left to the caller (tests/test_busy_machine.py reads these when make test ran them beside the unit
    tests: tests/busy_background.py)."""
    import nbformat

    out.mkdir(parents=True, exist_ok=True)
    seconds = {}
    for notebook in notebooks:
        with burning(burn, top_up=top_up):
            nb, seconds[notebook.name] = execute(notebook)
        nbformat.write(nb, str(out / f"{notebook.stem}.burn{burn}.ipynb"))
        (out / "busy.json").write_text(json.dumps(seconds, indent=1) + "\n")
        log(f"{notebook.name}: {burn} core(s) burned{' (topped up)' if top_up else ''} {seconds[notebook.name]:.0f} s")
    return seconds


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
    p.add_argument("--busy-only", action="store_true", help="no idle run and no comparison: only the busy runs, "
                                                             "kept in --out (for tests/test_busy_machine.py)")
    p.add_argument("--top-up", action="store_true", help="burn only what other programs leave free of the --burn "
                                                          "cores (see _top_up)")
    args = p.parse_args(argv)
    burns = args.burn or [1]
    if any(b < 1 for b in burns):
        p.error("--burn takes a number of cores, at least 1")
    if args.busy_only:
        if args.out is None or len(burns) != 1:
            p.error("--busy-only needs --out and one --burn")
        busy_runs(args.notebooks, args.out, burns[0], args.top_up)
        return 0
    results = [check(nb, burns, args.idle, args.out, top_up=args.top_up) for nb in args.notebooks]
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
