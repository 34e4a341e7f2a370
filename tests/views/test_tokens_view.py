"""The pure functions behind the tokenizer playground (no widgets, no browser)."""

from __future__ import annotations

import pytest

from llm_anatomy.views import tokens as tv
from llm_anatomy.tokens.bpe import BPETokenizer
from llm_anatomy.errors import CourseError


@pytest.fixture(scope="module")
def tok():
    return BPETokenizer.train("the cat sat on the mat. the cat ate. " * 20, 280)


def test_token_label_shows_whitespace_and_half_characters():
    assert tv.token_label(b" the") == "\u00b7the"
    assert tv.token_label(b"\n") == "\u21b5"
    assert tv.token_label(b"\t") == "\u2192"
    assert tv.token_label("😀".encode()[:2]) == "<F0 9F>"
    assert tv.token_label("é".encode()) == "é"


def test_colours_differ_between_neighbours():
    assert all(tv.colour(i) != tv.colour(i + 1) for i in range(20))
    assert tv.colour(0) == tv.colour(len(tv.PALETTE))


def test_spans_carry_ids_bytes_and_reference(tok):
    text = "the cat"
    ids = tok.encode(text)
    spans = tv.token_spans(tok, text, ref_ids=ids)
    assert [s.id for s in spans] == ids
    assert b"".join(s.data for s in spans) == text.encode()
    assert sum(s.n_bytes for s in spans) == 7
    assert all(s.matches for s in spans)
    wrong = tv.token_spans(tok, text, ref_ids=[ids[0] + 1] + ids[1:])
    assert not wrong[0].matches and all(s.matches for s in wrong[1:])
    shorter = tv.token_spans(tok, text, ref_ids=ids[:1])
    assert shorter[0].matches and not any(s.matches for s in shorter[1:])
    assert all(s.ref_id is None and s.matches for s in tv.token_spans(tok, text))


def test_compare_ids_aligns_and_finds_the_first_mismatch():
    assert tv.compare_ids([1, 2], [1, 3, 4]) == [(1, 1, True), (2, 3, False), (None, 4, False)]
    assert tv.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert tv.first_mismatch([1, 2, 3], [1, 9, 3]) == 1
    assert tv.first_mismatch([1, 2], [1, 2, 3]) == 2


def test_text_stats_counts_bytes_not_characters():
    stats = tv.text_stats("héllo 😀", [1, 2, 3])
    assert (stats.characters, stats.bytes, stats.tokens) == (7, 11, 3)
    assert stats.bytes_per_token == pytest.approx(11 / 3)
    assert tv.text_stats("", []).bytes_per_token == 0.0


def test_truncate_says_what_it_left_out():
    assert tv.truncate([1, 2, 3], 5) == ([1, 2, 3], "")
    items, note = tv.truncate(list(range(1000)), 10)
    assert items == list(range(10)) and note == "Showing the first 10 of 1,000 tokens."
    with pytest.raises(CourseError):
        tv.truncate([1], 0)


def test_html_escapes_and_marks_mismatches(tok):
    text = "<b>the</b>"
    ids = tok.encode(text)
    page = tv.tokens_html(tv.token_spans(tok, text, ref_ids=[-5] + ids[1:]))
    assert "<b>" not in page and "&lt;" in page
    assert page.count('class="la-token') == len(ids) and page.count("la-token-mismatch") == 1
    assert f'data-id="{ids[1]}"' in page
    table = tv.ids_html(ids, [-5] + ids[1:])
    assert "la-id-mismatch" in table and "differs from the reference at token 0" in table
    assert "same ids as the reference" in tv.ids_html(ids, ids)
    assert "empty" in tv.tokens_html([])


def test_trace_html_lists_every_merge(tok):
    ids, steps = tok.encode_with_trace(" the")
    page = tv.trace_html(" the", steps, ids)
    assert page.count("la-trace-step") == len(steps) >= 1
    assert "\u00b7the" in page and f"{len(ids)} token" in page
    assert "Type a word" in tv.trace_html("", [], [])
