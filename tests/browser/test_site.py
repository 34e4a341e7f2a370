"""The executed book (make site) in a real browser: every page loads offline and clean, shows figures and no
traceback, and every claim links to a cell that exists.

In `make test` (and so in CI) these tests run last, after nbval has executed every notebook in the same run
(tools/site/capture.py keeps those outputs and moves this file to the end): the book is built here from that one
execution, with the widget stills the other browser tests saved earlier in the run, and served on 127.0.0.1.
Every request for any other host is refused and fails the test: the book must work with no network.

Run alone (`pytest tests/browser/test_site.py -m browser`) it checks the book of the last `make site`; without
one, or when a notebook changed since, it skips outside CI and fails under CI.

test_readme_stepper_mid_generation is for `make screenshots` only (LLM_ANATOMY_README_IMAGES=1): it saves the
README's picture of the generation stepper mid-generation.
"""

from __future__ import annotations

import functools
import html
import http.server
import os
import re
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tools.site import build as site  # noqa: E402  (repository upkeep, not part of the package)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

NOTEBOOKS = sorted(p for p in site.NOTEBOOKS.glob("*.ipynb") if site.NOTEBOOK_NAME.match(p.name))
PAGES = ["index.html"] + [f"{p.stem}.html" for p in NOTEBOOKS]
# Notebooks that draw nothing: the tour prints the environment and a chat, and has no plot and no widget.
NO_FIGURE = {"00_setup_and_tour": "the tour prints the machine's report and a first chat; it draws nothing"}
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^-{20,}\s*$\s*^\w+(Error|Exception)\b", re.M)


def _missing(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: make test builds and checks the book)", pytrace=False)
    pytest.skip(reason)


# --------------------------------------------------------------------------- the book, built and served


@pytest.fixture(scope="session")
def book(request):
    """The book, built (strictly: a missing widget still fails) from the notebooks executed by this run.

    They are read from where this run's capture plugin writes them (--executed-to, $LLM_ANATOMY_EXECUTED_TO),
    by default build/executed/.
    """
    try:
        executed = request.config.getoption("executed_to")
    except ValueError:  # the capture plugin is not loaded in this run
        executed = None
    executed = Path(executed or os.environ.get("LLM_ANATOMY_EXECUTED_TO") or site.EXECUTED)
    failed = site.failed_notebooks(executed)
    if failed and _executed_in_this_run(request.config, failed):  # nbval named each failure once, above
        pytest.skip(f"no book to check: a cell failed in {', '.join(failed)} in this run (its failure is above)")
    stale = site.freshness(executed=executed)
    if stale:
        _missing("the book's executed notebooks are missing or stale, so there is no book to check: "
                 + "; ".join(stale[:3]) + " (make site, or make test, executes them)")
    try:
        return site.build_book(executed=executed, strict=True)
    except site.BuildError as err:
        pytest.fail(f"make site: {err}", pytrace=False)


def _executed_in_this_run(config, names) -> bool:
    """Whether this pytest run's nbval executed (and so reported) every one of these notebooks."""
    recorder = config.pluginmanager.get_plugin("llm-anatomy-book-recorder")
    return recorder is not None and all(name in recorder.seconds for name in names)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the test reports what matters
        pass


@pytest.fixture(scope="session")
def book_url(book):
    """The book served on 127.0.0.1 (a free port), as a reader's browser would load it."""
    handler = functools.partial(_Quiet, directory=str(book.out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class Reader:
    """A browser page on the book that records every problem: console errors, page errors, failed or refused
    requests (anything not on the book's own 127.0.0.1 address), HTTP errors."""

    def __init__(self, browser, base: str):
        self.base = base
        self.origin = urllib.parse.urlsplit(base)
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.context.set_default_timeout(60_000)
        self.outside: list[str] = []
        self.problems: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}")
                     if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(f"request failed: {r.url} ({r.failure})")
                     if not self._is_outside(r.url) else None)
        self.page.on("response", lambda r: self.problems.append(f"HTTP {r.status}: {r.url}")
                     if r.status >= 400 else None)

    def _is_outside(self, url: str) -> bool:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme in ("data", "blob", "about"):
            return False
        return (parts.scheme, parts.hostname, parts.port) != (self.origin.scheme, "127.0.0.1", self.origin.port)

    def _route(self, route):
        if self._is_outside(route.request.url):
            self.outside.append(route.request.url)
            route.abort("blockedbyclient")
        else:
            route.continue_()

    def open(self, path: str):
        url = f"{self.base}/{path}"
        same_page = self.page.url.partition("#")[0] == url.partition("#")[0]
        response = self.page.goto(url, wait_until="load")
        if response is None and same_page:  # only the #fragment changed: the browser fetches nothing
            return self.page
        assert response is not None and response.ok, f"{path}: HTTP {response.status if response else 'no response'}"
        self.page.wait_for_load_state("networkidle")
        return self.page

    def assert_offline(self, where: str) -> None:
        assert not self.outside, f"{where} tried to load from the internet (refused): {self.outside}"

    def assert_clean(self, where: str) -> None:
        self.assert_offline(where)
        assert not self.problems, f"{where}: " + "\n".join(self.problems)

    def close(self):
        self.context.close()


@pytest.fixture
def reader(browser, book_url):
    r = Reader(browser, book_url)
    try:
        yield r
    finally:
        r.close()


# --------------------------------------------------------------------------- the checks


def test_the_book_has_every_notebook_and_claim(book):
    assert [p.source.name for p in book.pages] == [p.name for p in NOTEBOOKS]
    assert not book.missing_stills
    assert book.claims and all(links for _, _, links in book.claims)
    print(book.summary())


@pytest.mark.parametrize("path", PAGES)
def test_page_loads_offline_with_no_error(book, reader, path):
    page = reader.open(path)
    reader.assert_offline(path)
    broken = page.evaluate("""() => Array.from(document.images)
        .filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.getAttribute('src'))""")
    assert not broken, f"{path}: images that did not load: {broken}"
    # Every link inside the book points at a page (and an anchor) that exists.
    links = page.evaluate("""() => Array.from(document.querySelectorAll('a[href]'))
        .map(a => a.getAttribute('href')).filter(h => !/^[a-z][a-z0-9+.-]*:|^\\/\\//i.test(h))""")
    for href in links:
        target, _, anchor = href.partition("#")
        target_file = book.out / urllib.parse.unquote(target or path)
        assert target_file.is_file(), f"{path} links to {href}, which is not in the book"
        if anchor and target_file.suffix == ".html":
            # A browser looks for the fragment as written, then percent-decoded (nbconvert's heading ids keep %XX).
            ids = _ids(target_file)
            assert anchor in ids or urllib.parse.unquote(anchor) in ids, f"{path} links to {href}: no such anchor"
    reader.assert_clean(path)


@functools.lru_cache(maxsize=64)
def _ids(page: Path) -> frozenset:
    text = page.read_text(encoding="utf-8")
    found = re.findall(r"""\bid\s*=\s*(?:"([^"]*)"|'([^']*)')""", text)
    return frozenset(html.unescape(double or single) for double, single in found)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_page_shows_figures_and_no_traceback(book, reader, notebook):
    page = reader.open(f"{notebook.stem}.html")
    figures = page.locator(".jp-OutputArea-output img, figure.book-still img")
    if notebook.stem in NO_FIGURE:
        pass  # NO_FIGURE says why
    else:
        assert figures.count() >= 1, f"{notebook.name}: the page shows no figure (no plot, no widget still)"
    missing = page.locator(".book-still-missing")
    assert missing.count() == 0, f"{notebook.name}: " + " | ".join(missing.all_inner_texts())
    for still in page.locator("figure.book-still").all():
        assert "make lab" in still.inner_text(), "a widget still does not say how to run it live"
    outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
    with_traceback = [text[:600] for text in outputs if TRACEBACK.search(text)]
    assert not with_traceback, f"{notebook.name}: an output holds a traceback:\n" + "\n---\n".join(with_traceback)
    code_cells = page.locator(".jp-CodeCell").count()
    assert code_cells > 0, f"{notebook.name}: the page shows no code cell"
    reader.assert_clean(notebook.name)


def test_every_claim_links_to_a_cell_that_exists(book, reader):
    page = reader.open("index.html")
    rows = page.locator("table.book-claims tbody tr")
    readme_ids = [cid for cid, _ in site.readme_claims(site.README)]
    ids = [row.locator("td").first.inner_text().strip() for row in rows.all()]
    assert ids == readme_ids, f"the claims table shows {ids}, README lists {readme_ids}"
    targets = []
    for row, cid in zip(rows.all(), ids):
        hrefs = [a.get_attribute("href") for a in row.locator("a.book-claim-link").all()]
        assert hrefs, f"claim {cid} links to no cell"
        targets += [(cid, href) for href in hrefs]
    for cid, href in targets:
        page = reader.open(href)
        anchor = urllib.parse.unquote(href.partition("#")[2])
        assert anchor, f"claim {cid} links to {href}, a page without a cell anchor"
        found = page.evaluate("(ids) => { const el = document.getElementById(ids[0]) || document.getElementById(ids[1]);"
                              " return el ? el.className : null; }", [href.partition("#")[2], anchor])
        assert found is not None, f"claim {cid} links to {href}, and the page has no element #{anchor}"
        assert "jp-Cell" in found, f"claim {cid} links to {href}, which is not a cell ({found})"
    reader.assert_clean("the claims' links")


# --------------------------------------------------------------------------- the README's stepper picture


def test_readme_stepper_mid_generation(notebook_page):
    """make screenshots: notebook 05's stepper after Prefill and three Steps, saved for the README."""
    if not os.environ.get("LLM_ANATOMY_README_IMAGES"):
        pytest.skip("the README's pictures are made by `make screenshots` (LLM_ANATOMY_README_IMAGES=1)")
    from playwright.sync_api import expect

    ui = notebook_page
    ui.open("05_generation.ipynb")
    ui.run_all()
    root = ui.widget("la-stepper")
    status = root.locator(".la-stepper-status")
    root.locator(".la-stepper-reset").click()
    expect(status).to_contain_text("press Prefill", timeout=60_000)
    root.locator(".la-stepper-prompt textarea").fill("What is the capital of France?")
    for css, value in (("la-stepper-temperature", 0), ("la-stepper-max-new", 40)):
        field = root.locator(f".{css} input")
        field.fill(str(value))
        field.press("Enter")
    chat = root.locator(".la-stepper-chat input[type=checkbox]")
    if not chat.is_checked():
        chat.check()
    root.locator(".la-stepper-prefill").click()
    expect(status).to_contain_text("1 new token", timeout=60_000)
    for n in (2, 3, 4):
        root.locator(".la-stepper-step").click()
        expect(status).to_contain_text(f"{n} new tokens", timeout=60_000)
    ui.assert_error_line_empty("la-stepper-error")
    ui.screenshot(root, "05_stepper_mid_generation")
    ui.assert_no_widget_errors()
