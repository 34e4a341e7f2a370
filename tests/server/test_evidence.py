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
    with pytest.raises(ClaimFailed, match="C24 FAILED"):
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
        with pytest.raises(ClaimFailed, match="C25 FAILED"):
            admission_claim(broken, unbounded)
    with pytest.raises(ClaimFailed):
        admission_claim(good_bounded, _run(2, 3.0, 1500.0, 4000.0))  # the unbounded run refused: not unbounded


def test_c25_cancel_holds_and_fails_with_its_evidence():
    assert "C25 holds" in str(cancel_claim(0, 3, 0, 1))
    for broken in ((0, 3, 3, 1), (0, 0, 0, 1), (0, 3, 0, 0)):  # blocks kept; none held; nothing cancelled
        with pytest.raises(ClaimFailed, match="C25 FAILED"):
            cancel_claim(*broken)


def test_c16_holds_when_only_the_seen_prefix_is_cached_and_fails_otherwise():
    from llm_anatomy.server.evidence import prefix_claim

    assert "C16 holds" in str(prefix_claim([64, 64, 64], [0, 0, 0]))
    for shared, fresh in (([64, 0, 64], [0, 0, 0]),  # a request with the seen prompt found nothing cached
                          ([64, 64, 64], [0, 16, 0]),  # a new prompt reported cached tokens
                          ([], [0, 0]), ([64], [])):  # no evidence of one kind
        with pytest.raises(ClaimFailed, match="C16 FAILED"):
            prefix_claim(shared, fresh)


def test_notebook_11s_prefix_cell_asserts_through_the_claim_function():
    # the cell's claim is the function above, fed the cached tokens the server reported (not a claim of its own)
    import nbformat

    from llm_anatomy.paths import repo_root

    notebook = nbformat.read(repo_root() / "notebooks" / "11_behind_the_api.ipynb", 4)
    cells = [c.source for c in notebook.cells if c.cell_type == "code"]
    cell = next(c for c in cells if "prompt_tokens_details.cached_tokens" in c)
    assert "prefix_claim([c for _, c in shared], [c for _, c in fresh])" in cell and 'claim("C16"' not in cell


def test_c24_stream_is_the_decode_steps_and_fails_when_chunks_are_merged_lost_or_changed():
    from llm_anatomy.server.evidence import stream_claim

    steps = ["The", " capital", " of", " France", " is", " Paris", "."]
    assert "C24 holds" in str(stream_claim(list(steps), steps))
    for broken in (["The capital"] + steps[2:],  # two steps in one chunk: not streamed as decode makes them
                   steps[:-1],  # a step lost
                   steps[:5] + [" Lyon", "."],  # another answer
                   []):  # nothing streamed
        with pytest.raises(ClaimFailed, match="C24 FAILED"):
            stream_claim(broken, steps)
