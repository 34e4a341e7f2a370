"""The tokenizer playground: type text, see its tokens, their ids and bytes, ours vs the reference.

A thin shell over `llm_anatomy.views.tokens`. CSS classes, for the browser tests:
    la-playground            the root box
    la-playground-text       the text area (type here)
    la-playground-summary    "N tokens · C characters · B bytes · bytes per token" (+ a truncation note)
    la-playground-tokens     the coloured tokens, each a span.la-token with its id underneath
    la-playground-ids        our ids and the reference ids side by side (mismatches red, .la-id-mismatch)
    la-playground-word       the word whose merges to show (a text box)
    la-playground-trace      the merge trace of that word
    la-playground-error      the error line
"""

from __future__ import annotations

import html

import ipywidgets as W

from ..views import tokens as tv
from ..tokens.bpe import BPETokenizer, utf8_bytes
from ..errors import CourseError
from .base import CourseWidget, ErrorLine, guarded

MAX_TOKENS_SHOWN = 300  # tokens drawn; the counts always cover the whole text
MAX_CHARS = 100_000  # longer text is cut here before tokenizing (and the widget says so)


def sample_paragraph() -> str:
    """A paragraph with the things that make tokenizers interesting: spaces, numbers, code, emoji, accents."""
    return ("Tokenizers split text into pieces. In 2024, SmolLM2 read about 2,000,000,000,000 tokens; "
            "a word like 'unbelievably' may become several tokens, while ' the' is one.\n"
            "def greet(name):\n    return f\"Hello, {name}!\"  # code, with indentation\n"
            "Café, naïve, Zürich; 東京; привет; مرحبا; 👋🏽 and 👨‍👩‍👧.")


def reference_ids(reference, text: str) -> list[int] | None:
    """The reference tokenizer's ids for `text` (a transformers tokenizer, or any function text -> ids)."""
    if reference is None:
        return None
    if hasattr(reference, "backend_tokenizer"):
        return list(reference(text, add_special_tokens=False).input_ids)
    return list(reference(text))


class TokenizerPlayground(CourseWidget, W.VBox):
    """Type text and see how `tokenizer` (ours) splits it, against `reference` (the model's own).

    Callbacks, callable from tests: set_text(text), set_word(word). State after a successful update:
    `text`, `ids`, `ref_ids`, `word`, `trace_ids`. A refused input shows an error and changes nothing.
    """

    root_class = "la-playground"

    def __init__(self, tokenizer: BPETokenizer, reference=None, text: str | None = None, word: str = " tokens",
                 max_tokens: int = MAX_TOKENS_SHOWN):
        if not isinstance(tokenizer, BPETokenizer):
            raise CourseError("TokenizerPlayground needs our BPETokenizer, e.g. BPETokenizer.from_hf(loaded.tokenizer).")
        self.tokenizer, self.reference, self.max_tokens = tokenizer, reference, max_tokens
        self.text, self.ids, self.ref_ids = "", [], None
        self.word, self.trace_ids = "", []
        self.error = ErrorLine("la-playground-error")
        self.textarea = W.Textarea(value="", placeholder="Type or paste text here", continuous_update=True,
                                   layout=W.Layout(width="100%", height="110px"))
        self.textarea.add_class("la-playground-text")
        self.summary = W.HTML()
        self.summary.add_class("la-playground-summary")
        self.tokens = W.HTML()
        self.tokens.add_class("la-playground-tokens")
        self.id_table = W.HTML()
        self.id_table.add_class("la-playground-ids")
        self.word_box = W.Text(value="", description="merges of:", continuous_update=True,
                               layout=W.Layout(width="320px"))
        self.word_box.add_class("la-playground-word")
        self.trace = W.HTML()
        self.trace.add_class("la-playground-trace")
        legend = W.HTML('<div style="color:#555;font-size:90%">Each coloured box is one token, with its id '
                        "underneath; &middot; is a space, &crarr; a newline. Hover a token for its byte count. "
                        "A red outline means our id differs from the reference.</div>")
        super().__init__([self.textarea, self.error, self.summary, legend, self.tokens, self.id_table,
                          self.word_box, self.trace])
        self.add_class(self.root_class)
        self.set_text(sample_paragraph() if text is None else text)
        self.set_word(word)
        self.textarea.value, self.word_box.value = self.text, self.word
        self.textarea.observe(lambda change: self.set_text(change["new"]), names="value")
        self.word_box.observe(lambda change: self.set_word(change["new"]), names="value")

    @guarded
    def set_text(self, text: str) -> None:
        """Tokenize `text` with ours and the reference, and redraw. Invalid text: an error, nothing changes."""
        if not isinstance(text, str):
            raise CourseError(f"The playground takes text, not {type(text).__name__}.")
        utf8_bytes(text)  # lone surrogates and the like: refuse before changing anything
        note = ""
        if len(text) > MAX_CHARS:
            note = f"The text is long: only its first {MAX_CHARS:,} characters are tokenized. "
            text = text[:MAX_CHARS]
        ids = self.tokenizer.encode(text)
        ref_ids = reference_ids(self.reference, text)
        spans = tv.spans_from_ids(self.tokenizer, ids, ref_ids)
        shown, cut = tv.truncate(spans, self.max_tokens) if spans else ([], "")
        # all computed: now change the state and the view
        self.text, self.ids, self.ref_ids = text, ids, ref_ids
        self.summary.value = tv.stats_html(tv.text_stats(text, ids), (note + cut).strip())
        self.tokens.value = tv.tokens_html(shown)
        n = len(shown)
        self.id_table.value = tv.ids_html(ids[:n], None if ref_ids is None else ref_ids[:max(n, 0)]) + \
            (f'<div style="color:#8a5a00">{html.escape(cut)}</div>' if cut else "")
        if ref_ids is not None and ids != ref_ids and ids[:n] == ref_ids[:n]:
            self.id_table.value += (f'<div style="color:{tv.MISMATCH}">&#10008; differs from the reference at '
                                    f"token {tv.first_mismatch(ids, ref_ids)} (beyond the view)</div>")

    @guarded
    def set_word(self, word: str) -> None:
        """Show the merges that build `word` (a word or short phrase; the text's first 200 characters at most)."""
        if not isinstance(word, str):
            raise CourseError(f"The word must be text, not {type(word).__name__}.")
        if len(word) > 200:
            raise CourseError("The merge trace is for a word or a short phrase: keep it under 200 characters.")
        ids, steps = self.tokenizer.encode_with_trace(word)
        self.word, self.trace_ids = word, ids
        self.trace.value = tv.trace_html(word, steps, ids)
