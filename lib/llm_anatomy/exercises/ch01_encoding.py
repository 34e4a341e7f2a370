"""Checks for notebook 01's second half: SmolLM2's pre-split (exercise 1.2) and encoding a chunk by rank (1.3).

`exercises/ch01.py` holds the training checks (1.1a, 1.1b, 1.1) and imports these two, so that every check of the
chapter is `llm_anatomy.exercises.ch01.check_*`. Each runs the learner's function on text the notebook never showed,
compares it with the library (BPETokenizer's encoder, the model's pre-tokenizer chain) and names the typical mistake.
"""

from __future__ import annotations

import contextlib
import sys

import regex

from ..tokens import bpe, bpe_hf
from ..tokens.pretokenize import GPT2_SPLIT_PATTERN, PreSplitter
from . import call, exercise, expect, forbidden_all, hints, returned

SMOLLM2_SPLIT = PreSplitter((regex.compile(r"\p{N}"), regex.compile(GPT2_SPLIT_PATTERN)))  # digits, then GPT-2


@exercise
@hints("Look at all adjacent pairs of the word's ids and ask which of them is a merge at all, and which was learned first.",
       "The rank of a merge is its place in `merges` (earliest learned = lowest). Repeatedly merge the lowest-ranked "
       "pair present anywhere in the word, until no pair is a merge. Leftmost-first gives other tokens.",
       "ranks = {pair: r for r, pair in enumerate(merges)}; while len(ids) > 1: pair = min(zip(ids, ids[1:]), "
       "key=lambda p: ranks.get(p, inf)); if pair not in ranks: break; ids = bpe.merge(ids, pair, merges[pair])")
def check_encode_chunk(encode_chunk, tokenizer=None) -> str:
    """Exercise 1.3: encode_chunk(ids, merges) applies the merges to one chunk's byte ids, lowest rank first."""
    expect(callable(encode_chunk), "define a function encode_chunk(ids, merges) that returns a list of ids.")
    a, b, c = ord("a"), ord("b"), ord("c")
    # later merges build on earlier ones, as in a trained tokenizer; the new ids do not follow the ranks
    crafted = {(b, c): 302, (a, b): 300, (a, 302): 301}
    cases = [([a, b, c], crafted, [301]), ([a, b, a, b], crafted, [300, 300]), ([c, a], crafted, [c, a]),
             ([a, b, c, a, b, c], crafted, [301, 301]), ([], crafted, [])]
    words = _reference_words(tokenizer) if tokenizer is not None else []  # computed before the encoder is forbidden
    with _no_encoder():
        for ids, merges, right in cases:
            got = returned(call(encode_chunk, list(ids), dict(merges)), "ids", "the chunk's token ids")
            if got == right:
                continue
            expect(not (ids == [a, b, c] and got == [300, c]),
                   "encode_chunk('abc') merged a+b first, but b+c was learned earlier (rank 0, first in `merges`): "
                   "merge the lowest-ranked pair first, wherever it sits in the chunk and whatever its new id.")
            expect(not (ids == [a, b, c] and got == [a, 302]),
                   "after merging b+c the chunk is a, 'bc', and a + 'bc' is a merge too: keep merging until no pair is "
                   "a merge.")
            expect(not (ids == [a, b, a, b] and got in ([300, a, b], [a, b, 300])),
                   "a merge replaces every occurrence of its pair in the chunk: 'abab' becomes 'ab' 'ab'.")
            expect(False, f"encode_chunk({ids}, merges) should give {right}, not {got}.")
        for word, ids, right in words:  # a copy of the merges each time: the notebook's tokenizer keeps its own
            got = returned(call(encode_chunk, list(ids), dict(tokenizer.merges)), "ids", "the chunk's token ids")
            expect(got == right, f"with SmolLM2's 48,900 merges, {word!r} should give {right} "
                                 f"{[tokenizer.vocab[i].decode('utf-8', 'replace') for i in right]}, not {got}.")
    if words:
        return f"crafted merges and {len(words)} new words with SmolLM2's merges: the same ids as the model."
    return "merges by rank, lowest first, until none applies: how every BPE tokenizer encodes a chunk."


def _no_encoder() -> forbidden_all:
    import tokenizers

    base = sys.modules.get("transformers.tokenization_utils_base")
    tokenizer_base = getattr(base, "PreTrainedTokenizerBase", None)
    return forbidden_all([(bpe.BPETokenizer, name) for name in ("_bpe", "_encode_chunk", "encode", "encode_ordinary",
                                                                "encode_with_trace", "encode_iterable")]
                         + [(tokenizers.Tokenizer, "encode"), (tokenizers.Tokenizer, "encode_batch")]
                         + [(tokenizer_base, name) for name in ("__call__", "encode", "tokenize")],
                         "apply the merges yourself, lowest rank first")


def _reference_words(tokenizer):
    words = [" unbelievably", " tokenization", "Pneumonoultramicroscopic", " naïve", " 🙂", "\n\n    "]
    return [(w, [tokenizer.byte_ids[x] for x in w.encode("utf-8")], tokenizer._bpe(w)) for w in words]


@exercise
@hints("SmolLM2's pre-split runs in two steps. Print tokenizer.backend_tokenizer.pre_tokenizer and read them in order.",
       "First every digit becomes a chunk of its own, and 'digit' means any Unicode number, \\p{N} (so ½ and ٣ too); then "
       "GPT-2's pattern splits each remaining piece (bpe.PreSplitter() does that step).",
       "pieces = [p for p in regex.split(r'(\\p{N})', text) if p]; then return [c for p in pieces for c in "
       "bpe.PreSplitter()(p)]  (the group in the pattern keeps the digits)")
def check_pre_split(pre_split) -> str:
    """Exercise 1.2: pre_split(text) -> SmolLM2's chunks: every digit isolated, then GPT-2's pattern."""
    expect(callable(pre_split), "define a function pre_split(text) that returns a list of strings.")
    texts = ["In 2024, 3.5% of 1,000 users paid $19.99.", "x = 42  # answer\n", "Room 101 ", " ½ cup, ٣ apples, x²",
             "v2.0-rc1", "", "   12"]
    for text in texts:
        with _no_model_splitter():
            got = call(pre_split, text)
        expect(got is not None, "your function returned None: end it with `return chunks`.")
        expect(isinstance(got, (list, tuple)), f"return the chunks as a list of strings, not {type(got).__name__}.")
        odd = next((p for p in got if not isinstance(p, str)), None)
        expect(odd is None, f"return each chunk as a string (str), not as {type(odd).__name__} {odd!r}: the split "
                            "cuts text; turning a chunk into bytes comes after it.")
        got = list(got)
        right = SMOLLM2_SPLIT(text)
        if got == right:
            continue
        expect("".join(got) == text, f"the chunks of {text!r} should add up to the text itself; yours make "
                                     f"{''.join(got)!r}.")
        ascii_runs = [p for p in got if regex.fullmatch(r" ?[0-9]+", p) and len(p) > 1]
        first = ascii_runs[0] if ascii_runs else ""
        expect(not ascii_runs, f"{first!r} holds more than a digit: SmolLM2 isolates every digit before the "
                               "byte-level split, so ' 2024' is ' ', '2', '0', '2', '4'. That, not a missing merge, "
                               "is why numbers go digit by digit.")
        others = [p for p in got if len(p) > 1 and regex.search(r"\p{N}", p)]
        first = others[0] if others else ""
        expect(not others, f"{first!r} is not split: a digit is any Unicode number (\\p{{N}}), so ½, ² and ٣ are "
                           "isolated too (the tokenizers library's Digits uses Rust's is_numeric).")
        expect(False, f"pre_split({text!r}) should give {right}, not {got}.")
    return ("digits isolated, then GPT-2's pattern: the chain the model's tokenizer.json names. A space before a number "
            "stays a token of its own because the digits step cut it off, not because a merge is missing.")


@contextlib.contextmanager
def _no_model_splitter():
    """The model's own pre-split refused: ours.chunks, ours.splitter (a PreSplitter with a digits step), the
    tokenizers library's pre_tokenizer."""
    import tokenizers.pre_tokenizers as pre

    why = "write the digits step yourself (regex), then GPT-2's step with bpe.PreSplitter()"

    def has_digits_step(arguments) -> bool:
        steps = getattr(arguments.get("self"), "steps", ())
        return any(isinstance(step, regex.Pattern) and step.pattern in (r"\p{N}", r"\p{N}+") for step in steps)

    with forbidden_all([(bpe.BPETokenizer, "chunks"), (bpe.BPETokenizer, "split_special"),
                        (bpe_hf, "splitter_from_hf"), (pre.PreTokenizer, "pre_tokenize_str"),
                        (pre.PreTokenizer, "pre_tokenize")], why), \
            forbidden_all([(PreSplitter, "__call__")], "that splitter isolates the digits for you: " + why,
                          when=has_digits_step):
        yield
