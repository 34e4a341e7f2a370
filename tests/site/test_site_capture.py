"""tools/site/capture.py with a real nbval run on four tiny notebooks: what nbval executed is kept, once.

One pytest run in a subprocess (a kernel starts per notebook): a notebook that passes keeps its outputs, a
widget's repr and execution counts; a notebook that fails keeps the error, and the book's build names it. Two of them are a claim cell whose evidence
holds and the same cell whose evidence fails (nbval must fail it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tools.site import build as site  # noqa: E402
from tools.site import render  # noqa: E402
from tools.site.capture import META_KEY, source_digest  # noqa: E402

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("capture")
    notebooks, executed = tmp / "notebooks", tmp / "executed"
    notebooks.mkdir()
    good = new_notebook(cells=[
        new_markdown_cell("# 01 · Good"),
        new_code_cell("print('hello')\n6 * 7"),
        new_code_cell("from llm_anatomy.widgets.kv_calculator import KVCalculator\nKVCalculator()"),
        new_code_cell("from IPython.display import HTML\nHTML('<b>bold</b>')"),
    ])
    bad = new_notebook(cells=[
        new_markdown_cell("# 02 · Bad"),
        new_code_cell("x = 1"),
        new_code_cell("1 / 0"),
        new_code_cell("print('after')"),
    ])
    nbformat.write(good, str(notebooks / "01_good.ipynb"))
    nbformat.write(bad, str(notebooks / "02_bad.ipynb"))
    for name, last in (("03_claim_holds.ipynb", "3]"), ("04_claim_broken.ipynb", "4]")):  # a claim cell's evidence
        nbformat.write(new_notebook(cells=[new_code_cell(
            "from llm_anatomy.claims import claim\n"
            f"cached, uncached = [1, 2, 3], [1, 2, {last}\n"
            "claim('C8', cached == uncached, f'identical: {cached == uncached}')")]), str(notebooks / name))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(notebooks), "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider",
         "-p", "tools.site.capture", f"--executed-to={executed}", "-q", f"--rootdir={tmp}", "-o", "addopts="],
        cwd=ROOT, capture_output=True, text=True, timeout=540)
    return notebooks, executed, proc


def test_nbval_still_reports_as_before(run):
    _, _, proc = run
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 failed, 6 passed" in proc.stdout, proc.stdout[-3000:]
    assert "02_bad.ipynb::Cell 1" in proc.stdout


def test_a_broken_evidence_cell_fails_the_notebook_run(run):
    """A claim cell whose evidence fails raises ClaimFailed, and nbval fails the notebook with the evidence shown; the
    same cell with evidence that holds passes (this run is the one nbval run of the harness: no other test runs one)."""
    _, executed, proc = run
    assert "FAILED" in proc.stdout and "04_claim_broken.ipynb::Cell 0" in proc.stdout, proc.stdout[-3000:]
    assert "ClaimFailed" in proc.stdout and "identical: False" in proc.stdout
    assert "03_claim_holds.ipynb::Cell 0" not in proc.stdout.split("short test summary")[-1]
    held = nbformat.read(str(executed / "03_claim_holds.ipynb"), as_version=4).cells[0]
    assert "C8 holds: identical: True" in held.outputs[-1].data["text/plain"]


def test_the_summary_says_what_each_notebook_took(run):
    _, executed, proc = run
    lines = proc.stdout.splitlines()
    assert any("nbval seconds per notebook" in line for line in lines), proc.stdout[-3000:]
    took = {line.split()[-1]: float(line.split()[0]) for line in lines if line.strip().endswith(".ipynb")
            and line.split()[1:2] == ["s"]}
    assert set(took) == {"01_good.ipynb", "02_bad.ipynb", "03_claim_holds.ipynb", "04_claim_broken.ipynb"}, \
        proc.stdout[-3000:]
    recorded = nbformat.read(str(executed / "01_good.ipynb"), as_version=4).metadata[META_KEY]["seconds"]
    assert took["01_good.ipynb"] == recorded > 0
    assert any("all notebooks" in line for line in lines)


def test_a_passing_notebook_is_kept_with_its_outputs(run):
    notebooks, executed, _ = run
    nb = nbformat.read(str(executed / "01_good.ipynb"), as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == [1, 2, 3]
    assert [c.metadata[META_KEY]["status"] for c in code] == ["passed"] * 3
    assert code[0].outputs[0].text == "hello\n" and code[0].outputs[1].data["text/plain"] == "42"
    assert code[0].outputs[1].execution_count == 1
    widget = code[1].outputs[0].data
    assert render.WIDGET_MIME in widget and render._widget_class(code[1].outputs[0]) == ("la-kvcalc", "KVCalculator")
    assert code[2].outputs[0].data["text/html"] == "<b>bold</b>"
    meta = nb.metadata[META_KEY]
    assert meta["source_digest"] == source_digest(nbformat.read(str(notebooks / "01_good.ipynb"), as_version=4))
    assert meta["environment"]["python"] and meta["environment"]["executed_at"]
    assert (executed / "environment.json").is_file()
    # The notebook in notebooks/ is untouched: still no outputs.
    assert all(not c.get("outputs") for c in nbformat.read(str(notebooks / "01_good.ipynb"), as_version=4).cells)


def test_a_failing_notebook_keeps_the_error_and_the_build_names_notebook_and_cell(run, tmp_path):
    notebooks, executed, _ = run
    nb = nbformat.read(str(executed / "02_bad.ipynb"), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.metadata[META_KEY]["status"] for c in code] == ["passed", "failed", "passed"]
    assert code[1].outputs[-1].output_type == "error" and code[1].outputs[-1].ename == "ZeroDivisionError"
    problems = site.load_page(notebooks / "02_bad.ipynb", executed)[1]
    assert len(problems) == 1
    assert "02_bad.ipynb, cell 3 of 4 (nbval's Cell 1" in problems[0] and "`1 / 0`" in problems[0]
    assert "ZeroDivisionError: division by zero" in problems[0]


def test_the_busy_machine_check_and_then_the_book_checks_run_after_everything_else():
    from types import SimpleNamespace

    from tools.site.capture import pytest_collection_modifyitems

    names = ["test_site.py", "test_a.py", "test_busy_machine.py", "08_serving.ipynb", "test_site.py"]
    items = [SimpleNamespace(path=Path(name), n=i) for i, name in enumerate(names)]
    pytest_collection_modifyitems(None, None, items)
    assert [(item.path.name, item.n) for item in items] == [
        ("test_a.py", 1), ("08_serving.ipynb", 3), ("test_busy_machine.py", 2), ("test_site.py", 0),
        ("test_site.py", 4)]
