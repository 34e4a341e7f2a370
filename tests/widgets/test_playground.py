"""The tokenizer playground widget, driven through its callbacks (no browser)."""

from __future__ import annotations

import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.widgets.playground import MAX_CHARS, TokenizerPlayground, sample_paragraph

pytestmark = pytest.mark.integration  # uses the default model's tokenizer (from the cache, no weights)


@pytest.fixture(scope="module")
def reference(reference_tokenizer):
    return reference_tokenizer


@pytest.fixture
def widget(ours, reference):
    return TokenizerPlayground(ours, reference)


def test_it_has_the_css_classes_the_browser_tests_use(widget):
    assert "la-playground" in widget._dom_classes
    parts = [widget.textarea, widget.summary, widget.tokens, widget.id_table, widget.word_box, widget.trace,
             widget.error]
    names = ["text", "summary", "tokens", "ids", "word", "trace", "error"]
    for part, name in zip(parts, names):
        assert f"la-playground-{name}" in part._dom_classes


def test_it_starts_with_the_sample_paragraph(widget, reference):
    assert widget.textarea.value == widget.text == sample_paragraph()
    assert widget.ids == widget.ref_ids == reference(sample_paragraph(), add_special_tokens=False).input_ids
    assert "same ids as the reference" in widget.id_table.value


def test_typing_shows_the_right_ids(widget, reference):
    widget.textarea.value = "Hello world, 2024!"  # as a browser would: the observer calls set_text
    expected = reference("Hello world, 2024!", add_special_tokens=False).input_ids
    assert widget.ids == expected
    for token_id in expected:
        assert f'data-id="{token_id}"' in widget.tokens.value
    assert widget.tokens.value.count('class="la-token') == len(expected)
    assert f"<b>{len(expected)}</b> tokens" in widget.summary.value
    assert "18 bytes" in widget.summary.value
    assert widget.error.text == ""


def test_special_tokens_show_as_one_token(widget):
    widget.set_text("<|im_start|>user\nhi<|im_end|>")
    assert widget.ids[0] == 1 and widget.ids[-1] == 2
    assert 'data-id="1"' in widget.tokens.value and "&lt;|im_start|&gt;" in widget.tokens.value


def test_empty_input(widget):
    widget.set_text("")
    assert widget.ids == [] and widget.error.text == ""
    assert "<b>0</b> tokens" in widget.summary.value
    assert "the text is empty" in widget.tokens.value


def test_long_input_is_truncated_and_says_so(widget, reference):
    text = "word" + " word" * 999
    widget.set_text(text)
    assert len(widget.ids) == 1000
    assert "Showing the first 300 of 1,000 tokens." in widget.summary.value
    assert widget.tokens.value.count('class="la-token') == 300
    widget.set_text("x" * (MAX_CHARS + 10))
    assert len(widget.text) == MAX_CHARS
    assert f"only its first {MAX_CHARS:,} characters" in widget.summary.value


def test_invalid_text_shows_an_error_and_changes_nothing(widget):
    widget.set_text("fine text")
    before = (widget.text, widget.ids, widget.tokens.value, widget.summary.value, widget.id_table.value)
    widget.textarea.value = "bad \ud800 text"
    assert "surrogate" in widget.error.text
    assert (widget.text, widget.ids, widget.tokens.value, widget.summary.value, widget.id_table.value) == before
    widget.set_text(42)
    assert "not int" in widget.error.text and widget.text == "fine text"
    widget.set_text("fine again")
    assert widget.error.text == ""


def test_a_mismatch_with_the_reference_is_shown_in_red(ours, reference):
    def off_by_one(text):
        ids = reference(text, add_special_tokens=False).input_ids
        return ids[:1] + [ids[1] + 1] + ids[2:]

    widget = TokenizerPlayground(ours, off_by_one, text="Hello world again")
    assert "la-token-mismatch" in widget.tokens.value
    assert "la-id-mismatch" in widget.id_table.value
    assert "differs from the reference at token 1" in widget.id_table.value


def test_the_merge_trace_of_a_word(widget, ours):
    widget.word_box.value = " unbelievably"
    ids, steps = ours.encode_with_trace(" unbelievably")
    assert widget.trace_ids == ids == ours.encode(" unbelievably")
    assert widget.trace.value.count("la-trace-step") == len(steps) > 3
    assert f"{len(ids)} tokens:" in widget.trace.value
    widget.set_word("x" * 500)
    assert "200 characters" in widget.error.text and widget.word == " unbelievably"
    widget.set_word("\udc00")
    assert "surrogate" in widget.error.text and widget.word == " unbelievably"


def test_it_refuses_a_tokenizer_that_is_not_ours(reference):
    with pytest.raises(CourseError, match="BPETokenizer"):
        TokenizerPlayground(reference)
