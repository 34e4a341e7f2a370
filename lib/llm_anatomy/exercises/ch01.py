"""Checks for notebook 01 (tokens)."""

from __future__ import annotations

from . import exercise, expect

# The sentence exercise 1.2 asks about, and the number exercise 1.3 asks about.
COUNT_TEXT = "Hello, world! Tokenizers aren't magic."
NUMBER = "31415926"


@exercise
def check_merge(merge) -> str:
    """`merge(ids, pair, new_id)`: every occurrence of `pair`, left to right, replaced by `new_id`."""
    expect(callable(merge), "define a function merge(ids, pair, new_id) that returns a new list.")
    got = merge([1, 2, 3, 1, 2], (1, 2), 99)
    expect(isinstance(got, list), f"return a list of ids, not {type(got).__name__}.")
    expect(got == [99, 3, 99], f"merge([1, 2, 3, 1, 2], (1, 2), 99) should be [99, 3, 99], got {got}.")
    got = merge([5, 6], (1, 2), 99)
    expect(got == [5, 6], f"when the pair does not occur, return the ids unchanged: expected [5, 6], got {got}.")
    got = merge([7, 7, 7], (7, 7), 8)
    expect(got == [8, 7], f"merge([7, 7, 7], (7, 7), 8) should be [8, 7]: after merging a pair, skip both of its "
                          f"ids, so one id is never used twice; got {got}.")
    got = merge([1, 2], (1, 2), 99)
    expect(got == [99], f"a pair at the very end must be merged too: expected [99], got {got}.")
    ids = [1, 2, 3]
    merge(ids, (1, 2), 99)
    expect(ids == [1, 2, 3], "do not change the list you were given: build and return a new one.")
    return "this one function, applied thousands of times, is all BPE training and encoding do."


@exercise
def check_token_count(answer, tokenizer, text: str = COUNT_TEXT) -> str:
    """The number of tokens the model's tokenizer makes of `text` (no special tokens)."""
    expect(answer is not None, "assign a number to `n_tokens`, computed with the tokenizer.")
    expect(isinstance(answer, int) and not isinstance(answer, bool),
           f"give a whole number of tokens, not {type(answer).__name__}.")
    true = len(tokenizer(text, add_special_tokens=False).input_ids)
    expect(answer != len(text.split()), f"{answer} is the number of words; tokens are not words.")
    expect(answer != len(text), f"{answer} is the number of characters; most tokens hold several.")
    expect(answer != len(text.encode("utf-8")), f"{answer} is the number of bytes; BPE merges bytes into tokens.")
    expect(answer == true, f"{answer} is not it. Hint: len(tokenizer(text, add_special_tokens=False).input_ids).")
    return (f"{true} tokens for {len(text.split())} words: {tokenizer.convert_ids_to_tokens(tokenizer.encode(text))}")


@exercise
def check_number_tokens(answer, tokenizer, number: str = NUMBER) -> str:
    """How many tokens the model's tokenizer makes of the digits `number`."""
    expect(answer is not None, "assign a number to `n_digit_tokens`.")
    expect(isinstance(answer, int) and not isinstance(answer, bool),
           f"give a whole number of tokens, not {type(answer).__name__}.")
    true = len(tokenizer(number, add_special_tokens=False).input_ids)
    expect(answer == true, f"{answer} is not it. Count the tokens of {number!r} with the tokenizer, and look at "
                           "them with tokenizer.convert_ids_to_tokens.")
    return (f"{true} tokens for {len(number)} digits: SmolLM2 has no token longer than one digit, so every number "
            "is spelled out digit by digit.")
