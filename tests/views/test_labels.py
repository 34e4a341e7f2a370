"""The one token label (views/labels.py): whitespace drawn, broken characters as hex bytes, long tokens cut."""

from __future__ import annotations

import pytest

from llm_anatomy.views.labels import VISIBLE, token_label, token_labels


@pytest.mark.parametrize("token, label", [
    (" the", "\u00b7the"), ("\n", "\u21b5"), ("a\tb", "a\u2192b"), ("\r\n", "\u240d\u21b5"), ("cat", "cat"),
    (" ".encode(), "\u00b7"), ("é".encode(), "é"),
])
def test_whitespace_is_drawn_and_text_kept(token, label):
    assert token_label(token) == label


def test_each_whitespace_character_has_a_mark_of_its_own():
    marks = [token_label(c) for c in VISIBLE]
    assert len(set(marks)) == len(VISIBLE) and not any(m.isspace() for m in marks)


def test_part_of_a_character_shows_its_bytes_in_hex():
    emoji = "🙂".encode()  # 4 bytes, F0 9F 99 82: a byte-level BPE can cut it anywhere
    assert token_label(emoji[:2]) == "<F0 9F>" and token_label(emoji) == "🙂"


def test_long_tokens_are_cut_with_an_ellipsis():
    assert token_label("abcdefghij", max_chars=5) == "abcd\u2026"
    assert token_label("abcde", max_chars=5) == "abcde"
    assert len(token_label(" " * 20, max_chars=8)) == 8


def test_labels_of_the_real_tokenizer(reference_tokenizer):
    ids = reference_tokenizer.encode(" Hello world\n", add_special_tokens=False)
    labels = token_labels(reference_tokenizer, ids)
    assert "".join(labels) == "\u00b7Hello\u00b7world\u21b5"
    assert len(labels) == len(ids)
