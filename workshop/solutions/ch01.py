"""Solutions to the exercises of notebook 01 (tokens)."""

from __future__ import annotations


def merge(ids, pair, new_id):
    """Exercise 1.1: replace every occurrence of `pair` in `ids`, left to right, by `new_id`."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == tuple(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def token_count(tokenizer, text):
    """Exercise 1.2: the number of tokens of `text` (no special tokens added)."""
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def number_tokens(tokenizer, number):
    """Exercise 1.3: the number of tokens of a string of digits (one per digit for SmolLM2)."""
    return len(tokenizer(number, add_special_tokens=False).input_ids)
