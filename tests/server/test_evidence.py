"""Notebook 11's claim checks fail when their evidence fails (as tests/test_claims.py asks of every claim cell)."""

from __future__ import annotations

import math

import pytest

from llm_anatomy.claims import ClaimFailed
from llm_anatomy.server.evidence import admission_claim, cancel_claim, ttft_claim

SWEEP = {0.5: 0.20, 2.0: 0.45, 6.0: 1.30}


def test_c24_holds_on_nested_ttfts_that_grow_with_load():
    assert "C24 holds" in str(ttft_claim([0.21, 0.30], [0.20, 0.28], SWEEP))


@pytest.mark.parametrize("client, engine, sweep", [
    ([0.21, 0.25], [0.20, 0.28], SWEEP),  # a client TTFT below the engine's: the server's own work cannot be < 0
    ([], [], SWEEP),  # no requests: nothing shown
    ([0.21], [0.20], {0.5: 0.20, 2.0: 0.22, 6.0: 0.25}),  # TTFT flat under load
    ([0.21], [0.20], {0.5: 0.20}),  # one rate: no load to compare
])
def test_c24_fails_when_its_evidence_fails(client, engine, sweep):
    with pytest.raises(ClaimFailed, match="C24 NOT shown"):
        ttft_claim(client, engine, sweep)


def _run(refused, refusal_ms, ttft_ms, p99_ms):
    return {"refused_429": refused, "completed": 10 - refused, "failed": refused, "median_refusal_ms": refusal_ms,
            "median_ttft_ms": ttft_ms, "p99_ttft_ms": p99_ms}


def test_c25_admission_holds_and_fails_with_its_evidence():
    good_bounded, unbounded = _run(4, 3.0, 400.0, 900.0), _run(0, math.nan, 1500.0, 4000.0)
    assert "C25 holds" in str(admission_claim(good_bounded, unbounded))
    for broken in (_run(0, math.nan, 400.0, 900.0),  # nobody refused
                   _run(4, 800.0, 400.0, 900.0),  # refusals slower than a first token
                   _run(4, 3.0, 400.0, 5000.0)):  # the bounded tail no better
        with pytest.raises(ClaimFailed, match="C25 NOT shown"):
            admission_claim(broken, unbounded)
    with pytest.raises(ClaimFailed):
        admission_claim(good_bounded, _run(2, 3.0, 1500.0, 4000.0))  # the unbounded run refused: not unbounded


def test_c25_cancel_holds_and_fails_with_its_evidence():
    assert "C25 holds" in str(cancel_claim(0, 3, 0, 1))
    for broken in ((0, 3, 3, 1), (0, 0, 0, 1), (0, 3, 0, 0)):  # blocks kept; none held; nothing cancelled
        with pytest.raises(ClaimFailed, match="C25 NOT shown"):
            cancel_claim(*broken)
