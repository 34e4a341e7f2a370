"""The cells a widget needs: the widget's own cell and, transitively, the cells that define the names it reads.

nbval already runs every notebook top to bottom (and tests/browser/test_00_setup_and_tour.py runs notebook 00 in
the browser with Run All); the other browser tests are about a widget, so they open a slice of its notebook: the
cell that builds the widget, and for every name that cell reads, the last cell above it that binds the name, and so
on for those cells. Measurements the widget does not read are left out, which is what keeps the browser tests from
executing each notebook a second time.

The analysis is by name (Python's ast): a cell that only mutates an object in place (`tok.padding_side = "left"`)
is not pulled in. A slice that misses something fails loudly (a NameError in the browser), never silently.
"""

from __future__ import annotations

import ast
import builtins
import json
import re
from pathlib import Path

BUILTINS = frozenset(dir(builtins)) | {"display", "get_ipython", "__file__"}


def _python(source: str) -> str:
    """The cell's source without IPython's magics and shell escapes (they read and bind no names we track)."""
    return "\n".join("" if re.match(r"\s*[%!]", line) else line for line in source.splitlines())


def _bound_inside(node: ast.AST) -> set[str]:
    """Names bound only within a nested scope of `node`: comprehension targets, lambda and def arguments,
    and everything a def or class body assigns (those do not leak into the notebook's namespace)."""
    inner = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.comprehension):
            inner |= {n.id for n in ast.walk(sub.target) if isinstance(n, ast.Name)}
        elif isinstance(sub, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            args = sub.args
            inner |= {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
            inner |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
            if not isinstance(sub, ast.Lambda):
                inner |= {n.id for body in sub.body for n in ast.walk(body)
                          if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return inner


def _binds(statement: ast.stmt) -> set[str]:
    """Names a top-level statement binds in the notebook's namespace."""
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in statement.names}
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    inner = _bound_inside(statement)
    return {n.id for n in ast.walk(statement)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id not in inner}


def _statements(source: str) -> list[tuple[str, set[str], set[str]]]:
    """The cell's top-level statements as (source lines, names it reads, names it binds)."""
    text = _python(source)
    lines, found = text.splitlines(), []
    for statement in ast.parse(text).body:
        first = min([statement.lineno] + [d.lineno for d in getattr(statement, "decorator_list", [])])
        inner = _bound_inside(statement)
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner |= {statement.name}
        loads = {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        found.append(("\n".join(lines[first - 1:statement.end_lineno]), loads - inner - BUILTINS, _binds(statement)))
    return found


def reads_and_binds(source: str) -> tuple[set[str], set[str]]:
    """(names the cell reads before binding them itself, names the cell binds)."""
    reads, bound = set(), set()
    for _, loads, binds in _statements(source):
        reads |= loads - bound
        bound |= binds
    return reads, bound


def needed_statements(sources: list[str], target: int) -> dict[int, list[int]]:
    """For each cell that the target cell needs: the indexes of its statements that are needed, ascending.

    The target cell is kept whole. Every name a kept statement reads is looked up in the statements above it
    (in its own cell first, then the cells above): the last one that binds the name is kept too, transitively."""
    units = [(c, k, *unit) for c, source in enumerate(sources[:target + 1])
             for k, unit in enumerate(_statements(source))]
    order = {(c, k): i for i, (c, k, *_) in enumerate(units)}
    keep = {i for i, unit in enumerate(units) if unit[0] == target}
    todo = list(keep)
    while todo:
        reader = todo.pop()
        for name in units[reader][3]:
            definers = [i for i in range(reader) if name in units[i][4]]
            if definers and definers[-1] not in keep:
                keep.add(definers[-1])
                todo.append(definers[-1])
    cells: dict[int, list[int]] = {}
    for c, k in sorted((units[i][0], units[i][1]) for i in keep):
        cells.setdefault(c, []).append(k)
    assert all((c, k) in order for c, ks in cells.items() for k in ks)
    return cells


def write_widget_slice(notebook: Path, marker: str, out: Path) -> dict[int, int]:
    """Write to `out` a notebook of what the one code cell of `notebook` containing `marker` needs: that cell
    whole, and from each cell above it the statements it needs (in order, outputs empty). Return, for each
    original cell kept (0-based, counting every cell), how many statements of it were kept."""
    nb = json.loads(notebook.read_text())
    code = [i for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "code"]
    sources = ["".join(nb["cells"][i]["source"]) for i in code]
    targets = [j for j, s in enumerate(sources) if marker in s]
    if len(targets) != 1:
        raise ValueError(f"{notebook.name}: {len(targets)} code cells contain {marker!r}; the slice needs exactly one")
    kept = needed_statements(sources, targets[0])
    cells = []
    for j, statements in kept.items():
        units = _statements(sources[j])
        source = sources[j] if j == targets[0] else "\n".join(units[k][0] for k in statements)
        cells.append(dict(nb["cells"][code[j]], source=source, outputs=[], execution_count=None))
    summary = {code[j]: len(statements) for j, statements in kept.items()}
    intro = {"cell_type": "markdown", "metadata": {}, "source": [
        f"A slice of {notebook.name} for the browser test: from each of the cells {list(summary)} (0-based), the "
        "statements its widget needs."]}
    out.write_text(json.dumps(dict(nb, cells=[intro] + cells), indent=1))
    return summary
