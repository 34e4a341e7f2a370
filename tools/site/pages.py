"""The executed notebooks the book is made of: where they are, whether they can be used, and what each page holds.

A notebook can go into the book only when tools.site.capture wrote it from this very notebook (not stale), every
cell has an nbformat 4.5 id (the claims table links to cells by id), and every code cell ran and passed; otherwise
the reason names the notebook and the cell (`BuildError`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "executed"
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
OUT = ROOT / "build" / "site"
README = ROOT / "README.md"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for `from tools.site.capture import ...` wherever this module runs from

from tools.site.capture import META_KEY, source_digest  # noqa: E402  (what the capture plugin writes)

BOOK_NAME = "LLM Anatomy"
NOTEBOOK_NAME = re.compile(r"^(\d\d)_[a-z0-9_]+\.ipynb$")


class BuildError(Exception):
    """The book cannot be built; the message says which notebook and cell, and what to do."""


@dataclass
class Page:
    source: Path  # notebooks/NN_name.ipynb
    nb: object  # the executed notebook
    number: str  # "NN"
    title: str
    seconds: float
    environment: dict

    @property
    def stem(self) -> str:
        return self.source.stem

    @property
    def html_name(self) -> str:
        return f"{self.stem}.html"


@dataclass
class Book:
    out: Path
    pages: list[Page]
    claims: list[tuple[str, str, list]]  # (id, claim, [claims.ClaimLink])
    verdicts: dict[str, dict[str, int]] = field(default_factory=dict)  # {id: {"holds": n, "not shown": n, ...}}
    missing_stills: list[str] = field(default_factory=list)
    stills: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def index(self) -> Path:
        return self.out / "index.html"

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.out.rglob("*") if p.is_file())

    def summary(self) -> str:
        lines = [f"The book: {len(self.pages)} notebooks, {len(self.claims)} claims, {len(self.stills)} widget stills, "
                 f"{self.size_bytes() / 1e6:.1f} MB, rendered in {self.seconds:.1f} s."]
        for problem in self.missing_stills:
            lines.append(f"MISSING STILL: {problem}")
        lines.append(f"Open it: {self.index.resolve().as_uri()}")
        lines.append(f"  (or serve it: python -m http.server -b 127.0.0.1 -d {_shown(self.out)} 8000)")
        return "\n".join(lines)


def _shown(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def _source_text(cell) -> str:
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def _first_line(cell) -> str:
    for line in _source_text(cell).splitlines():
        if line.strip():
            return line.strip()[:100]
    return "(empty)"


def _cell_name(source: Path, nb, index: int) -> str:
    """'notebooks/03_attention.ipynb, cell 15 of 35 (nbval's Cell 6, id 5b1d8aff: `first line`)'.

    Cells count from 1 as a reader counts them in JupyterLab; nbval counts code cells from 0 in its reports.
    """
    cell = nb.cells[index]
    code_num = sum(1 for c in nb.cells[:index] if c.cell_type == "code")
    nbval = f"nbval's Cell {code_num}, " if cell.cell_type == "code" else ""
    return (f"{_shown(source)}, cell {index + 1} of {len(nb.cells)} "
            f"({nbval}id {cell.get('id', '?')}: `{_first_line(cell)}`)")


def _error_text(cell) -> str:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return f"{out.get('ename')}: {out.get('evalue')}"
    detail = cell.metadata.get(META_KEY, {}).get("detail", "")
    lines = [line for line in detail.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "failed"


def notebook_sources(notebooks: Path = NOTEBOOKS) -> list[Path]:
    """The course's notebooks (NN_name.ipynb) in course order."""
    return sorted(p for p in notebooks.glob("*.ipynb") if NOTEBOOK_NAME.match(p.name))


def _staleness(source: Path, executed_dir: Path):
    """(executed notebook or None, [why it cannot be used: not executed, not ours, or changed since it ran])."""
    import nbformat

    executed = executed_dir / source.name
    if not executed.exists():
        return None, [f"{_shown(source)} was not executed (no {_shown(executed)}): run `make site`"]
    nb = nbformat.read(str(executed), as_version=4)
    meta = nb.metadata.get(META_KEY)
    if not meta:
        return None, [f"{_shown(executed)} was not written by tools.site.capture: run `make site`"]
    current = nbformat.read(str(source), as_version=4)
    if meta.get("source_digest") != source_digest(current):
        when = (meta.get("environment") or {}).get("executed_at", "?")
        return None, [f"{_shown(source)} changed since it was executed ({when}): run `make site` again"]
    return nb, []


def failed_notebooks(executed: Path = EXECUTED) -> list[str]:
    """The executed notebooks with a cell that failed (their names), whose failure the run that executed them has
    already reported: what reports after it name, so that each failure is told once."""
    import nbformat

    names = []
    for path in sorted(executed.glob("*.ipynb")) if executed.is_dir() else []:
        nb = nbformat.read(str(path), as_version=4)
        if any(cell.metadata.get(META_KEY, {}).get("status") == "failed" for cell in nb.cells):
            names.append(path.name)
    return names


def freshness(notebooks: Path = NOTEBOOKS, executed: Path = EXECUTED) -> list[str]:
    """Why the executed notebooks are not those of the current notebooks ([] when every one is fresh)."""
    problems = []
    for source in notebook_sources(notebooks):
        problems += _staleness(source, executed)[1]
    return problems


def load_page(source: Path, executed_dir: Path) -> tuple[Page | None, list[str]]:
    """The executed notebook for `source`, or the reasons it cannot go into the book (notebook and cell named)."""
    nb, stale = _staleness(source, executed_dir)
    if nb is None:
        return None, stale
    meta = nb.metadata[META_KEY]
    without_id = [i for i, cell in enumerate(nb.cells) if not cell.get("id")]
    if without_id:  # the claims table links to cells by id: nbformat 4.5 gives every cell one
        return None, [f"{_shown(source)}: cell {without_id[0] + 1} has no id (nbformat {nb.nbformat}."
                      f"{nb.nbformat_minor}; cell ids need 4.5): run `make notebooks`"]
    failed, not_run = [], []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        status = cell.metadata.get(META_KEY, {}).get("status", "not run")
        if status == "failed":
            failed.append(index)
        elif status == "not run":
            not_run.append(index)
    if failed:  # the first failure is the one to fix; later cells often fail because of it
        later = f" ({len(failed) - 1} later cell(s) failed too)" if len(failed) > 1 else ""
        return None, [f"{_cell_name(source, nb, failed[0])} failed: {_error_text(nb.cells[failed[0]])}{later}"]
    if not_run:
        return None, [f"{_cell_name(source, nb, not_run[0])} and {len(not_run) - 1} code cell(s) after it never ran "
                      "(the run stopped early, or ran only part of the notebook): run `make site`"]
    number = NOTEBOOK_NAME.match(source.name).group(1)
    environment = meta.get("environment") or {}
    return Page(source, nb, number, _title(nb, source), float(meta.get("seconds", 0)), environment), []


def _title(nb, source: Path) -> str:
    """The notebook's first level-1 heading ('03 · Attention'), else its file name."""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in _source_text(cell).splitlines():
            match = re.match(r"^#\s+(.+)$", line)
            if match:
                return match.group(1).strip()
    return source.stem.replace("_", " ")
