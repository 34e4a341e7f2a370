"""Render the executed notebooks into a static HTML book. Nothing is executed here and nothing is fetched.

    python -m tools.site build [--strict]      # build/executed/ + test-artifacts/screenshots/ -> build/site/

Input: the notebooks that nbval executed with `-p tools.site.capture --executed-to=build/executed` (make site and
make test do this), the widget stills that the browser tests saved in test-artifacts/screenshots/, and README.md
(its table of claims and its table of contents). Output, in build/site/ (git ignores build/):

- index.html: the contents in course order, the machine and versions the book was executed on, and the claims
  table, each claim linked to the cell that demonstrates it (claims.py);
- one page per notebook, rendered by nbconvert's lab template without any script: its outputs and figures as
  they were computed, each widget replaced by a still of its real rendering and a line saying how to run it live
  (render.py);
- static/: the JupyterLab stylesheet and the book's, once; stills/: the widget stills; NN_name_files/: the figures.

The build stops (BuildError) when a notebook was not executed, is stale (changed since it ran), or has a cell that
failed or never ran: the message names the notebook and the cell (pages.py). A widget without a still is reported;
with --strict (the browser check) that stops the build too. Any page that would load something from another host
stops the build: the book works offline.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.site.claims import claim_links, readme_claims, readme_contents, verdict_counts  # noqa: E402
from tools.site.pages import (EXECUTED, NOTEBOOK_NAME, NOTEBOOKS, OUT, README, ROOT, SCREENSHOTS,  # noqa: E402,F401
                              Book, BuildError, failed_notebooks, freshness, load_page, notebook_sources, _shown)
from tools.site.render import render_index, render_pages, write_static  # noqa: E402

# Anything a page would load from elsewhere: src/srcset/data attributes, <link href>, CSS url() and @import.
EXTERNAL_LOAD = re.compile(
    r"""(?:\b(?:src|srcset|data|poster|background)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//"""
    r"""|<link\b[^>]*\bhref\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//"""
    r"""|url\(\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//"""
    r"""|@import\s+["']\s*(?:[a-z][a-z0-9+.-]*:)?//)""", re.I)


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
    write_static(out)
    book = Book(out, pages, [(cid, text, links[cid]) for cid, text in claims],
                verdicts=verdict_counts(pages, [cid for cid, _ in claims]))
    render_pages(pages, out, screenshots, book)
    environment = _latest_environment(executed, pages)
    render_index(book, readme_contents(readme), environment)
    (out / "book.json").write_text(json.dumps({
        "pages": [{"notebook": p.source.name, "page": p.html_name, "title": p.title, "seconds": p.seconds}
                  for p in pages],
        "claims": [{"id": cid, "links": [link.href for link in ls], "verdicts": book.verdicts[cid]}
                   for cid, _, ls in book.claims],
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


def _latest_environment(executed: Path, pages) -> dict:
    envs = [p.environment for p in pages if p.environment]
    if not envs:
        try:
            return json.loads((executed / "environment.json").read_text())
        except (OSError, ValueError):
            return {}
    return max(envs, key=lambda e: e.get("executed_at", ""))
