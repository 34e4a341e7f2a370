"""Byte-level byte-pair encoding (BPE), from scratch: train one, or rebuild the model's own (notebook 01).

Text is turned into tokens in four steps:

1. special tokens such as ``<|im_start|>`` are cut out of the text first, whole;
2. the rest is *pre-split* into chunks (pretokenize.py); merges never cross a chunk boundary;
3. each chunk becomes its UTF-8 bytes, one starting token per byte (so any text can be encoded);
4. merges are applied, lowest rank (learned earliest) first, until none applies.

``BPETokenizer.train`` learns the merges from a corpus (bpe_train.py: count adjacent pairs, merge the
most frequent, repeat), never across or into a special token. ``BPETokenizer.from_hf`` reads the merges and
vocabulary of a transformers tokenizer (bpe_hf.py), and then ``encode`` gives exactly the ids that tokenizer
gives; ``encode_iterable`` gives the same ids for a text that arrives in pieces (a file read line by line).

Internally a tokenizer is three tables:
    byte_ids[b]           the id of the one-byte token for byte b (0..255)
    merges[(a, b)] = c    merging tokens a and b gives token c; ``ranks[(a, b)]`` is its order
    vocab[id] = bytes     what each token stands for
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .bpe_hf import tables_from_hf
from .bpe_train import (LearnedMerge, hf_trained_merges, hf_trained_tokenizer, merge, most_frequent,  # noqa: F401
                        pair_counts, tie_break_order, train_fast, train_plain)
from ..errors import CourseError
from .pretokenize import (GPT2_SPLIT_PATTERN, PreSplitter, bytes_to_unicode, special_token_pattern,  # noqa: F401
                          split_special, token_text_to_bytes, utf8_bytes)
from ..texts import load_corpus  # noqa: F401  the corpus lives with every course text; notebook 01 calls bpe.load_corpus()

_CACHE_LIMIT = 200_000  # chunk -> ids entries kept by encode() before the cache is emptied


@dataclass(frozen=True)
class MergeStep:
    """One merge applied while encoding: in chunk `chunk`, `left` + `right` became `merged` (id `new_id`).

    rank: the merge's place in the merge list (0 = learned first). pieces: the chunk's tokens after it.
    """

    chunk: str
    rank: int
    left: bytes
    right: bytes
    new_id: int
    pieces: tuple[bytes, ...]

    @property
    def merged(self) -> bytes:
        return self.left + self.right


class BPETokenizer:
    """A byte-level BPE tokenizer: `train` one on text, or rebuild a model's with `from_hf`."""

    def __init__(self, merges: dict[tuple[int, int], int], vocab: dict[int, bytes], byte_ids: list[int] | None = None,
                 special_tokens: dict[str, int] | None = None, splitter: PreSplitter | None = None,
                 ignore_merges: bool = False):
        self.merges = dict(merges)  # (left id, right id) -> new id, in rank order
        self.ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self.vocab = dict(vocab)  # id -> bytes
        self.byte_ids = list(byte_ids) if byte_ids is not None else list(range(256))
        self.special_tokens = dict(special_tokens or {})  # text -> id
        self.splitter = splitter or PreSplitter()
        self.ignore_merges = ignore_merges  # Llama-3 style: a chunk that is a whole vocabulary entry is one token
        self.history: list[LearnedMerge] = []  # filled by train()
        self._bytes_to_id = {b: i for i, b in self.vocab.items()} if ignore_merges else {}
        self._special_pattern = special_token_pattern(self.special_tokens)
        self._special_ids = {i: s for s, i in self.special_tokens.items()}
        self._cache: dict[str, list[int]] = {}

    def __repr__(self) -> str:
        return (f"BPETokenizer({len(self.vocab):,} tokens, {len(self.merges):,} merges, "
                f"{len(self.special_tokens)} special tokens)")

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    # ------------------------------------------------------------------ training

    @classmethod
    def train(cls, text: str, vocab_size: int, verbose: bool = False, special_tokens=()) -> BPETokenizer:
        """Learn `vocab_size - 256 - len(special_tokens)` merges from `text` with GPT-2's pre-split.

        Each step merges the most frequent adjacent pair of tokens, counted inside the pre-split chunks
        (never across them). Ties go to the pair whose left token is older, then whose right token is
        older; the 256 byte tokens count as older than every merged one, among themselves in the order of
        GPT-2's byte-to-character table (printable bytes first, see `bytes_to_unicode`). That is the rule
        the tokenizers library's trainer uses, so both learn the same merges from the same text. Training
        stops early if no pair is left. `tokenizer.history` lists every merge with its count.
        The work is done by `bpe_train.train_fast`, which gives the same merges as the plain loop `train_plain`.
        special_tokens (such as "<|endoftext|>") are cut out of the text before counting, so no merge crosses or
        enters one; they count in `vocab_size` and take the ids after the merges.
        """
        special_tokens = list(special_tokens)
        merges, vocab, history = train_fast(text, vocab_size, verbose, special_tokens)
        specials = {s: len(vocab) + i for i, s in enumerate(special_tokens)}
        vocab.update({i: s.encode("utf-8") for s, i in specials.items()})
        tokenizer = cls(merges, vocab, special_tokens=specials)
        tokenizer.history = history
        return tokenizer

    # ------------------------------------------------------------------ the model's own tokenizer

    @classmethod
    def from_hf(cls, tokenizer) -> BPETokenizer:
        """Our encoder with the vocabulary, merges, pre-split and special tokens of a transformers tokenizer.

        `tokenizer` is a transformers tokenizer backed by tokenizers (or a tokenizers.Tokenizer); see bpe_hf.py.
        """
        return cls(**tables_from_hf(tokenizer))

    # ------------------------------------------------------------------ encoding

    def _bpe(self, chunk: str) -> list[int]:
        """The token ids of one pre-split chunk: its bytes, then merges, lowest rank first."""
        data = chunk.encode("utf-8")
        if self.ignore_merges and data in self._bytes_to_id:
            return [self._bytes_to_id[data]]
        ids = [i for i in map(self.byte_ids.__getitem__, data) if i is not None]
        ranks, inf = self.ranks, float("inf")
        while len(ids) >= 2:
            pair = min(zip(ids, ids[1:]), key=lambda p: ranks.get(p, inf))
            if pair not in ranks:
                break
            ids = merge(ids, pair, self.merges[pair])
        return ids

    def _encode_chunk(self, chunk: str) -> list[int]:
        ids = self._cache.get(chunk)
        if ids is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            ids = self._cache[chunk] = self._bpe(chunk)
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of `text`, treating special-token text such as '<|im_end|>' as ordinary text."""
        utf8_bytes(text)
        out = []
        for chunk in self.splitter(text):
            out.extend(self._encode_chunk(chunk))
        return out

    def split_special(self, text: str) -> list[tuple[str, bool]]:
        """`text` cut into (piece, is_special) parts: each special token whole, the ordinary text between."""
        return split_special(text, self._special_pattern)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens in the text become their own ids (as the reference does)."""
        utf8_bytes(text)
        out = []
        for piece, special in self.split_special(text):
            if special:
                out.append(self.special_tokens[piece])
            else:
                out.extend(self.encode_ordinary(piece))
        return out

    def encode_iterable(self, texts: Iterable[str]) -> Iterator[int]:
        """The ids of the texts joined (the lines of a file, say), yielded as soon as they are final.

        Exactly `encode("".join(texts))`, in bounded memory: only the unfinished end of the text waits for the
        next piece, that is its last pre-split chunk (a word or a run of whitespace may go on) and any start of
        a special token. The chunks before it are encoded as the pre-split of the text so far cut them: cut
        apart and encoded alone, "\r" + "\n" would pre-split differently. Needs a pre-split whose chunks add up
        to the text (no normalizer, no added prefix space).
        """
        if self.splitter.normalize or any(callable(step) for step in self.splitter.steps):
            raise CourseError("encode_iterable needs a pre-split whose chunks add up to the text (this one normalizes "
                              "or adds a prefix space): encode the whole text at once instead.")
        pending = ""
        for text in texts:
            utf8_bytes(text)
            pending += text
            hold = len(pending) - self._special_tail(pending)
            pieces = [(chunk, special) for piece, special in self.split_special(pending[:hold])
                      for chunk in ([piece] if special else self.splitter(piece))]
            keep = pending[hold:]
            if pieces and not pieces[-1][1]:  # the last ordinary chunk may go on in the next text
                keep = pieces.pop()[0] + keep
            for piece, special in pieces:
                yield from [self.special_tokens[piece]] if special else self._encode_chunk(piece)
            pending = keep
        yield from self.encode(pending)

    def _special_tail(self, text: str) -> int:
        """The length of the longest end of `text` that could be the start of a special token."""
        longest = 0
        for special in self.special_tokens:
            for k in range(min(len(special), len(text)), longest, -1):
                if text.endswith(special[:k]):
                    longest = k
                    break
        return longest

    def chunks(self, text: str) -> list[str]:
        """The pre-split chunks of `text` (special tokens kept whole); merges never cross between them."""
        out = []
        for piece, special in self.split_special(text):
            out.extend([piece] if special else self.splitter(piece))
        return out

    def encode_with_trace(self, text: str) -> tuple[list[int], list[MergeStep]]:
        """Token ids of `text` and every merge applied on the way, in order, chunk by chunk.

        Meant for a word or a short phrase: it re-runs BPE step by step, without the cache.
        """
        utf8_bytes(text)
        ids_out, steps = [], []
        for piece, special in self.split_special(text):
            if special:
                ids_out.append(self.special_tokens[piece])
                continue
            for chunk in self.splitter(piece):
                ids = [i for i in map(self.byte_ids.__getitem__, chunk.encode("utf-8")) if i is not None]
                while len(ids) >= 2:
                    pair = min(zip(ids, ids[1:]), key=lambda p: self.ranks.get(p, float("inf")))
                    if pair not in self.ranks:
                        break
                    ids = merge(ids, pair, self.merges[pair])
                    steps.append(MergeStep(chunk, self.ranks[pair], self.vocab[pair[0]], self.vocab[pair[1]],
                                           self.merges[pair], tuple(self.vocab[i] for i in ids)))
                if self.ignore_merges and chunk.encode("utf-8") in self._bytes_to_id:
                    ids = [self._bytes_to_id[chunk.encode("utf-8")]]
                ids_out.extend(ids)
        return ids_out, steps

    # ------------------------------------------------------------------ decoding

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for."""
        try:
            return self.vocab[token_id]
        except (KeyError, TypeError):
            raise CourseError(f"{token_id!r} is not a token id of this tokenizer (0..{len(self.vocab) - 1}).") from None

    def decode_bytes(self, ids: list[int]) -> bytes:
        """The bytes that `ids` stand for, joined."""
        return b"".join(self.token_bytes(i) for i in ids)

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`. Bytes that are not valid UTF-8 (half a character) become '\ufffd', as in the reference."""
        out, run = [], []
        for i in ids:  # decode the runs between special tokens separately, as tokenizers does
            if i in self._special_ids:
                out.append(self.decode_bytes(run).decode("utf-8", errors="replace"))
                out.append(self._special_ids[i])
                run = []
            else:
                run.append(i)
        out.append(self.decode_bytes(run).decode("utf-8", errors="replace"))
        return "".join(out)


def learned_merges(tokenizer: BPETokenizer) -> list[tuple[bytes, bytes]]:
    """The merges of `tokenizer` as byte pairs, in rank order (comparable across tokenizers)."""
    return [(tokenizer.vocab[a], tokenizer.vocab[b]) for a, b in tokenizer.merges]
