"""The API's response_format: a request's answer constrained to JSON by the course's own token mask (issue 50).

    {"type": "json_object"}                                    any JSON object (json_object_pattern below)
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": true}}   one schema of the subset

A format becomes a pattern (constrained/schema.py), a minimal DFA over bytes (constrained/minimize.py) and a
TokenMasker. The masker's cache of masks per state is the expensive part, and it only depends on the pattern, so
`Formats` keeps one masker per pattern and every request with that pattern shares it; the DFA state is each
request's own (`RowMask`, on the scheduler's Request). The engine thread is the only one that asks a masker for
masks, so the shared cache needs no lock.

The sampler (serve/sampler.py) applies a request's RowMask to its row of logits before its draw and advances its state
by the chosen token, so the end of the turn (EOS) is allowed only where the JSON is complete; rows without a format
are not touched. A schema outside the subset is refused before the engine sees it (a 400 naming the feature); pydantic's
schemas (openai's `parse`) are accepted: "title", "required" and "additionalProperties": false are what the subset
wants, and their local "$ref"s into "$defs" (a nested model) are written out in place; a recursive one is refused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from ..constrained import DEAD, TokenMasker, UnsupportedSchema, compile_pattern, escape, schema_pattern
from ..constrained.minimize import minimized
from ..constrained.schema import NUMBER, STRING
from ..errors import CourseError

JSON_OBJECT_DEPTH = 3  # json_object: objects and arrays nested at most this deep (a DFA cannot count brackets)
MAX_LENGTH = 256  # the largest minLength/maxLength compiled: a bound of n is n copies of a string's character
MINIMIZE_UP_TO = 4096  # DFA states: a larger DFA is used as it is (minimizing it takes seconds, not a fraction)


def json_object_pattern(depth: int = JSON_OBJECT_DEPTH) -> str:
    """Any JSON object whose objects and arrays nest at most `depth` deep, written as json.dumps writes it
    (separators ", " and ": ", no other whitespace): a regular pattern can only count brackets up to a bound, and
    each level's values are the level below's, so the pattern grows fourfold per level (3 levels: about 3,400 states
    from the subset construction, about 300 once minimized)."""
    if depth < 1:
        raise CourseError(f"A JSON object has at least one level of nesting, not {depth}.")
    scalar = f"{STRING}|{NUMBER}|true|false|null"
    value = f"({scalar})"
    for _ in range(depth - 1):
        value = f"({scalar}|{_object(value)}|{_array(value)})"
    return _object(value)


def _object(value: str) -> str:
    member = f"{STRING}{escape(': ')}{value}"
    return escape("{") + f"({member}({escape(', ')}{member})*)?" + escape("}")


def _array(value: str) -> str:
    return escape("[") + f"({value}({escape(', ')}{value})*)?" + escape("]")


def inline_refs(schema: dict) -> dict:
    """The schema with each local "$ref" ("#/$defs/Name" or "#/definitions/Name") replaced by its definition (what
    pydantic writes for a nested model); a recursive one, or a $ref outside the document, is refused."""
    if not isinstance(schema, dict):
        return schema
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    top = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}

    def walk(node, seen: tuple):
        if isinstance(node, list):
            return [walk(v, seen) for v in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            ref = node["$ref"]
            name = ref.split("/")[-1] if isinstance(ref, str) else None
            if not isinstance(ref, str) or not ref.startswith(("#/$defs/", "#/definitions/")) or name not in defs:
                raise UnsupportedSchema(f"The schema's $ref {ref!r} does not point into its own $defs.")
            if name in seen:
                raise UnsupportedSchema(f"The schema's $ref to {name!r} is recursive; a regular pattern cannot nest "
                                        "without a bound.")
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return walk({**defs[name], **rest}, seen + (name,))
        return {k: v if k == "enum" else walk(v, seen) for k, v in node.items()}  # an enum's values are data

    return walk(top, ())


def _check_lengths(node) -> None:
    if isinstance(node, dict):
        for key in ("minLength", "maxLength"):
            if isinstance(node.get(key), int) and node[key] > MAX_LENGTH:
                raise UnsupportedSchema(f"The schema's {key} {node[key]} is over {MAX_LENGTH}, the most this server "
                                        "compiles.")
        for key, value in node.items():
            if key != "enum":
                _check_lengths(value)
    elif isinstance(node, list):
        for value in node:
            _check_lengths(value)


def format_pattern(response_format) -> str | None:
    """The pattern a response_format (schemas.ResponseFormat) asks for; None for "text" (no constraint)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return json_object_pattern()
    schema = inline_refs(response_format.json_schema.schema_)
    _check_lengths(schema)
    return schema_pattern(schema)


class RowMask:
    """One request's constraint: the shared masker and this request's own DFA state."""

    def __init__(self, masker: TokenMasker):
        self.masker, self.state = masker, masker.dfa.start

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits with every token the state does not allow at -inf (a new tensor: the batch's row is kept)."""
        allowed = self.masker.allowed(self.state).to(logits.device)
        return logits.masked_fill(~allowed, float("-inf"))

    def advance(self, token: int) -> None:
        state = self.masker.advance(self.state, token)
        if state == DEAD:  # only a wrong mask lets such a token through: this request ends with an error, alone
            raise CourseError(f"Token {token} leaves the response format's pattern.")
        self.state = state

    def fresh(self) -> "RowMask":
        return RowMask(self.masker)


class Formats:
    """The maskers of the formats asked for so far, one per pattern (the last `keep`), over one vocabulary.

    The vocabulary's bytes and its byte trie are made once (the first format asked for) and shared by every masker:
    a masker here is a shallow copy of the first with its own DFA and its own, empty, cache of masks. A state's mask
    is made on its first visit, on the engine thread: a few ms for most states, but a state inside a JSON string
    allows nearly every token and its first walk of the trie takes about 0.3 s on a 2-core CPU, during which that
    step waits; every later request with the same pattern finds it cached. The masks are 49,152 bools each: a
    pattern keeps at most one per state of its minimal DFA (json_object: about 300, some 15 MB).
    """

    def __init__(self, tokenizer, keep: int = 16):
        self.tokenizer, self.keep = tokenizer, keep
        self._base: TokenMasker | None = None
        self._maskers: OrderedDict[str, TokenMasker] = OrderedDict()
        self._lock = threading.Lock()  # handlers compile on worker threads; the dictionary is shared

    def masker(self, pattern: str) -> TokenMasker:
        with self._lock:
            if pattern in self._maskers:
                self._maskers.move_to_end(pattern)
                return self._maskers[pattern]
        dfa = compile_pattern(pattern)
        if dfa.num_states <= MINIMIZE_UP_TO:
            dfa = minimized(dfa)  # states with the same future share one mask
        with self._lock:
            if self._base is None:  # never asked for a mask itself: an evicted pattern's masks are not kept here
                self._base = TokenMasker.for_tokenizer(dfa, self.tokenizer)
            masker = self._base.for_dfa(dfa)  # the tokens and the trie shared; the DFA and the cache its own
            self._maskers[pattern] = masker
            while len(self._maskers) > self.keep:
                self._maskers.popitem(last=False)
        return masker

    def row_mask(self, response_format) -> RowMask | None:
        """A new request's constraint for its response_format (None: none); UnsupportedSchema for a schema outside
        the subset. Compiling can take a fraction of a second: the server calls it on a worker thread."""
        pattern = format_pattern(response_format)
        return None if pattern is None else RowMask(self.masker(pattern))

