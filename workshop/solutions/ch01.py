"""Solutions to the exercises of notebook 01 (tokens)."""

from __future__ import annotations

import regex

from llm_anatomy.tokens import bpe


def pair_counts(ids, counts=None):
    """Exercise 1.1a: add how often each adjacent pair of ids occurs into counts (a new dict when None)."""
    counts = {} if counts is None else counts
    for pair in zip(ids, ids[1:]):  # every adjacent pair, overlapping ones included
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def merge(ids, pair, new_id):
    """Exercise 1.1b: a new list with every occurrence of pair, scanned left to right, replaced by new_id."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2  # both ids are used up
        else:
            out.append(ids[i])
            i += 1
    return out


def train(text, vocab_size):
    """Exercise 1.1: the plain BPE training loop: count pairs in every chunk, merge the most frequent, repeat."""
    chunks = [list(chunk.encode("utf-8")) for chunk in bpe.PreSplitter()(text)]
    merges = {}
    for new_id in range(256, vocab_size):
        counts = {}
        for ids in chunks:
            bpe.pair_counts(ids, counts)
        if not counts:
            break
        best = bpe.most_frequent(counts)
        merges[best] = new_id
        chunks = [bpe.merge(ids, best, new_id) for ids in chunks]
    return merges


def encode_chunk(ids, merges):
    """Exercise 1.3: apply the lowest-ranked merge present (rank = place in `merges`) until none applies."""
    ranks = {pair: rank for rank, pair in enumerate(merges)}
    while len(ids) > 1:
        pair = min(zip(ids, ids[1:]), key=lambda p: ranks.get(p, float("inf")))
        if pair not in ranks:
            break
        ids = bpe.merge(ids, pair, merges[pair])
    return ids


def pre_split(text):
    """Exercise 1.2: SmolLM2's pre-split: every digit (any Unicode number) alone, then GPT-2's pattern."""
    pieces = [piece for piece in regex.split(r"(\p{N})", text) if piece]
    return [chunk for piece in pieces for chunk in bpe.PreSplitter()(piece)]
