"""Before any merge: text as UTF-8 bytes, and the pre-split that cuts it into chunks (notebook 01).

A byte-level tokenizer starts from the 256 byte values, so it can encode any text. Before merging,
the text is cut into chunks with a regular expression (words with their leading space, numbers,
runs of punctuation, runs of whitespace); merges never cross a chunk boundary. Models chain several
such steps (SmolLM2 first isolates every digit, then applies GPT-2's pattern): `PreSplitter` is that chain.

Byte-level vocabularies store each byte as a printable character (GPT-2's `bytes_to_unicode`),
which is why a leading space shows as 'Ġ' in a tokenizer.json.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import regex

from ..errors import CourseError

# GPT-2's pre-split pattern (also the one tokenizers' ByteLevel pre-tokenizer uses): English
# contractions, letters with an optional leading space, numbers with an optional leading space,
# other symbols with an optional leading space, whitespace not followed by a non-space, whitespace.
GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte (0..255) to a printable character, used to store tokens as text.

    Printable bytes map to themselves; the rest (space, control bytes...) map to characters from
    U+0100 upwards, in byte order. That is why a leading space shows as 'Ġ' (byte 32 -> U+0120)
    and a newline as 'Ċ' (byte 10 -> U+010A) in byte-level vocabularies.
    """
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of `bytes_to_unicode`: printable character -> byte."""
    return {c: b for b, c in bytes_to_unicode().items()}


def token_text_to_bytes(token: str) -> bytes:
    """The bytes a byte-level vocabulary entry (such as 'Ġthe') stands for (b' the')."""
    inverse = unicode_to_bytes()
    if all(c in inverse for c in token):
        return bytes(inverse[c] for c in token)
    return token.encode("utf-8")  # an added token stored as plain text


def utf8_bytes(text: str) -> bytes:
    """The UTF-8 bytes of `text`; a CourseError for text that has no UTF-8 form (lone surrogates)."""
    if not isinstance(text, str):
        raise CourseError(f"Give the tokenizer a string, not {type(text).__name__}.")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = text[err.start:err.end]
        raise CourseError(f"The text holds {bad!r} at position {err.start}, a lone surrogate that is not a "
                          "character and has no UTF-8 bytes: remove it or pair it.") from None


def special_token_pattern(special_tokens) -> regex.Pattern | None:
    """A pattern that finds any of `special_tokens` (longest first, so the longest wins at one position)."""
    tokens = list(special_tokens)
    if any(not isinstance(s, str) or not s for s in tokens) or len(set(tokens)) != len(tokens):
        raise CourseError(f"special tokens must be distinct, non-empty strings, not {tokens!r}.")
    if not tokens:
        return None
    return regex.compile("|".join(regex.escape(s) for s in sorted(tokens, key=len, reverse=True)))


def split_special(text: str, pattern: regex.Pattern | None) -> list[tuple[str, bool]]:
    """`text` cut into (piece, is_special) parts: each special token whole, the ordinary text between."""
    if pattern is None:
        return [(text, False)] if text else []
    parts, start = [], 0
    for m in pattern.finditer(text):
        if m.start() > start:
            parts.append((text[start:m.start()], False))
        parts.append((m.group(), True))
        start = m.end()
    if start < len(text):
        parts.append((text[start:], False))
    return parts


def _isolate(pieces: list[str], pattern: regex.Pattern) -> list[str]:
    """Split each piece so that every match of `pattern` is a piece of its own (Isolated)."""
    out = []
    for piece in pieces:
        start = 0
        for m in pattern.finditer(piece):
            if m.start() > start:
                out.append(piece[start:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            start = m.end()
        if start < len(piece):
            out.append(piece[start:])
    return out


def _prefix_space(pieces: list[str]) -> list[str]:
    """Put a space before each piece that does not start with one (ByteLevel's add_prefix_space)."""
    return [p if p.startswith(" ") else " " + p for p in pieces]


@dataclass(frozen=True)
class PreSplitter:
    """Cuts text into chunks: a series of steps, each splitting every piece further.

    steps: compiled patterns (every match becomes a chunk of its own, and so does each gap between matches),
        or the function `_prefix_space`.
    normalize: a unicodedata form ("NFC"...) applied first, or None.
    """

    steps: tuple = (regex.compile(GPT2_SPLIT_PATTERN),)
    normalize: str | None = None

    def __call__(self, text: str) -> list[str]:
        if self.normalize:
            text = unicodedata.normalize(self.normalize, text)
        pieces = [text] if text else []
        for step in self.steps:
            pieces = _isolate(pieces, step) if isinstance(step, regex.Pattern) else step(pieces)
        return pieces
