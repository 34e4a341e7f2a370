"""Checks for notebook 01 (tokens): counting pairs (1.1a), one merge (1.1b), the training loop (1.1); the pre-split
(1.2) and encoding by rank (1.3) are checked in ch01_encoding.py and imported here.

Each check runs the learner's function on text the notebook never showed, compares it with the library
(bpe_train.train_plain) and names the typical mistake.
"""

from __future__ import annotations

import random

import regex

from ..texts import HELD_BACK, HELD_BACK_2
from ..tokens import bpe, bpe_train
from ..tokens.pretokenize import PreSplitter
from . import call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: for the notebook)
from .ch01_encoding import check_encode_chunk, check_pre_split  # noqa: F401  (1.2 and 1.3: every check is ch01.check_*)



def _label(data: bytes) -> str:
    return repr(data.decode("utf-8", errors="replace"))


PAIR_CASES = [[5, 5, 5, 7, 5, 5, 1], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [8], []]  # held back: overlaps, repeats, edges


def _non_overlapping_counts(ids: list[int]) -> dict:
    counts, i = {}, 0
    while i + 1 < len(ids):
        counts[(ids[i], ids[i + 1])] = counts.get((ids[i], ids[i + 1]), 0) + 1
        i += 2 if ids[i] == ids[i + 1] else 1
    return counts


def _no_helper(name: str) -> forbidden_all:
    return forbidden_all([getattr(bpe_train, name)], f"write {name} yourself, with a loop over adjacent ids")


@exercise
@hints("Walk along the ids and look at each id together with the one after it. How many such pairs has a list of n?",
       "zip(ids, ids[1:]) gives every adjacent pair, overlapping ones included; add 1 to each pair's count in the dict "
       "(counts.get(pair, 0) + 1), and make a new dict only when counts is None.",
       "Start from counts (or {}), loop over the adjacent pairs adding one to each, and return the same dict.")
def check_pair_counts(pair_counts) -> str:
    """Exercise 1.1a: pair_counts(ids, counts=None) adds how often each adjacent pair occurs in ids into counts."""
    expect(callable(pair_counts), "define a function pair_counts(ids, counts=None) that returns a dict of counts.")
    for ids in PAIR_CASES:
        with _no_helper("pair_counts"):
            got = call(pair_counts, list(ids), None)
        expect(isinstance(got, dict), f"return a dict {{(left id, right id): count}}, not {type(got).__name__}.")
        want = bpe_train.pair_counts(ids)
        if got == want:
            continue
        expect(got != bpe_train.pair_counts(ids[:-1]), f"the last pair {tuple(ids[-2:])} of {ids} is missing: a list "
                                                       "of n ids has n - 1 adjacent pairs.")
        expect(got != _non_overlapping_counts(ids), "count overlapping pairs too: in 5, 5, 5 the pair (5, 5) occurs "
                                                    "twice (positions 0-1 and 1-2).")
        expect(False, f"for {ids} the counts are {want}, not {got}.")
    for given in ({(5, 5): 10}, {}):  # the training loop passes one dict, empty at first, and reads that one
        counts, before = given, dict(given)
        with _no_helper("pair_counts"):
            got = call(pair_counts, [5, 5, 6], counts)
        want = {(5, 5): before.get((5, 5), 0) + 1, (5, 6): 1}
        expect(got is counts or bool(before), "given an empty dict you returned another one: `counts or {}` makes a new "
                                        "dict when counts is empty ({} counts as false), so the training loop, which "
                                        "reads the dict it passed, sees nothing. Test `if counts is None:` instead.")
        expect(got is counts, "you returned another dict: add into the counts you are given, that dict itself (the "
                              "loop calls you once per chunk with one shared dict and reads it), and return it.")
        expect(counts == want, f"adding [5, 5, 6] to {before} gives {want}, not {counts}: add to the counts already "
                               "there, do not replace them.")
    return "every adjacent pair counted, overlapping ones too, added into one dict across chunks: BPE's statistics."


def _merge_without_skip(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """A match that moves on by one only: the pair's second id is kept as well."""
    return [new_id if i + 1 < len(ids) and (a, ids[i + 1]) == pair else a for i, a in enumerate(ids)]


MERGE_CASES = [([1, 2, 3, 1, 2], (1, 2), 9), ([4, 4, 4], (4, 4), 9), ([4, 4, 4, 4, 4], (4, 4), 300),
               ([7, 8, 7], (8, 9), 300), ([2, 6, 2, 6], (2, 6), 256), ([5], (5, 5), 256),
               ([11, 2, 1, 2, 21, 1, 23], (1, 2), 256), ([12, 1, 2, 112], (1, 2), 300)]  # ids of several digits


@exercise
@hints("Build a new list, walking along the ids from the left. What do you do when the pair starts at your position, "
       "and how far do you move then?",
       "Use an index i and a while loop: if ids[i], ids[i + 1] is the pair, append new_id and jump 2; otherwise append "
       "ids[i] and move 1. Do not read past the end.",
       "Scanning left to right, an overlapping run 4, 4, 4 merges its first two only (9, 4): after a match skip both "
       "ids, and keep the last one when no pair starts there.")
def check_merge(merge) -> str:
    """Exercise 1.1b: merge(ids, pair, new_id) -> a new list with every occurrence of pair, left to right, replaced."""
    expect(callable(merge), "define a function merge(ids, pair, new_id) that returns the new list of ids.")
    for ids, pair, new_id in MERGE_CASES:
        given = list(ids)
        with _no_helper("merge"):
            got = returned(call(merge, given, pair, new_id), "ids", "the merged ids (a list)")
        expect(given == ids, "leave the ids you are given unchanged: return a new list (the loop keeps the old one).")
        want = bpe_train.merge(ids, pair, new_id)
        if got == want:
            continue
        expect(got != _merge_without_skip(ids, pair, new_id), "after a match, skip both ids of the pair (i += 2): "
                                                               "4, 4, 4 with the pair (4, 4) becomes 9, 4.")
        expect(max(ids) < 10, f"merge works on ids, not on their digits: {ids} holds the pair {pair} only where two "
                              f"neighbouring ids are {pair[0]} and {pair[1]}, so it becomes {want}, not {got}. Replacing "
                              "text in the joined ids also matches inside 11, 2 or 21, 1, 2: compare ids pairwise.")
        expect(not (len(got) == len(want) - 1 and got == want[:-1]), f"the last id is lost ({want} expected, got "
                                                                    f"{got}): keep an id at the end that starts no pair.")
        expect(ids.count(pair[0]) < 2 or got.count(new_id) != 1 or want.count(new_id) == 1,
               f"replace every occurrence of the pair, not only the first: {ids} -> {want}.")
        expect(False, f"merge({ids}, {pair}, {new_id}) gives {want}, not {got}.")
    return "every occurrence replaced, left to right, overlaps settled the way BPE settles them."


class _PreSplitSeen:
    """Whether the learner's code cut a text with bpe.PreSplitter (watched, not refused: it is the way to cut)."""

    def __enter__(self):
        self.seen = False

        def called(arguments) -> bool:
            self.seen = True
            return False  # never refused

        self._watch = forbidden_all([(PreSplitter, "__call__")], "", when=called)
        self._watch.__enter__()
        return self

    def __exit__(self, *exc):
        return self._watch.__exit__(*exc)


def _no_trainer() -> forbidden_all:
    import tokenizers

    names = ("train_plain", "train_on_chunks", "train_fast", "hf_trained_merges", "hf_trained_tokenizer")
    return forbidden_all([(owner, name) for owner in (bpe, bpe_train) for name in names if hasattr(owner, name)]
                         + [(bpe.BPETokenizer, "train"), (tokenizers.Tokenizer, "train"),
                            (tokenizers.Tokenizer, "train_from_iterator")],
                         "write the loop yourself: count, pick, merge, repeat")


def _as_pairs(merges) -> list[tuple[tuple[int, int], int]]:
    expect(isinstance(merges, (dict, list, tuple)), f"return the merges as a dict {{(left, right): new_id}}, not "
                                                    f"{type(merges).__name__}.")
    items = merges.items() if isinstance(merges, dict) else ((pair, 256 + i) for i, pair in enumerate(merges))
    pairs = []
    for pair, new_id in items:
        expect(isinstance(pair, tuple) and len(pair) == 2, f"each merge's key is a pair of ids (left, right), not "
                                                           f"{pair!r}.")
        pairs.append(((returned(pair[0], "id", "a merge's left id"), returned(pair[1], "id", "a merge's right id")),
                      returned(new_id, "id", "a merge's new id")))
    return pairs


def _counted_once_per_chunk(text: str, vocab_size: int) -> dict:
    """The loop with each pair counted once per chunk however often it occurs there (set(zip(ids, ids[1:])))."""
    chunks, merges = [list(c.encode("utf-8")) for c in PreSplitter()(text)], {}
    for new_id in range(256, vocab_size):
        counts: dict = {}
        for ids in chunks:
            for pair in set(zip(ids, ids[1:])):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = bpe.most_frequent(counts)
        merges[best] = new_id
        chunks = [bpe.merge(ids, best, new_id) for ids in chunks]
    return merges


_WORD_SPLIT = regex.compile(r" ?\w+| ?[^\w\s]+|\s+")  # a home-made pre-split: digits glued to letters, "'" apart


def _trained_on(chunks: list[str], vocab_size: int) -> list:
    return list(bpe_train.train_on_chunks([list(c.encode("utf-8")) for c in chunks], vocab_size)[0])


def _generated_text(vocab_size: int) -> str:
    """A text made up at check time whose words repeat a pair inside themselves (' banana', ' lolol'), on which
    counting a pair once per chunk learns other merges than counting every occurrence; it also holds what GPT-2's
    pre-split cuts in its own way (digits after letters, double spaces, 's), so that a pre-split of one's own
    learns other merges too."""
    rng = random.Random()
    for _ in range(50):  # bounded: nearly every draw tells them apart
        syllables = [rng.choice("bdklmnprst") + rng.choice("aeiou") for _ in range(6)]
        words = [rng.choice(syllables) * rng.randint(2, 4) + rng.choice(["", "s", "n"]) for _ in range(12)]
        words += ["".join(rng.sample(syllables, 3)) for _ in range(12)]  # and words with no repeat, seen often
        words += [rng.choice(syllables) + str(rng.randint(2, 99)) for _ in range(4)]  # 'ka42': letters, then digits
        words += [w + "'s" for w in rng.sample(words, 4)]
        text = "".join(rng.choice(words) + rng.choice([" "] * 5 + ["  "]) for _ in range(160)).strip()
        plain = list(bpe_train.train_plain(text, vocab_size)[0])
        if (list(_counted_once_per_chunk(text, vocab_size)) != plain
                and _trained_on(_WORD_SPLIT.findall(text), vocab_size) != plain):
            return text
    raise RuntimeError("no generated text told the ways of counting and cutting apart")


def _named_mistake(got: list, text: str, vocab_size: int, expected: dict) -> None:
    """Name the loop mistakes that the merge-by-merge replay would blame on something else."""
    pairs = [pair for pair, _ in got]
    wanted = len(expected)
    if wanted > 1 and (len(set(pairs)) == 1 or (len(got) == 1 and got[0][1] == vocab_size - 1)):
        expect(False, f"every round merged the same pair, {pairs[0]}: the chunks never changed. bpe.merge returns the "
                      "merged ids as a new list (it leaves the old one as it is): keep what it returns, "
                      "chunks = [bpe.merge(ids, best, new_id) for ids in chunks].")
    words, _ = bpe_train.train_on_chunks([list(w.encode("utf-8")) for w in text.split()], vocab_size)  # str.split
    made = {i: bytes([i]) for i in range(256)}
    for (left, right), new_id in got:
        made[new_id] = made.get(left, b"?") + made.get(right, b"?")
    once = _counted_once_per_chunk(text, vocab_size)
    if list(once) != list(expected) and [pair for pair, _ in got] == list(once)[:len(got)]:
        expect(False, "you counted each pair once per chunk, however often it occurs there (a set of pairs?): in "
                      "' banana' the pair 'an' occurs twice, and BPE counts every occurrence. Add 1 for each adjacent "
                      "pair, repeats included (bpe.pair_counts(ids, counts)).")
    spaces = [new_id for _, new_id in got if b" " in made[new_id]]
    if dict(got) == words or (not spaces and any(32 in pair for pair in list(expected)[:len(got)])):
        expect(False, "none of your tokens holds a space: did you cut the text with str.split()? It throws the "
                      "spaces away, but GPT-2's pre-split keeps each space with the word after it (' the'), and "
                      "those tokens are most of a vocabulary. Cut with bpe.PreSplitter()(text).")


@exercise
@hints("Work chunk by chunk: what does each chunk start as, and what does one round of the loop do to all of them?",
       "Cut the text with bpe.PreSplitter()(text); each chunk starts as its UTF-8 byte ids. Each round: count every "
       "adjacent pair inside every chunk (bpe.pair_counts(ids, counts) adds one chunk's pairs), pick "
       "bpe.most_frequent(counts), give it the next id, and replace it in every chunk with bpe.merge (which returns "
       "a new list).",
       "chunks = [list(c.encode('utf-8')) for c in bpe.PreSplitter()(text)]; merges = {}; "
       "for new_id in range(256, vocab_size): counts = {}; (pair_counts of each chunk); if not counts: break; "
       "best = bpe.most_frequent(counts); merges[best] = new_id; chunks = [bpe.merge(ids, best, new_id) for ids in chunks]")
def check_train(train, vocab_size: int = 256 + 40) -> str:
    """Exercise 1.1: train(text, vocab_size) -> {(left id, right id): new id}, in the order learned."""
    expect(callable(train), "define a function train(text, vocab_size) that returns the merges as a dict.")
    first = None
    for text, size in ((HELD_BACK, vocab_size), (HELD_BACK_2, 256 + 27), (_generated_text(256 + 20), 256 + 20)):
        expected, history = bpe_train.train_plain(text, size)
        with _no_trainer(), _PreSplitSeen() as cut:
            got = call(train, text, size)
        expect(got is not None, "your function returned None: end it with `return merges`.")
        got = _as_pairs(got)
        expect(first is None or got[:len(expected)] != first[:len(expected)],
               "you returned the same merges for two different texts: learn them from `text`, the text the check "
               "passes (and stop at `vocab_size`), not from a text or a table fixed in advance.")
        _check_merges(got, text, size, expected, cut.seen)
        first = got
    return (f"the same merges as the library on three texts you had not seen (one made up just now), at three "
            f"vocabulary sizes (the last merge was seen {history[-1].count} times). The fast trainer below learns "
            "exactly these.")


def _own_pre_split(got, text: str, where: str) -> None:
    """For code that never called bpe.PreSplitter: replay its merges on GPT-2's chunks, letting it break ties its own
    way; a merge less frequent than the most frequent pair there means its chunks were others. (No pre-split at
    all shows as a token that runs across two chunks: the replay in _check_merges names it.)"""
    made = {i: bytes([i]) for i in range(256)}
    for (left, right), new_id in got:
        made[new_id] = made.get(left, b"?") + made.get(right, b"?")
        if regex.search(rb"\S\s", made[new_id]):
            return
    chunks = [list(c.encode("utf-8")) for c in PreSplitter()(text)]
    for step, ((left, right), new_id) in enumerate(got):
        counts: dict = {}
        for chunk in chunks:
            bpe.pair_counts(chunk, counts)
        expect(not counts or counts.get((left, right), 0) == max(counts.values()),
               f"merge {step + 1} is not the most frequent pair in GPT-2's chunks {where}, and your code never called "
               "bpe.PreSplitter: a pre-split of your own cuts digits after letters, runs of spaces or 's otherwise "
               "than GPT-2's pattern, and this text holds all three. Cut with bpe.PreSplitter()(text).")
        chunks = [bpe.merge(chunk, (left, right), new_id) for chunk in chunks]


def _check_merges(got, text: str, vocab_size: int, expected: dict, pre_split: bool = True) -> None:
    where = f"(a text of {len(text)} characters, vocab_size {vocab_size})"
    expect(len(got) > 0, f"no merges came back {where}: the loop should learn vocab_size - 256 of them.")
    _named_mistake(got, text, vocab_size, expected)
    if not pre_split:
        _own_pre_split(got, text, where)
    ids = [new_id for _, new_id in got]
    expect(ids == list(range(256, 256 + len(got))), f"the new ids should be 256, 257, 258 ... in order, not "
                                                    f"{ids[:4]} ...: ids 0-255 are the bytes.")
    vocab = {i: bytes([i]) for i in range(256)}
    chunks = [list(c.encode("utf-8")) for c in PreSplitter()(text)]
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
