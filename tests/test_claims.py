"""Claim cells assert their evidence, and a broken evidence cell fails the notebook run (as CI runs notebooks)."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from llm_anatomy.claims import ClaimFailed, claim, reading


def test_a_claim_that_holds_says_so_with_its_evidence():
    verdict = claim("C8", True, "64 tokens, identical: True")
    assert "C8 holds: 64 tokens, identical: True" in repr(verdict)
    assert "C8" in verdict._repr_html_()


def test_a_claim_that_fails_raises_with_its_evidence():
    with pytest.raises(ClaimFailed, match="C10 FAILED on this machine: 23,040 != 23,041"):
        claim("C10", 23_040 == 23_041, "23,040 != 23,041")
    with pytest.raises(ValueError):
        claim("8", True, "no such claim id")


def test_a_reading_never_raises():
    assert "C11 on this machine: decode reached 58%" in repr(reading("C11", "decode reached 58%"))


def _run_notebook(tmp_path, holds: bool) -> subprocess.CompletedProcess:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from llm_anatomy.claims import claim\n"
                                          "cached, uncached = [1, 2, 3], [1, 2, " + ("3]" if holds else "4]") + "\n"
                                          "claim('C8', cached == uncached, f'identical: {cached == uncached}')")]
    path = tmp_path / ("holds.ipynb" if holds else "broken.ipynb")
    nbformat.write(nb, path)
    return subprocess.run([sys.executable, "-m", "pytest", str(path), "--nbval-lax", "--nbval-current-env", "-q",
                           "-p", "no:cacheprovider", "-o", "addopts="], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)


def test_a_broken_evidence_cell_fails_the_notebook_run(tmp_path):
    broken = _run_notebook(tmp_path, holds=False)
    assert broken.returncode != 0 and "ClaimFailed" in broken.stdout and "identical: False" in broken.stdout
    assert _run_notebook(tmp_path, holds=True).returncode == 0
