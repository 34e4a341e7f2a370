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


def test_the_glyph_legend_names_the_marks_that_occur_and_only_those():
    from llm_anatomy.views.labels import glyph_legend

    assert glyph_legend(["cat", "sat"]) == ""
    assert glyph_legend([token_label(" the"), token_label("\n")]) == "\u00b7 = a space, \u21b5 = a newline"
    legend = glyph_legend([token_label("\t"), token_label("😀".encode()[:2]), token_label("unbelievably", 6)])
    assert legend == "\u2192 = a tab, <F0 9F> = the bytes of a character split across tokens, \u2026 = cut short"
    assert glyph_legend(["<filename>", "<|im_start|>"]) == ""  # special tokens are not bytes


def test_pictures_of_tokens_carry_the_legend():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from llm_anatomy.views.attention import draw_attention
    from llm_anatomy.views.tokens import TokenSpan, tokens_html

    fig, ax = plt.subplots()
    draw_attention(torch.eye(3), ["The", "\u00b7cat", "\u21b5"], ax=ax)
    assert ax.get_xlabel().endswith("\u00b7 = a space, \u21b5 = a newline")
    draw_attention(torch.eye(2), ["The", "cat"], ax=ax)
    assert ax.get_xlabel() == "key (token looked at)"
    plt.close(fig)
    assert "la-glyph-legend" not in tokens_html([])
    spaced = tokens_html([TokenSpan(0, 1, b" the", 1)])
    assert "la-glyph-legend" in spaced and "a space" in spaced
    assert "la-glyph-legend" not in tokens_html([TokenSpan(0, 2, b"cat", None)])
