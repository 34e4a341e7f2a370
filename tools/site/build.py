"""Render the executed notebooks into a static HTML book. Nothing is executed here and nothing is fetched.

    python -m tools.site build [--strict]      # build/executed/ + test-artifacts/screenshots/ -> build/site/

Input: the notebooks that nbval executed with `-p tools.site.capture --executed-to=build/executed` (make site and
make test do this), the widget stills that the browser tests saved in test-artifacts/screenshots/, and README.md
(its table of claims and its table of contents). Output, in build/site/ (git ignores build/):

- index.html: the contents in course order, the machine and versions the book was executed on, and the claims
  table, each claim linked to the cell that demonstrates it (`NN_name.html#cell-id=<id>`: nbformat 4.5 cell ids,
  committed with the notebooks, so the anchors stay put while the text around them changes);
- one page per notebook, rendered by nbconvert's lab template without any script: its outputs and figures as
  they were computed, each widget replaced by a still of its real rendering and a line saying how to run it live;
- static/: the JupyterLab stylesheet, once; stills/: the widget stills; NN_name_files/: the figures.

The build stops (BuildError) when a notebook was not executed, is stale (changed since it ran), or has a cell that
failed or never ran: the message names the notebook and the cell. A widget without a still is reported; with
--strict (the browser check) that stops the build too. Any page that would load something from another host stops
the build: the book works offline.
"""

from __future__ import annotations

import datetime as _dt
import functools
import html
import json
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "executed"
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
OUT = ROOT / "build" / "site"
README = ROOT / "README.md"
TEMPLATES = Path(__file__).resolve().parent / "templates"
WIDGETS = ROOT / "lib" / "llm_anatomy" / "widgets"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for `from tools.site.capture import ...` wherever this module runs from

from tools.site.capture import META_KEY, source_digest  # noqa: E402  (what the capture plugin writes)

BOOK_NAME = "LLM Anatomy"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
COLAB_SETUP_MARKER = "# Set-up for Google Colab"
NOTEBOOK_NAME = re.compile(r"^(\d\d)_[a-z0-9_]+\.ipynb$")

# The still the book shows for a widget (root CSS class `la-<name>`): as the cell creates it where that says enough,
# else after the browser test has used it (the caption says so). Widgets not listed here use NN_<name>_start.png,
# else the first NN_<name>_*.png by name that the browser tests saved.
PREFERRED_STILLS = {
    "la-playground": "playground_sample",
    "la-attention": "attention_start",
    "la-kvcalc": "kvcalc_start",
    "la-stepper": "stepper_finished",  # as created it is empty: show a whole greedy answer, token by token
    "la-serving": "serving_shared",
}
AS_CREATED = ("start", "sample")  # still names that show a widget as its cell creates it

# Anything a page would load from elsewhere: src/srcset/data attributes, <link href>, CSS url() and @import.
EXTERNAL_LOAD = re.compile(
    r"""(?:\b(?:src|srcset|data|poster|background)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//"""
    r"""|<link\b[^>]*\bhref\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//"""
    r"""|url\(\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//"""
    r"""|@import\s+["']\s*(?:[a-z][a-z0-9+.-]*:)?//)""", re.I)


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
class ClaimLink:
    page: Page
    cell_id: str
    label: str
    rank: int  # 0: a claim()/reading() cell, 1: a heading, 2: the text, 3: the objectives or summary

    @property
    def href(self) -> str:
        return f"{self.page.html_name}#cell-id={self.cell_id}"


@dataclass
class Book:
    out: Path
    pages: list[Page]
    claims: list[tuple[str, str, list[ClaimLink]]]
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


# --------------------------------------------------------------------------- reading the executed notebooks


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


# --------------------------------------------------------------------------- README: claims and contents


def readme_claims(readme: Path) -> list[tuple[str, str]]:
    """[(id, claim)] from README's table of claims (`| C1 | A tokenizer ... |`)."""
    rows = re.findall(r"^\|\s*(C\d{1,2})\s*\|\s*(.+?)\s*\|\s*$", readme.read_text(encoding="utf-8"), re.M)
    if not rows:
        raise BuildError(f"{_shown(readme)} has no table of claims (rows like `| C1 | ... |`)")
    return rows


def readme_contents(readme: Path) -> dict[str, str]:
    """{notebook file name: 'what you do'} from README's contents table."""
    found = {}
    for line in readme.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\|\s*\[notebooks/(\d\d_[a-z0-9_]+\.ipynb)\]\([^)]*\)\s*\|\s*(.*?)\s*\|", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


CLAIM_CALL = re.compile(r"\b(?:claim|reading)\(\s*[\"'](C\d{1,2})[\"']")


def claim_links(pages: list[Page], claim_ids: list[str]) -> dict[str, list[ClaimLink]]:
    """For each claim, per notebook, the cell that best demonstrates it.

    Best is a code cell that checks it (`claim("C8", ...)` or `reading("C11", ...)`), then a heading that names it
    ("## 5. The roofline (C11)"), then text that names it, then the objectives or the summary.
    """
    links: dict[str, list[ClaimLink]] = {cid: [] for cid in claim_ids}
    for page in pages:
        best: dict[str, ClaimLink] = {}
        section, intro, summary = page.title, True, False
        for cell in page.nb.cells:
            text = _source_text(cell)
            found: dict[str, int] = {}
            if cell.cell_type == "markdown":
                for line in text.splitlines():
                    heading = re.match(r"^(#+)\s+(.+)$", line)
                    if heading:
                        if len(heading.group(1)) >= 2:
                            intro = False
                        summary = summary or bool(re.match(r"(?i)summary\b", heading.group(2)))
                        section = re.sub(r"[*_`]", "", heading.group(2)).strip()
                    if line.lstrip().startswith("|"):
                        continue  # a table row (a map of the course) refers to claims; it shows none
                    rank = 1 if heading and not intro and not summary else (3 if intro or summary else 2)
                    line = re.sub(r"\bC\d{1,2}\s*[\u2013-]\s*C\d{1,2}\b", "", line)  # a range names, shows none
                    for cid in re.findall(r"\b(C\d{1,2})\b", line):
                        found[cid] = min(found.get(cid, 9), rank)
            elif cell.cell_type == "code":
                for cid in CLAIM_CALL.findall(text):
                    found[cid] = 0
            for cid, rank in found.items():
                if cid in links and (cid not in best or rank < best[cid].rank):
                    label = page.title if section == page.title else f"{page.number} · {_claimless(section)}"
                    best[cid] = ClaimLink(page, cell.get("id", ""), label, rank)
        for cid, link in best.items():
            links[cid].append(link)
    return links


def _claimless(title: str) -> str:
    """'5. The roofline (C11)' -> '5. The roofline'."""
    return re.sub(r"\s*\((?:claims?\s*)?C\d{1,2}(?:\s*,\s*C\d{1,2})*\)", "", title).strip()


# --------------------------------------------------------------------------- widgets become stills


@functools.lru_cache(maxsize=4)
def course_widgets(folder: Path = WIDGETS) -> dict[str, str]:
    """{widget class: its root CSS class} for the course's widgets, read from their source.

    Each widget adds its root class in its constructor, `self.add_class("la-<name>")` (the convention in
    lib/llm_anatomy/widgets/__init__.py); the executed notebook only keeps the widget's repr, which IPython cuts
    short, so the class name is what identifies it.
    """
    found = {}
    for path in sorted(folder.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        starts = [(m.start(), m.group(1)) for m in re.finditer(r"^class (\w+)\(", text, re.M)] + [(len(text), "")]
        for (start, name), (end, _) in zip(starts, starts[1:]):
            root = re.search(r"self\.add_class\(\s*[\"'](la-[a-z0-9]+)[\"']\s*\)", text[start:end])
            if root:
                found[name] = root.group(1)
    return found


def _widget_class(output) -> tuple[str | None, str]:
    """(root CSS class `la-...` or None, Python class name) of a widget output, from its text/plain repr."""
    text = output.get("data", {}).get("text/plain", "")
    text = text if isinstance(text, str) else "".join(text)
    name = re.match(r"^\s*(\w+)\(", text)
    name = name.group(1) if name else "widget"
    known = course_widgets().get(name)
    if known:
        return known, name
    classes = re.findall(r"_dom_classes=\(([^)]*)\)", text)
    if classes and not text.rstrip().endswith(("\u2026", "...")):
        # A repr in full (IPython cuts long ones with an ellipsis, and then the last classes are a child's):
        # the root's keyword arguments come after its children, so the last _dom_classes are the root's.
        names = re.findall(r"['\"]([\w-]+)['\"]", classes[-1])
        return next((c for c in names if c.startswith("la-")), None), name
    return None, name


def find_still(number: str, css_class: str | None, screenshots: Path) -> Path | None:
    if not css_class:
        return None
    short = css_class.removeprefix("la-")
    candidates = []
    if css_class in PREFERRED_STILLS:
        candidates.append(screenshots / f"{number}_{PREFERRED_STILLS[css_class]}.png")
    candidates.append(screenshots / f"{number}_{short}_start.png")
    candidates.extend(sorted(screenshots.glob(f"{number}_{short}_*.png")))
    return next((p for p in candidates if p.is_file()), None)


def _still_output(page: Page, still: str | None, widget: str, css_class: str | None, screenshots: Path) -> dict:
    live = (f"Widgets do not run in a static page: run it live with <code>make lab</code>, "
            f"notebook {page.number} (<code>{html.escape(page.source.name)}</code>).")
    if still:
        state = Path(still).stem.removeprefix(f"{page.number}_{(css_class or '').removeprefix('la-')}_")
        used = "" if state in AS_CREATED else f", after the browser test used it ({state.replace('_', ' ')})"
        body = (f'<figure class="book-still" data-widget="{html.escape(css_class or widget)}">'
                f'<img src="stills/{html.escape(still)}" alt="{html.escape(widget)}, as it renders in JupyterLab">'
                f"<figcaption>A still of the <b>{html.escape(widget)}</b> widget as JupyterLab renders it"
                f"{html.escape(used)} (saved by the browser tests). {live}</figcaption></figure>")
    else:
        expected = (f"{_shown(screenshots)}/{page.number}_{css_class.removeprefix('la-')}_start.png" if css_class
                    else "a still named in tools/site/build.py PREFERRED_STILLS")
        body = (f'<div class="book-still-missing" data-widget="{html.escape(css_class or widget)}">'
                f"&#9888; No still of the <b>{html.escape(widget)}</b> widget: the browser tests did not save "
                f"<code>{html.escape(expected)}</code>. {live}</div>")
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": body, "text/plain": widget}}


# --------------------------------------------------------------------------- rendering


def _prepare(page: Page, screenshots: Path, stills_dir: Path, book: Book):
    """A copy of the executed notebook as the book shows it."""
    import copy

    import nbformat

    nb = copy.deepcopy(page.nb)
    cells = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and _source_text(cell).startswith(COLAB_SETUP_MARKER):
            continue  # does nothing outside Colab; the badge above it stays, as a link
        if cell.cell_type == "markdown":
            text = _source_text(cell)
            # An image from the internet (the Colab badge) becomes its text; the link around it stays.
            text = re.sub(r"!\[([^\]]*)\]\(\s*(?:https?:)?//[^)]*\)", r"\1", text)
            text = re.sub(r"<img\b[^>]*\bsrc\s*=\s*[\"']?(?:https?:)?//[^>]*>", "", text, flags=re.I)
            cell.source = text
        if cell.cell_type == "code":
            outputs = []
            for out in cell.get("outputs", []):
                if WIDGET_MIME in out.get("data", {}):
                    css_class, widget = _widget_class(out)
                    still = find_still(page.number, css_class, screenshots)
                    if still:
                        stills_dir.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(still, stills_dir / still.name)
                        book.stills.append(still.name)
                    else:
                        book.missing_stills.append(
                            f"{_cell_name(page.source, page.nb, index)} shows "
                            f"the {widget} widget ({css_class or 'no la- class'}), and no still of it exists in "
                            f"{_shown(screenshots)}/: run the browser tests (`make screenshots` or `make test`)")
                    out = nbformat.from_dict(_still_output(page, still.name if still else None, widget, css_class,
                                                           screenshots))
                outputs.append(out)
            cell.outputs = outputs
        cells.append(cell)
    nb.cells = cells
    count = 0  # In [1] is the first cell the page shows
    for cell in cells:
        if cell.cell_type == "code" and cell.get("execution_count"):
            count += 1
            cell.execution_count = count
            for out in cell.outputs:
                if out.get("output_type") == "execute_result":
                    out["execution_count"] = count
    nb.metadata.pop("widgets", None)
    return nb


def _nav(pages: list[Page], current: Page | None) -> str:
    items = ['<a class="book-home" href="index.html">LLM Anatomy</a>']
    if current is not None:
        at = pages.index(current)
        if at > 0:
            items.append(f'<a rel="prev" href="{pages[at - 1].html_name}">&larr; {html.escape(pages[at - 1].title)}</a>')
        items.append('<a href="index.html#contents">Contents</a>')
        if at + 1 < len(pages):
            items.append(f'<a rel="next" href="{pages[at + 1].html_name}">{html.escape(pages[at + 1].title)} &rarr;</a>')
    return '<nav class="book-nav">' + " ".join(items) + "</nav>"


def _environment_line(env: dict) -> str:
    when = env.get("executed_at", "?").replace("T", " ").replace("+00:00", " UTC")
    device = env.get("device", "?")
    commit = f", commit {env['commit']}" if env.get("commit") else ""
    return f"executed {html.escape(when)} on {html.escape(device)}{html.escape(commit)}"


def _footer(page: Page) -> str:
    return (f'<footer class="book-footer">This page shows notebook {page.number} '
            f"(<code>notebooks/{html.escape(page.source.name)}</code>) as it ran: {_environment_line(page.environment)}, "
            f"in {page.seconds:.0f} s of cell time. Run it yourself: <code>make lab</code>. "
            f'<a href="index.html">Contents</a></footer>')


def _stylesheet() -> str:
    """JupyterLab's light theme and nbconvert's code colours, once for every page."""
    from jupyter_core.paths import jupyter_path
    from jupyterlab_pygments import JupyterStyle
    from pygments.formatters import HtmlFormatter

    for base in jupyter_path("nbconvert", "templates"):
        static = Path(base) / "lab" / "static"
        if (static / "index.css").is_file():
            parts = [(static / "index.css").read_text(encoding="utf-8"),
                     (static / "theme-light.css").read_text(encoding="utf-8")]
            break
    else:
        raise BuildError("nbconvert's lab template (static/index.css) was not found: pip install nbconvert")
    parts.append(HtmlFormatter(style=JupyterStyle).get_style_defs(".highlight"))
    return "\n".join(parts)


def render_pages(pages: list[Page], out: Path, screenshots: Path, book: Book) -> None:
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    config = Config()
    config.HTMLExporter.template_name = "lab"
    config.HTMLExporter.template_file = "page.html.j2"
    config.HTMLExporter.extra_template_basedirs = [str(TEMPLATES)]
    config.HTMLExporter.extra_template_paths = [str(TEMPLATES)]
    config.HTMLExporter.exclude_anchor_links = False
    config.HTMLExporter.embed_images = False
    config.ExtractOutputPreprocessor.enabled = True
    config.CSSHTMLHeaderPreprocessor.enabled = False
    exporter = HTMLExporter(config=config)
    for page in pages:
        nb = _prepare(page, screenshots, out / "stills", book)
        nb.metadata["title"] = page.title
        files_dir = f"{page.stem}_files"
        resources = {"unique_key": page.stem, "output_files_dir": files_dir,
                     "book": {"title": page.title, "name": BOOK_NAME, "nav": _nav(pages, page),
                              "footer": _footer(page)}}
        body, resources = exporter.from_notebook_node(nb, resources=resources)
        for name, data in (resources.get("outputs") or {}).items():
            target = out / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data if isinstance(data, bytes) else data.encode())
        (out / page.html_name).write_text(_book_links(body), encoding="utf-8")


# A notebook's markdown links to another notebook by its file name; in the book that is the other page.
_NOTEBOOK_LINK = re.compile(r'href="(?:\.?/)?(\d\d_[a-z0-9_]+)\.ipynb(#[^"]*)?"')


def _book_links(body: str) -> str:
    """Links between notebooks (`08_serving.ipynb`, `./08_serving.ipynb#...`) pointed at their pages in the book."""
    return _NOTEBOOK_LINK.sub(lambda m: f'href="{m.group(1)}.html{m.group(2) or ""}"', body)


def render_index(book: Book, contents: dict[str, str], environment: dict) -> None:
    pages = book.pages
    toc = "\n".join(
        f'<li><a href="{p.html_name}">{html.escape(p.title)}</a>'
        f'{" <span class=book-what>" + _inline_md(contents[p.source.name]) + "</span>" if contents.get(p.source.name) else ""}'
        f' <span class="book-time">{p.seconds:.0f} s</span></li>' for p in pages)
    rows = []
    for cid, text, links in book.claims:
        cells = " · ".join(f'<a class="book-claim-link" href="{html.escape(link.href)}">{html.escape(link.label)}</a>'
                           for link in links) or '<span class="book-claim-missing">no cell demonstrates it</span>'
        rows.append(f'<tr id="{cid}"><td>{cid}</td><td>{_inline_md(text)}</td><td>{cells}</td></tr>')
    env = environment
    packages = ", ".join(f"{html.escape(k)} {html.escape(str(v))}" for k, v in (env.get("packages") or {}).items())
    machine = [
        ("device", env.get("device", "?") + (f" ({env['dtype']})" if env.get("dtype") else "")),
        ("processor", f"{env.get('processor', '?')}, {env.get('cpu_cores', '?')} logical cores, "
                      f"{env.get('ram_total_gb', '?')} GB RAM"
                      + (f", GPU memory {env['gpu_memory_total_gb']} GB" if env.get("gpu_memory_total_gb") else "")),
        ("system", f"{env.get('platform', '?')}, Python {env.get('python', '?')}"),
        ("packages", packages or "?"),
        ("model", env.get("default_model", "?")),
        ("executed", env.get("executed_at", "?").replace("T", " ").replace("+00:00", " UTC")
                     + (f", commit {env['commit']}" if env.get("commit") else "")),
        ("cell time", f"{sum(p.seconds for p in pages):.0f} s for the {len(pages)} notebooks"),
    ]
    runs = {p.environment.get("executed_at") for p in pages}
    note = ("" if len(runs) <= 1 else
            f"<p class='book-note'>The pages come from {len(runs)} runs; each page's footer says when and where it ran.</p>")
    machine_rows = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{v if k == 'packages' else html.escape(str(v))}</td></tr>"
                             for k, v in machine)
    built = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", " UTC")
    index = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8" />
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{BOOK_NAME}: the course, executed</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="static/lab.css">
<link rel="stylesheet" href="static/book.css">
</head>
<body class="book-index">
{_nav(pages, None)}
<main>
<h1>{BOOK_NAME}: the course, executed</h1>
<p>Every notebook of the course, run top to bottom on the machine below, with its outputs, figures and measured
numbers. The notebooks in the repository carry no outputs; this book shows what they print and draw. Widgets do not
run in a static page: each one is shown as a still of its real rendering, and <code>make lab</code> runs it live.
Rebuild this book with <code>make site</code>.</p>
<h2 id="machine">Executed on</h2>
<table class="book-machine">
{machine_rows}
</table>
{note}
<h2 id="contents">Contents</h2>
<ol class="book-toc" start="0">
{toc}
</ol>
<h2 id="claims">The claims the course demonstrates</h2>
<p>Each claim links to the cell that demonstrates it on the real model.</p>
<table class="book-claims">
<thead><tr><th>id</th><th>claim</th><th>where it is shown</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table>
</main>
<footer class="book-footer">Built {built} by <code>python -m tools.site build</code> from <code>build/executed/</code>.</footer>
</body>
</html>
"""
    book.index.write_text(index, encoding="utf-8")


def _inline_md(text: str) -> str:
    """The README's table cells: `code`, **bold**, *italic* and links, escaped."""
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"(?<!\*)\*([^*]+)\*(?!\*)", r"<i>\1</i>", text)
    return text


BOOK_CSS = """
/* What nbconvert's lab template puts inline in every page, once here. */
* { -webkit-print-color-adjust: exact; }
a.anchor-link { display: none; } :is(h1, h2, h3, h4):hover > a.anchor-link { display: inline; margin-left: 4px; }
.jp-InputArea, .jp-InputArea-editor { overflow: hidden; }
.cm-editor.cm-s-jupyter .highlight pre { padding: var(--jp-code-padding) 4px; margin: 0; font-family: inherit;
  font-size: inherit; line-height: inherit; color: inherit; }
.jp-OutputArea-output pre { line-height: inherit; font-family: inherit; }
.jp-RenderedText pre { color: var(--jp-content-font-color1); font-size: var(--jp-code-font-size); }
.jp-Collapser { display: none; }
@page { margin: 0.5in; }
@media print { .jp-Cell-inputWrapper, .jp-Cell-outputWrapper { display: block; } .book-nav { display: none; } }
/* The book's own. */
body.book-page main, body.book-index main { max-width: 1100px; margin: 0 auto; padding: 8px 16px 32px; }
.book-nav { position: sticky; top: 0; z-index: 10; display: flex; gap: 18px; flex-wrap: wrap; padding: 8px 16px;
  background: #f3f5f7; border-bottom: 1px solid #d0d7de; font: 14px/1.4 system-ui, sans-serif; }
.book-nav a { color: #0b5cad; text-decoration: none; } .book-nav a:hover { text-decoration: underline; }
.book-nav .book-home { font-weight: 600; color: #222; }
.book-footer { max-width: 1100px; margin: 24px auto; padding: 12px 16px; border-top: 1px solid #d0d7de;
  color: #555; font: 13px/1.5 system-ui, sans-serif; }
.book-index { font: 15px/1.55 system-ui, sans-serif; color: #222; }
.book-index table { border-collapse: collapse; margin: 8px 0 16px; }
.book-index th, .book-index td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
.book-machine th { background: #f6f8fa; white-space: nowrap; }
.book-index a { color: #0b5cad; text-decoration: none; } .book-index a:hover { text-decoration: underline; }
.book-toc li { margin: 4px 0; } .book-toc .book-what { color: #444; } .book-toc .book-what::before { content: "— "; }
.book-toc .book-time { color: #777; font-size: 12px; }
.book-claims td:first-child { font-weight: 600; white-space: nowrap; }
.book-claim-link { white-space: nowrap; } .book-claim-missing { color: #b00020; }
figure.book-still { margin: 4px 0; } figure.book-still img { max-width: 100%; border: 1px solid #d0d7de;
  border-radius: 4px; } figure.book-still figcaption { color: #555; font-size: 13px; margin-top: 4px; }
.book-still-missing { padding: 8px 12px; border: 2px dashed #b00020; color: #b00020; }
:target { scroll-margin-top: 48px; outline: 3px solid #f2c94c; outline-offset: 2px; }
"""


# --------------------------------------------------------------------------- checks and the whole build


def external_loads(out: Path) -> list[str]:
    """'page: snippet' for everything under `out` that would load from another host."""
    found = []
    for path in sorted(out.rglob("*")):
        if path.suffix not in (".html", ".css", ".svg", ".js"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in EXTERNAL_LOAD.finditer(text):
            snippet = text[max(0, match.start() - 40): match.end() + 60].replace("\n", " ")
            found.append(f"{path.relative_to(out).as_posix()}: ...{snippet}...")
    return found


def build_book(notebooks: Path = NOTEBOOKS, executed: Path = EXECUTED, screenshots: Path = SCREENSHOTS,
               out: Path = OUT, readme: Path = README, strict: bool = False) -> Book:
    """Build the book; raise BuildError (notebook and cell named) when it cannot be built as it should."""
    start = time.perf_counter()
    sources = notebook_sources(notebooks)
    if not sources:
        raise BuildError(f"no notebooks (NN_name.ipynb) in {_shown(notebooks)}")
    pages, problems = [], []
    for source in sources:
        page, found = load_page(source, executed)
        problems.extend(found)
        if page is not None:
            pages.append(page)
    if problems:
        raise BuildError("the book cannot be built:\n" + "\n".join(f"- {p}" for p in problems))
    claims = readme_claims(readme)
    links = claim_links(pages, [cid for cid, _ in claims])
    unlinked = [cid for cid, _ in claims if not links[cid]]
    if unlinked:
        raise BuildError(f"no cell in any notebook demonstrates claim(s) {', '.join(unlinked)} of README's table "
                         "(name the claim in a heading or a claim()/reading() cell)")
    if out.exists():
        shutil.rmtree(out)
    (out / "static").mkdir(parents=True)
    (out / "static" / "lab.css").write_text(_stylesheet(), encoding="utf-8")
    (out / "static" / "book.css").write_text(BOOK_CSS, encoding="utf-8")
    book = Book(out, pages, [(cid, text, links[cid]) for cid, text in claims])
    render_pages(pages, out, screenshots, book)
    environment = _latest_environment(executed, pages)
    render_index(book, readme_contents(readme), environment)
    (out / "book.json").write_text(json.dumps({
        "pages": [{"notebook": p.source.name, "page": p.html_name, "title": p.title, "seconds": p.seconds}
                  for p in pages],
        "claims": [{"id": cid, "links": [link.href for link in ls]} for cid, _, ls in book.claims],
        "stills": book.stills, "missing_stills": book.missing_stills, "environment": environment,
    }, indent=1) + "\n", encoding="utf-8")
    book.seconds = time.perf_counter() - start
    outside = external_loads(out)
    if outside:
        raise BuildError("the book would load from the internet (it must work offline):\n"
                         + "\n".join(f"- {x}" for x in outside[:20]))
    if strict and book.missing_stills:
        raise BuildError("widget stills are missing:\n" + "\n".join(f"- {m}" for m in book.missing_stills))
    return book


def _latest_environment(executed: Path, pages: list[Page]) -> dict:
    envs = [p.environment for p in pages if p.environment]
    if not envs:
        try:
            return json.loads((executed / "environment.json").read_text())
        except (OSError, ValueError):
            return {}
    return max(envs, key=lambda e: e.get("executed_at", ""))
