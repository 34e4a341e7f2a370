"""Training a byte-level BPE: count adjacent pairs, merge the most frequent, repeat (notebook 01).

`pair_counts` and `merge` are the whole algorithm; `train_plain` is it written as a plain loop, to read.
`train_fast` learns exactly the same merges, fast enough for a real corpus: it counts each distinct
chunk once (weighted by how often it occurs), keeps the pair counts in a heap, and after a merge
recounts only the chunks that held the merged pair. Special tokens are cut out of the text first, so
no merge crosses or enters one; they count in the vocabulary size.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache

from ..errors import CourseError
from .pretokenize import (PreSplitter, bytes_to_unicode, special_token_pattern, split_special, token_text_to_bytes,
                          utf8_bytes)


def pair_counts(ids: list[int], counts: dict | None = None, weight: int = 1) -> dict:
    """How often each adjacent pair occurs in `ids` (times `weight`), added into `counts`."""
    counts = {} if counts is None else counts
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + weight
    return counts


def merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """`ids` with every occurrence of `pair`, scanned left to right, replaced by `new_id`."""
    out, i, n = [], 0, len(ids)
    while i < n:
        if i < n - 1 and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


@dataclass(frozen=True)
class LearnedMerge:
    """A merge found by training: `left` and `right` (ids) became `new_id`; the pair occurred `count` times."""

    left: int
    right: int
    new_id: int
    count: int


@lru_cache(maxsize=1)
def tie_break_order() -> dict[int, int]:
    """Byte -> its place among the 256 bytes when sorted by their GPT-2 characters (printable bytes first)."""
    chars = bytes_to_unicode()
    return {b: place for place, b in enumerate(sorted(range(256), key=lambda b: chars[b]))}


def most_frequent(counts: dict[tuple[int, int], int]) -> tuple[int, int]:
    """The pair with the highest count. Among equally frequent pairs: the one whose left token is older, then whose
    right token is older (bytes before merged tokens, bytes in `tie_break_order`), as the tokenizers library does."""
    order = tie_break_order()
    return max(counts, key=lambda p: (counts[p], [-order.get(t, t) for t in p]))



def _check_vocab_size(vocab_size, special_tokens=()) -> None:
    least = 256 + len(special_tokens)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < least:
        raise CourseError(f"vocab_size must be an int of at least {least} (one token per byte"
                          f"{', plus the special tokens' if special_tokens else ''}), not {vocab_size!r}.")


def training_chunks(text: str, special_tokens=()) -> list[str]:
    """The chunks training counts pairs in: special tokens cut out first (so no merge crosses or enters one),
    then GPT-2's pre-split of the ordinary text between them."""
    utf8_bytes(text)  # refuse text that has no UTF-8 form
    pattern, splitter = special_token_pattern(special_tokens), PreSplitter()
    return [chunk for piece, special in split_special(text, pattern) if not special for chunk in splitter(piece)]


def train_plain(text: str, vocab_size: int, special_tokens=()) -> tuple[dict[tuple[int, int], int], list[LearnedMerge]]:
    """The plain training loop (as in minbpe), on GPT-2's pre-split chunks: (merges, history).

    Every step recounts every pair of every chunk: easy to read, slow on a large text (use train_fast).
    Ties between equally frequent pairs go by `most_frequent`, as in train_fast and the tokenizers library.
    The special tokens count in `vocab_size` (they take the last ids), so there are vocab_size - 256 - len(them) merges.
    """
    _check_vocab_size(vocab_size, special_tokens)
    chunks = [list(chunk.encode("utf-8")) for chunk in training_chunks(text, special_tokens)]
    return train_on_chunks(chunks, vocab_size - len(special_tokens))


def train_on_chunks(chunks: list[list[int]], vocab_size: int) -> tuple[dict[tuple[int, int], int], list[LearnedMerge]]:
    """The plain loop itself, on chunks already cut and turned into byte ids: merges get ids 256 .. vocab_size - 1."""
    merges: dict[tuple[int, int], int] = {}
    history = []
    for new_id in range(256, vocab_size):
        counts: dict[tuple[int, int], int] = {}
        for ids in chunks:
            pair_counts(ids, counts)
        if not counts:
            break  # every chunk is a single token: nothing left to merge
        best = most_frequent(counts)
        merges[best] = new_id
        history.append(LearnedMerge(best[0], best[1], new_id, counts[best]))
        chunks = [merge(ids, best, new_id) for ids in chunks]
    return merges, history


def train_fast(text: str, vocab_size: int, verbose: bool = False, special_tokens=()):
    """The same merges as train_plain, fast: (merges, vocab, history). See the module docstring for how."""
    _check_vocab_size(vocab_size, special_tokens)
    chunk_freq = Counter(training_chunks(text, special_tokens))
    words = [list(chunk.encode("utf-8")) for chunk in chunk_freq]
    freqs = list(chunk_freq.values())

    counts: dict[tuple[int, int], int] = {}
    where: dict[tuple[int, int], set[int]] = defaultdict(set)  # pair -> indices of the words holding it
    for index, (word, freq) in enumerate(zip(words, freqs)):
        pair_counts(word, counts, freq)
        for pair in zip(word, word[1:]):
            where[pair].add(index)
    # A heap of (-count, tie-break key, pair): the top is the most frequent pair. Entries go stale
    # when a count changes; a fresh entry is pushed then, and stale ones are skipped when popped.
    order = tie_break_order()

    def key(pair):
        return order.get(pair[0], pair[0]), order.get(pair[1], pair[1])

    heap = [(-c, key(pair), pair) for pair, c in counts.items()]
    heapq.heapify(heap)

    vocab = {i: bytes([i]) for i in range(256)}
    merges: dict[tuple[int, int], int] = {}
    history = []
    for new_id in range(256, vocab_size - len(special_tokens)):
        best = None
        while heap:
            neg, _, pair = heapq.heappop(heap)
            if counts.get(pair) == -neg:
                best = pair, -neg
                break
        if best is None:
            break  # nothing left to merge
        pair, count = best
        merges[pair] = new_id
        vocab[new_id] = vocab[pair[0]] + vocab[pair[1]]
        history.append(LearnedMerge(pair[0], pair[1], new_id, count))
        changed = set()
        for index in where.pop(pair, ()):
            old = words[index]
            new = merge(old, pair, new_id)
            if len(new) == len(old):
                continue
            freq = freqs[index]
            for p in zip(old, old[1:]):
                counts[p] -= freq
                changed.add(p)
            for p in zip(new, new[1:]):
                counts[p] = counts.get(p, 0) + freq
                where[p].add(index)
                changed.add(p)
            words[index] = new
        for p in changed:
            c = counts[p]
            if c > 0:
                heapq.heappush(heap, (-c, key(p), p))
            else:
                del counts[p]
        if verbose:
            print(f"merge {new_id - 255:>5}: {vocab[pair[0]]!r} + {vocab[pair[1]]!r} -> "
                  f"{vocab[new_id]!r} (id {new_id}, seen {count:,} times)")
    return merges, vocab, history


def hf_trained_tokenizer(text: str, vocab_size: int, special_tokens=()):
    """The tokenizers library's BPE trainer on `text`: the reference for our `train` (a tokenizers.Tokenizer).

    Same GPT-2 pre-split (ByteLevel), all 256 bytes as the start alphabet, the special tokens counted in the
    vocabulary. Its trainer would count pairs inside special-token text, so it gets the text between them.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=0, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(special_tokens))
    pieces = [piece for piece, special in split_special(text, special_token_pattern(special_tokens)) if not special]
    hf.train_from_iterator(pieces, trainer=trainer)
    return hf


def hf_trained_merges(text: str, vocab_size: int, special_tokens=()) -> list[tuple[bytes, bytes]]:
    """The merges (as byte pairs, in order) that the tokenizers library's BPE trainer learns from `text`."""
    merges = json.loads(hf_trained_tokenizer(text, vocab_size, special_tokens).to_str())["model"]["merges"]
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
    return [(token_text_to_bytes(a), token_text_to_bytes(b)) for a, b in pairs]
