"""The tokenizer playground's view: token spans, colours, id comparison, HTML.

Nothing here touches ipywidgets, so tests call it directly. The widget
(`llm_anatomy.widgets.playground`) only wires these to a text box.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from ..tokens.bpe import BPETokenizer, MergeStep, utf8_bytes
from ..errors import CourseError
from .labels import glyph_legend, token_label

# Soft background colours, cycled token by token so that neighbours always differ.
PALETTE = ("#ffd6a5", "#caffbf", "#9bf6ff", "#bdb2ff", "#ffc6ff", "#fdffb6", "#a0c4ff", "#ffadad")
MISMATCH = "#b00020"


@dataclass(frozen=True)
class TokenSpan:
    """One token of a text: its position, id, the bytes it stands for, and what the reference says."""

    index: int
    id: int
    data: bytes
    ref_id: int | None  # the reference tokenizer's id at the same position (None: no reference / shorter)

    @property
    def n_bytes(self) -> int:
        return len(self.data)

    @property
    def matches(self) -> bool:
        """True when there is no reference, or it gives the same id here."""
        return self.ref_id is None or self.ref_id == self.id

    @property
    def label(self) -> str:
        """The token as readable text: whitespace made visible; a piece of a character as hex bytes."""
        return token_label(self.data)


def colour(index: int) -> str:
    """The background colour of the token at `index`."""
    return PALETTE[index % len(PALETTE)]


def token_spans(tokenizer: BPETokenizer, text: str, ref_ids: list[int] | None = None) -> list[TokenSpan]:
    """The tokens of `text` under `tokenizer`, each with the reference's id at the same place (if given)."""
    ids = tokenizer.encode(text)
    return spans_from_ids(tokenizer, ids, ref_ids)


def spans_from_ids(tokenizer: BPETokenizer, ids: list[int], ref_ids: list[int] | None = None) -> list[TokenSpan]:
    """TokenSpans for ids already computed."""
    spans = []
    for index, token_id in enumerate(ids):
        ref = None if ref_ids is None else (ref_ids[index] if index < len(ref_ids) else -1)
        spans.append(TokenSpan(index, token_id, tokenizer.token_bytes(token_id), ref))
    return spans


def compare_ids(ours: list[int], ref: list[int]) -> list[tuple[int | None, int | None, bool]]:
    """Side by side: (our id, reference id, equal) for each position of the longer list."""
    rows = []
    for i in range(max(len(ours), len(ref))):
        a = ours[i] if i < len(ours) else None
        b = ref[i] if i < len(ref) else None
        rows.append((a, b, a == b))
    return rows


def first_mismatch(ours: list[int], ref: list[int]) -> int | None:
    """The first position where the two id lists differ (None when they are equal)."""
    for i, (a, b, same) in enumerate(compare_ids(ours, ref)):
        if not same:
            return i
    return None


@dataclass(frozen=True)
class TextStats:
    characters: int
    bytes: int
    tokens: int

    @property
    def bytes_per_token(self) -> float:
        """Compression: UTF-8 bytes per token (0.0 for empty text)."""
        return self.bytes / self.tokens if self.tokens else 0.0


def text_stats(text: str, ids: list[int]) -> TextStats:
    """Counts for `text` and its token ids: characters, UTF-8 bytes, tokens."""
    return TextStats(len(text), len(utf8_bytes(text)), len(ids))


def truncate(items: list, limit: int) -> tuple[list, str]:
    """The first `limit` items, and a note saying what was left out ('' when nothing was)."""
    if limit < 1:
        raise CourseError(f"The view limit must be at least 1 token, not {limit}.")
    if len(items) <= limit:
        return items, ""
    return items[:limit], f"Showing the first {limit:,} of {len(items):,} tokens."


# --------------------------------------------------------------------------- HTML


def tokens_html(spans: list[TokenSpan]) -> str:
    """Coloured tokens with their ids underneath; a token whose id differs from the reference is outlined red."""
    if not spans:
        return '<div class="la-playground-empty" style="color:#555">(no tokens: the text is empty)</div>'
    parts = []
    for span in spans:
        border = f"2px solid {MISMATCH}" if not span.matches else "1px solid #ccc"
        title = f"token {span.index}: id {span.id}, {span.n_bytes} byte{'s' if span.n_bytes != 1 else ''}"
        if not span.matches:
            title += f"; reference id {span.ref_id}"
        parts.append(
            f'<span class="la-token{"" if span.matches else " la-token-mismatch"}" data-id="{span.id}" '
            f'title="{html.escape(title)}" style="display:inline-block;margin:1px;padding:0 2px;'
            f'background:{colour(span.index)};border:{border};border-radius:3px;white-space:pre;'
            f'font-family:monospace;text-align:center;vertical-align:top">{html.escape(span.label)}'
            f'<br><span style="font-size:70%;color:#333">{span.id}</span></span>')
    legend = glyph_legend(span.label for span in spans)  # how to read the marks drawn for whitespace and bytes
    if legend:
        parts.append(f'<div class="la-glyph-legend" style="font-size:80%;color:#555">{html.escape(legend)}</div>')
    return "<div>" + "".join(parts) + "</div>"


def ids_html(ours: list[int], ref: list[int] | None) -> str:
    """Our ids and the reference ids as two rows of a table; differing positions in red."""
    if ref is None:
        return "<div>ids: " + html.escape(", ".join(map(str, ours))) + "</div>"
    rows = compare_ids(ours, ref)
    same = all(equal for *_, equal in rows)
    cells_ours, cells_ref = [], []
    for a, b, equal in rows:
        style = "" if equal else f' style="color:{MISMATCH};font-weight:bold"'
        cls = "la-id" if equal else "la-id la-id-mismatch"
        cells_ours.append(f'<td class="{cls}"{style}>{"" if a is None else a}</td>')
        cells_ref.append(f'<td class="{cls}"{style}>{"" if b is None else b}</td>')
    verdict = ('<span style="color:#1b7f3b">&#10004; same ids as the reference</span>' if same else
               f'<span style="color:{MISMATCH}">&#10008; differs from the reference at token '
               f"{first_mismatch(ours, ref)}</span>")
    return ('<div style="overflow-x:auto"><table style="font-family:monospace;font-size:85%">'
            f'<tr><th style="text-align:left">ours</th>{"".join(cells_ours)}</tr>'
            f'<tr><th style="text-align:left">reference</th>{"".join(cells_ref)}</tr></table>'
            f"{verdict}</div>")


def trace_html(word: str, steps: list[MergeStep], ids: list[int]) -> str:
    """The merges that turn `word`'s bytes into its tokens, one line per merge."""
    if not word:
        return '<div style="color:#555">Type a word to see its merges.</div>'
    start = " ".join(token_label(bytes([b])) for b in word.encode("utf-8"))
    lines = [f"<div><b>bytes:</b> <code>{html.escape(start)}</code></div>"]
    for n, step in enumerate(steps, 1):
        pieces = " ".join(token_label(p) for p in step.pieces)
        lines.append(f'<div class="la-trace-step">{n}. merge #{step.rank}: '
                     f"<code>{html.escape(token_label(step.left))}</code> + "
                     f"<code>{html.escape(token_label(step.right))}</code> &rarr; "
                     f"<code>{html.escape(token_label(step.merged))}</code> (id {step.new_id}) "
                     f"&nbsp; now: <code>{html.escape(pieces)}</code></div>")
    lines.append(f"<div><b>{len(ids)} token{'s' if len(ids) != 1 else ''}:</b> "
                 f"{html.escape(', '.join(map(str, ids)))} after {len(steps)} merge{'s' if len(steps) != 1 else ''}</div>")
    return "".join(lines)


def stats_html(stats: TextStats, note: str = "") -> str:
    extra = f' <span class="la-playground-note" style="color:#8a5a00">{html.escape(note)}</span>' if note else ""
    return (f"<div><b>{stats.tokens:,}</b> tokens &middot; {stats.characters:,} characters &middot; "
            f"{stats.bytes:,} bytes &middot; {stats.bytes_per_token:.2f} bytes per token{extra}</div>")
