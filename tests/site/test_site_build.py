"""tools/site/build.py on tiny synthetic notebooks: what goes into the book, and what stops the build.

No kernel and no browser here: the executed notebooks are written as tools.site.capture writes them.
"""

from __future__ import annotations

import base64
import io
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tools.site import build as site  # noqa: E402
from tools.colab import SETUP_TAG  # noqa: E402
from tools.site import render  # noqa: E402
from tools.site.capture import META_KEY, source_digest  # noqa: E402

README = """# Course
| notebook | what you do | claims |
|---|---|---|
| [notebooks/01_alpha.ipynb](notebooks/01_alpha.ipynb) | count **things** with `len` | C1 |
| [notebooks/02_beta.ipynb](notebooks/02_beta.ipynb) | a widget | C2 |

| id | claim |
|----|-------|
| C1 | Counting works |
| C2 | Widgets show |
"""
BADGE = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
         "(https://colab.research.google.com/github/x/y/blob/main/notebooks/{name})")
WIDGET_REPR = "Stepper(root_class='la-stepper')"  # a course widget's repr names its root class (CourseWidget)


def _png(width=40, height=30) -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (30, 120, 200)).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def _cell(source, outputs=(), status="passed", cell_id=None, tags=()):
    cell = new_code_cell(source, outputs=[new_output(**o) for o in outputs])
    if tags:
        cell.metadata["tags"] = list(tags)
    cell.metadata[META_KEY] = {"status": status, "seconds": 0.5}
    if status == "failed":
        cell.metadata[META_KEY]["detail"] = "Cell execution caused an exception"
    if cell_id:
        cell.id = cell_id
    return cell


def _notebooks(tmp_path: Path, alpha_cells=None, beta_outputs=None):
    """notebooks/ (clean, as committed) and executed/ (as the capture plugin writes them) for two notebooks."""
    alpha = new_notebook(cells=[
        new_markdown_cell(BADGE.format(name="01_alpha.ipynb")),
        _cell("# Set-up for Google Colab: does nothing here", tags=[SETUP_TAG]),
        new_markdown_cell("# 01 · Alpha\nThis chapter demonstrates C1 and C2.\n\n| map | C2 |\n|---|---|"),
        new_markdown_cell("## 1. Counting (C1)", ),
        *(alpha_cells or [
            _cell("print(len('abc'))", [dict(output_type="stream", name="stdout", text="3\n")], cell_id="count0001"),
            _cell("claim('C1', True, 'three')", [dict(output_type="execute_result", execution_count=2,
                                                      data={"text/plain": "ok"})], cell_id="claim0001"),
            _cell("plot()", [dict(output_type="display_data", data={"image/png": _png(), "text/plain": "<Figure>"})]),
        ]),
        new_markdown_cell("## Summary\n- C1 and C2"),
    ])
    beta = new_notebook(cells=[
        new_markdown_cell("# 02 · Beta"),
        new_markdown_cell("## 1. A widget (C2)\nIt steps what [notebook 01](01_alpha.ipynb) counted."),
        _cell("Stepper()", beta_outputs if beta_outputs is not None else [dict(
            output_type="display_data",
            data={"text/plain": WIDGET_REPR,
                  render.WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": "abc"}})],
              cell_id="widget001"),
    ])
    notebooks, executed = tmp_path / "notebooks", tmp_path / "executed"
    notebooks.mkdir(parents=True)
    executed.mkdir(parents=True)
    for name, nb in (("01_alpha.ipynb", alpha), ("02_beta.ipynb", beta)):
        clean = nbformat.from_dict(nb)
        for cell in clean.cells:
            cell.metadata.pop(META_KEY, None)
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        nbformat.write(clean, str(notebooks / name))
        nb.metadata[META_KEY] = {"source": name, "source_digest": source_digest(clean), "seconds": 1.5,
                                 "environment": {"executed_at": "2026-01-01T00:00:00+00:00", "device": "cpu (2 cores)",
                                                 "python": "3.11", "packages": {"torch": "2.13.0"}}}
        nbformat.write(nb, str(executed / name))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    return dict(notebooks=notebooks, executed=executed, screenshots=shots, out=tmp_path / "site", readme=readme)


def _still(paths, name="02_stepper_finished.png"):
    (paths["screenshots"] / name).write_bytes(base64.b64decode(_png(300, 200)))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    paths = _notebooks(tmp_path_factory.mktemp("book"))
    _still(paths)
    return site.build_book(**paths, strict=True), paths


def test_a_page_per_notebook_in_course_order_with_outputs_and_figures(built):
    book, paths = built
    out = paths["out"]
    assert [p.html_name for p in book.pages] == ["01_alpha.html", "02_beta.html"]
    alpha = (out / "01_alpha.html").read_text()
    assert "3\n" in alpha and 'id="cell-id=count0001"' in alpha
    figures = re.findall(r'<img[^>]*src="(01_alpha_files/[^"]+\.png)"', alpha)
    assert figures and all((out / f).is_file() for f in figures), "the figure is not a file beside the page"
    assert "does nothing here" not in alpha, "the Colab set-up cell does nothing here: the book leaves it out by its tag"
    assert "Open In Colab" in alpha and "colab-badge.svg" not in alpha
    index = (out / "index.html").read_text()
    assert index.index("01_alpha.html") < index.index("02_beta.html")
    assert "count <strong>things</strong> with <code>len</code>" in index, "the contents use README's 'what you do'"
    assert "cpu (2 cores)" in index and "torch 2.13.0" in index, "the front page names the machine and versions"


def test_a_cell_is_left_out_by_its_tag_not_by_its_words(tmp_path):
    paths = _notebooks(tmp_path, alpha_cells=[
        _cell("# Set-up for Google Colab, in words only: no tag, so the book keeps it", cell_id="kept0001"),
        _cell("claim('C1', True, 'kept')", cell_id="claim0001")])
    _still(paths)
    site.build_book(**paths)
    alpha = (paths["out"] / "01_alpha.html").read_text()
    assert "in words only" in alpha and "does nothing here" not in alpha


def test_claims_link_to_the_cell_that_shows_them(built):
    book, _ = built
    links = {cid: [link.href for link in ls] for cid, _, ls in book.claims}
    # A claim() cell beats the heading above it; the map's table row and the summary do not count.
    assert links["C1"] == ["01_alpha.html#cell-id=claim0001"]
    # C2: named in notebook 01's objectives only (rank 3) and in a heading of notebook 02 (rank 1): both listed.
    assert sorted(links["C2"]) == ["01_alpha.html#cell-id=" + book.pages[0].nb.cells[2].id,
                                   "02_beta.html#cell-id=" + book.pages[1].nb.cells[1].id]
    for hrefs in links.values():
        for href in hrefs:
            page, anchor = href.split("#")
            assert f'id="{anchor}"' in (book.out / page).read_text()


def test_the_front_page_counts_each_claims_verdicts(tmp_path):
    shown = lambda text: dict(output_type="display_data", data={"text/plain": text})  # noqa: E731
    paths = _notebooks(tmp_path, alpha_cells=[
        _cell("claim('C1', True, 'a')", [shown("\u2714 C1 holds: a")], cell_id="claim0001"),
        _cell("claim('C1', True, 'b'); reading('C1', 'c')", [shown("\u2714 C1 holds: b"),
                                                              shown("\u25b8 C1 on this machine: c")]),
        _cell("not_shown('C2', 'why', 'what')", [shown("\u25cc C2 not shown on this machine: why. What would show "
                                                       "it: what")])])
    _still(paths)
    book = site.build_book(**paths)
    assert book.verdicts == {"C1": {"holds": 2, "reading": 1, "not shown": 0, "failed": 0},
                             "C2": {"holds": 0, "reading": 0, "not shown": 1, "failed": 0}}
    index = (paths["out"] / "index.html").read_text()
    assert "2 checks hold" in index and "1 is a reading of" in index and "1 is not shown" in index
    assert "(C2: the cell says why" in index and "&#9676;&nbsp;1&nbsp;not&nbsp;shown" in index


def test_links_between_notebooks_go_to_their_pages(built):
    book, paths = built
    beta = (paths["out"] / "02_beta.html").read_text()
    assert 'href="01_alpha.html"' in beta and '01_alpha.ipynb"' not in beta
    assert render._book_links('<a href="./08_serving.ipynb#cell-id=ab12">') == '<a href="08_serving.html#cell-id=ab12">'
    assert render._book_links('<a href="https://x.org/08_serving.ipynb">') == '<a href="https://x.org/08_serving.ipynb">'


def test_a_widget_becomes_its_still_and_says_how_to_run_it_live(built):
    book, paths = built
    beta = (paths["out"] / "02_beta.html").read_text()
    assert 'src="stills/02_stepper_finished.png"' in beta and (paths["out"] / "stills" / "02_stepper_finished.png").is_file()
    assert "make lab</code>, notebook 02" in beta
    assert "after the browser test used it (finished)" in beta, "a still of a used widget says so"
    assert book.stills == ["02_stepper_finished.png"] and not book.missing_stills


def test_nothing_in_the_book_loads_from_the_internet(built):
    book, paths = built
    assert site.external_loads(paths["out"]) == []
    for page in paths["out"].rglob("*.html"):
        text = page.read_text()
        # Independent of the build's own pattern: no script at all, and no src/link to any host.
        assert "<script" not in text.lower(), f"{page.name} has a script"
        assert not re.search(r"""(src|srcset)\s*=\s*["']?(https?:)?//""", text, re.I), page.name
        assert not re.search(r"""<link[^>]+href\s*=\s*["']?(https?:)?//""", text, re.I), page.name


def test_an_output_that_loads_from_the_internet_stops_the_build(tmp_path):
    paths = _notebooks(tmp_path, beta_outputs=[dict(output_type="display_data", data={
        "text/html": '<img src="https://example.com/tracker.png">', "text/plain": "x"})])
    with pytest.raises(site.BuildError, match=r"load from the internet[\s\S]*02_beta.html[\s\S]*example\.com"):
        site.build_book(**paths)


def test_a_missing_still_is_reported_and_strict_stops(tmp_path):
    paths = _notebooks(tmp_path)  # no screenshot saved
    book = site.build_book(**paths)
    assert len(book.missing_stills) == 1
    problem = book.missing_stills[0]
    assert "02_beta.ipynb" in problem and "widget001" in problem and "Stepper" in problem
    assert "02_stepper_start.png" in (paths["out"] / "02_beta.html").read_text()
    assert "MISSING STILL" in book.summary()
    with pytest.raises(site.BuildError, match=r"widget stills are missing[\s\S]*02_beta\.ipynb"):
        site.build_book(**paths, strict=True)


def test_a_failed_cell_stops_the_build_naming_notebook_and_cell(tmp_path):
    failing = _cell("1 / 0", [dict(output_type="error", ename="ZeroDivisionError", evalue="division by zero",
                                   traceback=["Traceback..."])], status="failed", cell_id="boom0001")
    after = _cell("x = 1", status="failed")
    paths = _notebooks(tmp_path, alpha_cells=[_cell("print(1)"), failing, after])
    with pytest.raises(site.BuildError) as err:
        site.build_book(**paths)
    message = str(err.value)
    assert "notebooks/01_alpha.ipynb" in message or "01_alpha.ipynb" in message
    assert "cell 6 of 8" in message and "nbval's Cell 2" in message and "boom0001" in message and "`1 / 0`" in message
    assert "ZeroDivisionError: division by zero" in message and "1 later cell(s) failed too" in message
    assert not paths["out"].exists(), "nothing is written when the book cannot be built"


def test_after_a_failed_run_the_build_points_to_the_failure_instead_of_repeating_it(tmp_path, capsys, monkeypatch):
    import functools

    from tools.site.__main__ import main

    failing = _cell("claim('C1', False, 'x')", [dict(output_type="error", ename="ClaimFailed",
                                                     evalue="C1 FAILED on this machine: x", traceback=[])],
                    status="failed")
    paths = _notebooks(tmp_path, alpha_cells=[_cell("print(1)"), failing])
    assert site.failed_notebooks(paths["executed"]) == ["01_alpha.ipynb"]
    assert site.failed_notebooks(tmp_path / "nowhere") == []
    monkeypatch.setattr(site, "build_book", functools.partial(site.build_book, notebooks=paths["notebooks"],
                                                              readme=paths["readme"]))
    args = ["build", "--executed", str(paths["executed"]), "--screenshots", str(paths["screenshots"]),
            "--out", str(paths["out"])]
    assert main(args) == 1  # on its own: the whole reason
    assert "C1 FAILED on this machine: x" in capsys.readouterr().err
    assert main(args + ["--after-failed-run"]) == 1  # after make site's pytest run, which named it once
    told = capsys.readouterr().err
    assert "a cell failed in 01_alpha.ipynb" in told and "FAILED" not in told


def test_a_notebook_that_did_not_run_to_the_end_or_changed_stops_the_build(tmp_path):
    paths = _notebooks(tmp_path, alpha_cells=[_cell("print(1)"), _cell("print(2)", status="not run", cell_id="late0001")])
    with pytest.raises(site.BuildError, match=r"01_alpha\.ipynb, cell 6 of 7 .*late0001.* never ran"):
        site.build_book(**paths)

    paths = _notebooks(tmp_path / "changed")
    nb = nbformat.read(str(paths["notebooks"] / "02_beta.ipynb"), as_version=4)
    nb.cells[0].source += " (edited)"
    nbformat.write(nb, str(paths["notebooks"] / "02_beta.ipynb"))
    assert any("02_beta.ipynb changed since it was executed" in p for p in site.freshness(paths["notebooks"],
                                                                                            paths["executed"]))
    with pytest.raises(site.BuildError, match="02_beta.ipynb changed since it was executed"):
        site.build_book(**paths)

    (paths["executed"] / "01_alpha.ipynb").unlink()
    with pytest.raises(site.BuildError, match=r"01_alpha\.ipynb was not executed"):
        site.build_book(**paths)


def test_a_claim_no_cell_shows_stops_the_build(tmp_path):
    paths = _notebooks(tmp_path)
    _still(paths)
    paths["readme"].write_text(README + "| C3 | Nobody shows this |\n")
    with pytest.raises(site.BuildError, match=r"claim\(s\) C3"):
        site.build_book(**paths)


def test_a_course_widget_is_known_by_the_root_class_its_repr_names():
    # A notebook keeps only the widget's text/plain repr: a course widget's names its root class.
    from llm_anatomy.widgets.kv_calculator import KVCalculator

    saved = KVCalculator()._repr_mimebundle_()  # what the executed notebook stores
    assert render._widget_class({"data": saved}) == ("la-kvcalc", "KVCalculator")
    # Any other widget's repr names no root class (ipywidgets cuts it at 110 characters, inside a child): no still.
    cut = {"data": {"text/plain": "VBox(children=(Dropdown(_dom_classes=('la-x-model',)), …", render.WIDGET_MIME: {}}}
    assert render._widget_class(cut) == (None, "VBox")
