"""Checks for notebook 01 (tokens): the training loop, encoding by rank, SmolLM2's pre-split.

Each check runs the learner's function on text the notebook never showed, compares it with the library
(bpe_train.train_plain, BPETokenizer's encoder, the model's pre-tokenizer chain) and names the typical mistake.
"""

from __future__ import annotations

import contextlib

import regex

from ..tokens import bpe, bpe_train
from ..tokens.pretokenize import GPT2_SPLIT_PATTERN, PreSplitter
from . import call, exercise, expect, forbidden, hint, hints  # noqa: F401  (hint: for the notebook)

# Held back from the learner: the text the training loop is checked on.
HELD_BACK = """The tea shop on the corner opens at seven. Every morning the owner sets out the teapots, then the cups,
then the little plates for the cakes. The first customers are the regulars: the baker, the teacher, the two
brothers who run the bookshop. They talk about the weather, the news and the price of tea. The owner listens,
pours, and smiles. In the afternoon the students arrive, then the tourists, then the quiet readers who stay
until the shop closes. At the end of the day the owner washes the teapots, counts the coins and turns off the
lights. Then the street is dark, and the shop waits for the morning."""
SMOLLM2_SPLIT = PreSplitter((regex.compile(r"\p{N}"), regex.compile(GPT2_SPLIT_PATTERN)))  # digits, then GPT-2


def _label(data: bytes) -> str:
    return repr(data.decode("utf-8", errors="replace"))


@contextlib.contextmanager
def _no_trainer():
    with contextlib.ExitStack() as stack:
        for owner in (bpe, bpe_train):
            for name in ("train_plain", "train_fast", "hf_trained_merges", "hf_trained_tokenizer"):
                stack.enter_context(forbidden(owner, name, "write the loop yourself: count, pick, merge, repeat"))
        stack.enter_context(forbidden(bpe.BPETokenizer, "train", "write the loop yourself: count, pick, merge, repeat"))
        yield


def _as_pairs(merges) -> list[tuple[tuple[int, int], int]]:
    if isinstance(merges, dict):
        return [(tuple(pair), new_id) for pair, new_id in merges.items()]
    return [(tuple(pair), 256 + i) for i, pair in enumerate(merges)]


@exercise
@hints("Start from the chunks: bpe.PreSplitter()(text) cuts the text, and each chunk becomes list(chunk.encode('utf-8')).",
       "Each round: count every adjacent pair inside every chunk (bpe.pair_counts(ids, counts) adds one chunk's pairs), "
       "pick best = bpe.most_frequent(counts), give it the next id, and replace it in every chunk with bpe.merge.",
       "chunks = [list(c.encode('utf-8')) for c in bpe.PreSplitter()(text)]; merges = {}; "
       "for new_id in range(256, vocab_size): counts = {}; (pair_counts of each chunk); if not counts: break; "
       "best = bpe.most_frequent(counts); merges[best] = new_id; chunks = [bpe.merge(ids, best, new_id) for ids in chunks]")
def check_train(train, vocab_size: int = 256 + 40) -> str:
    """Exercise 1.1: train(text, vocab_size) -> {(left id, right id): new id}, in the order learned."""
    expect(callable(train), "define a function train(text, vocab_size) that returns the merges as a dict.")
    expected, history = bpe_train.train_plain(HELD_BACK, vocab_size)
    with _no_trainer():
        got = call(train, HELD_BACK, vocab_size)
    expect(isinstance(got, (dict, list)), f"return the merges as a dict {{(left, right): new_id}}, not "
                                          f"{type(got).__name__}.")
    got = _as_pairs(got)
    expect(len(got) > 0, "no merges came back: the loop should learn vocab_size - 256 of them.")
    ids = [new_id for _, new_id in got]
    expect(ids == list(range(256, 256 + len(got))), f"the new ids should be 256, 257, 258 ... in order, not "
                                                    f"{ids[:4]} ...: ids 0-255 are the bytes.")
    vocab = {i: bytes([i]) for i in range(256)}
    chunks = [list(c.encode("utf-8")) for c in PreSplitter()(HELD_BACK)]
    for step, ((left, right), new_id) in enumerate(got):
        expect(left in vocab and right in vocab, f"merge {step + 1} joins ids {left} and {right}, which do not exist "
                                                 "yet: a merge joins two existing tokens.")
        made = vocab[left] + vocab[right]
        expect(not regex.search(rb"\S\s", made),
               f"merge {step + 1} makes {_label(made)}, a token that runs across two chunks: pre-split the text "
               "first (bpe.PreSplitter()) and count pairs inside each chunk only.")
        counts: dict = {}
        for chunk in chunks:
            bpe.pair_counts(chunk, counts)
        best = bpe.most_frequent(counts)
        seen = counts.get((left, right), 0)
        expect(seen > 0, f"merge {step + 1} joins {_label(vocab[left])} + {_label(vocab[right])}, which no longer "
                         "occur together at that point (earlier merges used them up): count the pairs again after "
                         "every merge, on the merged ids of every chunk.")
        expect(seen == counts[best], f"merge {step + 1} joins {_label(vocab[left])} + {_label(vocab[right])}, seen "
                                     f"{seen} times, but {_label(vocab[best[0]] + vocab[best[1]])} is seen "
                                     f"{counts[best]} times at that point: count the pairs again after every merge, "
                                     "on the merged ids.")
        expect((left, right) == best, f"merge {step + 1}: {_label(vocab[left])} + {_label(vocab[right])} and "
                                      f"{_label(vocab[best[0]])} + {_label(vocab[best[1]])} are both seen {seen} "
                                      "times; break ties as the library does: best = bpe.most_frequent(counts).")
        vocab[new_id] = made
        chunks = [bpe.merge(chunk, (left, right), new_id) for chunk in chunks]
    expect(len(got) == len(expected), f"{len(got)} merges for vocab_size {vocab_size}; expected "
                                      f"{len(expected)} (vocab_size - 256).")
    last = history[-1]
    return (f"the same {len(got)} merges as the library on a text you had not seen; the last one made "
            f"{_label(vocab[last.new_id])} ({last.count} times). The fast trainer below learns exactly these.")


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
    with contextlib.ExitStack() as stack:
        for name in ("_bpe", "_encode_chunk", "encode", "encode_ordinary", "encode_with_trace"):
            stack.enter_context(forbidden(bpe.BPETokenizer, name, "apply the merges yourself, lowest rank first"))
        for ids, merges, right in cases:
            got = call(encode_chunk, list(ids), dict(merges))
            expect(isinstance(got, list), f"return a list of ids, not {type(got).__name__}.")
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
        for word, ids, right in words:
            got = call(encode_chunk, list(ids), tokenizer.merges)
            expect(got == right, f"with SmolLM2's 48,900 merges, {word!r} should give {right} "
                                 f"{[tokenizer.vocab[i].decode('utf-8', 'replace') for i in right]}, not {got}.")
    if words:
        return f"crafted merges and {len(words)} new words with SmolLM2's merges: the same ids as the model."
    return "merges by rank, lowest first, until none applies: how every BPE tokenizer encodes a chunk."


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
        got = call(pre_split, text)
        expect(isinstance(got, list) and all(isinstance(p, str) for p in got),
               f"return a list of strings (the chunks), not {type(got).__name__}.")
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
