"""Notebook 01's exercise checks: the solutions pass, typical wrong answers fail with a specific message."""

from __future__ import annotations

import regex

from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.tokens import bpe
from llm_anatomy.exercises import ch01

solutions = load_solutions("ch01")


# --------------------------------------------------------------------------- 1.1 the training loop


def test_the_training_loop_solution_passes_and_equals_the_library():
    verdict = ch01.check_train(solutions.train)
    assert verdict.passed, verdict.message
    merges, _ = bpe.train_plain(ch01.HELD_BACK, 256 + 40)
    assert solutions.train(ch01.HELD_BACK, 256 + 40) == merges


def _flattened(text, vocab_size):  # counts pairs across chunk boundaries
    ids, merges = list(text.encode("utf-8")), {}
    for new_id in range(256, vocab_size):
        best = bpe.most_frequent(bpe.pair_counts(ids))
        merges[best] = new_id
        ids = bpe.merge(ids, best, new_id)
    return merges


def _counts_once(text, vocab_size):  # never recounts: takes the top pairs of the first count
    counts = {}
    for chunk in bpe.PreSplitter()(text):
        bpe.pair_counts(list(chunk.encode("utf-8")), counts)
    top = sorted(counts, key=lambda p: -counts[p])[:vocab_size - 256]
    return {pair: 256 + i for i, pair in enumerate(top)}


def _plain_max(text, vocab_size):  # the loop is right, ties broken by dict order
    chunks = [list(c.encode("utf-8")) for c in bpe.PreSplitter()(text)]
    merges = {}
    for new_id in range(256, vocab_size):
        counts = {}
        for ids in chunks:
            bpe.pair_counts(ids, counts)
        best = max(counts, key=counts.get)
        merges[best] = new_id
        chunks = [bpe.merge(ids, best, new_id) for ids in chunks]
    return merges


def test_the_training_loop_mistakes_get_specific_messages():
    not_yet(ch01.check_train(_flattened), "across two chunks", "PreSplitter")
    not_yet(ch01.check_train(_counts_once), "count the pairs again after every merge")
    not_yet(ch01.check_train(_plain_max), "break ties", "most_frequent")
    not_yet(ch01.check_train(lambda text, n: {p: i + 1000 for p, i in solutions.train(text, n).items()}), "256, 257")
    not_yet(ch01.check_train(lambda text, n: dict(list(solutions.train(text, n).items())[:5])), "expected 40")
    not_yet(ch01.check_train(unattempted), "not attempted")
    not_yet(ch01.check_train(None), "define a function")
    not_yet(ch01.check_train(lambda text, n: "merges"), "dict")


def test_the_training_loop_check_refuses_the_library_trainer():
    def shortcut(text, vocab_size):
        return bpe.train_plain(text, vocab_size)[0]

    def shortcut_class(text, vocab_size):
        return bpe.BPETokenizer.train(text, vocab_size).merges

    not_yet(ch01.check_train(shortcut), "don't call", "train_plain")
    not_yet(ch01.check_train(shortcut_class), "don't call", "train")
    assert bpe.train_plain("abab", 257)[0] == {(97, 98): 256}  # restored afterwards


# --------------------------------------------------------------------------- 1.2 encoding by rank


def test_encode_chunk_solution_passes_with_crafted_and_real_merges(ours):
    assert ch01.check_encode_chunk(solutions.encode_chunk).passed
    verdict = ch01.check_encode_chunk(solutions.encode_chunk, ours)
    assert verdict.passed and "SmolLM2" in verdict.message, verdict.message


def test_encode_chunk_mistakes_get_specific_messages(ours):
    def leftmost(ids, merges):
        i = 0
        while i < len(ids) - 1:
            if (ids[i], ids[i + 1]) in merges:
                ids = ids[:i] + [merges[(ids[i], ids[i + 1])]] + ids[i + 2:]
                i = 0
            else:
                i += 1
        return ids

    def one_round(ids, merges):
        ranks = {p: r for r, p in enumerate(merges)}
        pair = min(zip(ids, ids[1:]), key=lambda p: ranks.get(p, float("inf")), default=None)
        return bpe.merge(ids, pair, merges[pair]) if pair in ranks else ids

    def first_only(ids, merges):
        ranks = {p: r for r, p in enumerate(merges)}
        while len(ids) > 1:
            i = min(range(len(ids) - 1), key=lambda j: ranks.get((ids[j], ids[j + 1]), float("inf")))
            if (ids[i], ids[i + 1]) not in ranks:
                break
            ids = ids[:i] + [merges[(ids[i], ids[i + 1])]] + ids[i + 2:]
            if ids[:2] == [300, 97]:
                return ids  # merges only the first occurrence of 'ab' in 'abab'
        return ids

    not_yet(ch01.check_encode_chunk(leftmost), "lowest-ranked pair first")
    not_yet(ch01.check_encode_chunk(one_round), "keep merging")
    not_yet(ch01.check_encode_chunk(first_only), "every occurrence")
    not_yet(ch01.check_encode_chunk(lambda ids, merges: "abc"), "list of ints")
    not_yet(ch01.check_encode_chunk(lambda ids, merges: None), "return")
    not_yet(ch01.check_encode_chunk(unattempted), "not attempted")
    not_yet(ch01.check_encode_chunk(lambda ids, merges: ours.encode(bytes(ids).decode("latin-1"))), "don't call")


# --------------------------------------------------------------------------- 1.3 SmolLM2's pre-split


def test_pre_split_solution_passes_and_equals_the_model(reference_tokenizer):
    assert ch01.check_pre_split(solutions.pre_split).passed
    from llm_anatomy.tokens.pretokenize import bytes_to_unicode

    to_char = bytes_to_unicode()
    for text in ["In 2024, 3.5% of 1,000 users", " ½ cup, ٣ apples, x²", "Room 101 \n\n  x"]:
        model = [p for p, _ in reference_tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]
        assert ["".join(to_char[b] for b in c.encode()) for c in solutions.pre_split(text)] == model


def test_pre_split_mistakes_get_specific_messages():
    not_yet(ch01.check_pre_split(lambda text: bpe.PreSplitter()(text)), "isolates every digit",
            "not a missing merge")
    ascii_digits = lambda text: [c for p in regex.split(r"([0-9])", text) if p for c in bpe.PreSplitter()(p)]  # noqa: E731
    not_yet(ch01.check_pre_split(ascii_digits), "any Unicode number")
    not_yet(ch01.check_pre_split(lambda text: [p for p in regex.split(r"(\p{N})", text) if p]), "should give")
    not_yet(ch01.check_pre_split(lambda text: text.split()), "add up to the text")
    not_yet(ch01.check_pre_split(unattempted), "not attempted")


def test_the_digits_message_names_the_pre_tokenizer_not_a_missing_merge():
    message = ch01.check_pre_split(lambda text: bpe.PreSplitter()(text)).message
    assert "not because a merge is missing" not in message and "That, not a missing merge" in message


# --------------------------------------------------------------------------- hints


# --------------------------------------------------------------------------- 1.1a/b the two helpers


def test_the_helper_solutions_pass_and_equal_the_library():
    assert ch01.check_pair_counts(solutions.pair_counts).passed
    assert ch01.check_merge(solutions.merge).passed
    assert solutions.merge([4, 4, 4, 1, 4, 4], (4, 4), 9) == bpe.merge([4, 4, 4, 1, 4, 4], (4, 4), 9) == [9, 4, 1, 9]


def test_pair_counts_mistakes_get_specific_messages():
    def missing_last(ids, counts=None):
        counts = {} if counts is None else counts
        for i in range(len(ids) - 2):
            counts[(ids[i], ids[i + 1])] = counts.get((ids[i], ids[i + 1]), 0) + 1
        return counts

    def no_overlap(ids, counts=None):
        counts, i = ({} if counts is None else counts), 0
        while i + 1 < len(ids):
            counts[(ids[i], ids[i + 1])] = counts.get((ids[i], ids[i + 1]), 0) + 1
            i += 2 if ids[i] == ids[i + 1] else 1
        return counts

    def replaces(ids, counts=None):
        return solutions.pair_counts(ids, None)

    not_yet(ch01.check_pair_counts(missing_last), "last pair", "n - 1")
    not_yet(ch01.check_pair_counts(no_overlap), "overlapping")
    not_yet(ch01.check_pair_counts(replaces), "add into the counts you are given")
    not_yet(ch01.check_pair_counts(lambda ids, counts=None: list(zip(ids, ids[1:]))), "return a dict")
    not_yet(ch01.check_pair_counts(lambda ids, counts=None: bpe.pair_counts(ids, counts)), "don't call")
    not_yet(ch01.check_pair_counts(unattempted), "not attempted")


def test_merge_mistakes_get_specific_messages():
    def no_skip(ids, pair, new_id):  # a match moves on by one, not two
        out, i = [], 0
        while i < len(ids):
            out.append(new_id if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair else ids[i])
            i += 1
        return out

    def drops_last(ids, pair, new_id):
        out, i = [], 0
        while i + 1 < len(ids):
            if (ids[i], ids[i + 1]) == pair:
                out.append(new_id)
                i += 2
            else:
                out.append(ids[i])
                i += 1
        return out

    def first_only(ids, pair, new_id):
        for i in range(len(ids) - 1):
            if (ids[i], ids[i + 1]) == pair:
                return ids[:i] + [new_id] + ids[i + 2:]
        return list(ids)

    def in_place(ids, pair, new_id):
        merged = solutions.merge(ids, pair, new_id)
        ids[:] = merged
        return merged

    not_yet(ch01.check_merge(no_skip), "skip both", "9, 4")
    not_yet(ch01.check_merge(drops_last), "last id is lost")
    not_yet(ch01.check_merge(first_only), "every occurrence")
    not_yet(ch01.check_merge(in_place), "unchanged", "new list")
    not_yet(ch01.check_merge(lambda ids, pair, new_id: bpe.merge(ids, pair, new_id)), "don't call")
    not_yet(ch01.check_merge(unattempted), "not attempted")
