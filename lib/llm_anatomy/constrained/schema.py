"""A small JSON-schema subset compiled to a regular pattern (automaton.py turns it into a DFA).

Supported: an object whose properties are all required (in the schema's order, no others), each of type string
(minLength and maxLength allowed),
integer, number, boolean, an enum of JSON values, an array of one of those (items), or a nested object of the same
kind. Whitespace is fixed, as json.dumps writes it: separators (", ", ": ") by default, so the answer has exactly one
spelling per value. That is xgrammar's compile_json_schema(..., any_whitespace=False, separators=(", ", ": "),
strict_mode=True) grammar, which tests/constrained checks token mask by token mask. Anything else (optional
properties, minLength, pattern, $ref, oneOf ...) is refused with UnsupportedSchema, one sentence naming it.
"""

from __future__ import annotations

import json

from ..errors import CourseError
from .automaton import escape

# JSON's own grammar (RFC 8259), as xgrammar writes it: a string's characters are any but " \ and the controls
_CHAR = r'([^"\\\x00-\x1f]|\\(["\\/bfnrt]|u[0-9a-fA-F]{4}))'
STRING = '"' + _CHAR + '*"'
INTEGER = r"-?(0|[1-9][0-9]*)"
NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
BOOLEAN = r"(true|false)"
_PRIMITIVES = {"string": STRING, "integer": INTEGER, "number": NUMBER, "boolean": BOOLEAN}
_ANNOTATIONS = {"title", "description", "$schema", "examples", "default", "$id", "$comment"}


class UnsupportedSchema(CourseError):
    """The schema uses a feature outside the course's subset (the message names it)."""


def _check_keys(schema: dict, allowed: set, where: str):
    extra = sorted(set(schema) - allowed - _ANNOTATIONS)
    if extra:
        raise UnsupportedSchema(f"The schema at {where} uses {extra[0]!r}, which the course's subset does not support.")


def schema_pattern(schema: dict | str, separators: tuple[str, str] = (", ", ": "), where: str = "the top") -> str:
    """The regular pattern whose matches are exactly the JSON texts of `schema` written with `separators`."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    if not isinstance(schema, dict):
        raise UnsupportedSchema(f"The schema at {where} must be an object (a dict), not {schema!r}.")
    item_sep, key_sep = separators
    if "enum" in schema:
        _check_keys(schema, {"enum", "type"}, where)
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise UnsupportedSchema(f"The enum at {where} must be a non-empty list.")
        return "(" + "|".join(escape(json.dumps(v, ensure_ascii=False, separators=separators)) for v in values) + ")"
    kind = schema.get("type")
    if kind is None:
        _check_keys(schema, {"type"}, where)  # names the feature in its place (oneOf, $ref, ...) if there is one
    if kind == "string" and ("minLength" in schema or "maxLength" in schema):
        _check_keys(schema, {"type", "minLength", "maxLength"}, where)
        low, high = schema.get("minLength", 0), schema.get("maxLength", "")
        return f'"{_CHAR}{{{low},{high}}}"'  # a bounded string: an answer that must end within a token budget
    if kind in _PRIMITIVES:
        _check_keys(schema, {"type"}, where)
        return _PRIMITIVES[kind]
    if kind == "array":
        _check_keys(schema, {"type", "items"}, where)
        if "items" not in schema:
            raise UnsupportedSchema(f"The array at {where} needs 'items'.")
        item = schema_pattern(schema["items"], separators, f"{where}.items")
        return escape("[") + f"({item}({escape(item_sep)}{item})*)?" + escape("]")
    if kind == "object":
        _check_keys(schema, {"type", "properties", "required", "additionalProperties"}, where)
        props = schema.get("properties", {})
        if set(schema.get("required", [])) != set(props):
            raise UnsupportedSchema(f"The object at {where} has optional properties; the course's subset needs every "
                                    "property required.")
        if schema.get("additionalProperties", False) is not False:
            raise UnsupportedSchema(f"The object at {where} allows additionalProperties; the subset needs false.")
        parts = [escape(json.dumps(name, ensure_ascii=False)) + escape(key_sep)
                 + schema_pattern(sub, separators, f"{where}.{name}") for name, sub in props.items()]
        return escape("{") + escape(item_sep).join(parts) + escape("}")
    raise UnsupportedSchema(f"The schema at {where} has type {kind!r}; the subset supports object, array, string, "
                            "integer, number, boolean and enum.")
