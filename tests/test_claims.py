"""Claim cells assert their evidence (a broken evidence cell failing the notebook run is tested in
tests/site/test_site_capture.py, in its one nbval run)."""

from __future__ import annotations

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


# A broken evidence cell failing nbval's run: tests/site/test_site_capture.py::test_a_broken_evidence_cell_fails_the_notebook_run
# (in its one nbval run of tiny notebooks, no second one here).
