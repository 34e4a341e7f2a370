"""The one way the course writes a token as readable text (the playground, the explorer, the stepper).

A token often starts with a space or is a newline; shown raw, it would vanish. So whitespace is
drawn: ' the' shows as '·the', a newline as '↵', a tab as '→'. A token that is only part of a
character (a byte-level BPE can split an emoji) shows its bytes in hex: '<F0 9F>'. `glyph_legend(labels)` says
how to read the marks that occur in a set of labels, for a caption beside a picture of tokens.
"""

from __future__ import annotations

import re

VISIBLE = {" ": "\u00b7", "\n": "\u21b5", "\t": "\u2192", "\r": "\u240d"}
MEANING = {" ": "a space", "\n": "a newline", "\t": "a tab", "\r": "a carriage return"}
CUT = "\u2026"
HEX_BYTES = re.compile(r"<[0-9A-F]{2}( [0-9A-F]{2})*>")  # how token_label writes a piece of a character


def token_label(token: bytes | str, max_chars: int | None = None) -> str:
    """Readable text for a token given as its bytes or its decoded text; cut to `max_chars` with '…'."""
    if isinstance(token, bytes):
        try:
            token = token.decode("utf-8")
        except UnicodeDecodeError:
            return "<" + " ".join(f"{b:02X}" for b in token) + ">"
    text = "".join(VISIBLE.get(c, c) for c in token)
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars - 1] + CUT
    return text


def token_labels(tokenizer, ids, max_chars: int | None = 12) -> list[str]:
    """One label per token id, from the tokenizer's text for each id alone."""
    return [token_label(tokenizer.decode([int(i)]), max_chars) for i in ids]


def glyph_legend(labels) -> str:
    """How to read the marks token_label drew in `labels` (only those that occur), as one line such as
    '· = a space, ↵ = a newline'; '' when there is none."""
    labels = list(labels)
    text = "".join(labels)
    parts = [f"{VISIBLE[c]} = {MEANING[c]}" for c in VISIBLE if VISIBLE[c] in text]
    if any(HEX_BYTES.fullmatch(label) for label in labels):  # not a special token such as '<filename>'
        parts.append("<F0 9F> = the bytes of a character split across tokens")
    if CUT in text:
        parts.append(f"{CUT} = cut short")
    return ", ".join(parts)
