"""Byte-level byte-pair encoding (BPE), from scratch: train one, or rebuild the model's own.

Text is turned into tokens in four steps:

1. special tokens such as ``<|im_start|>`` are cut out of the text first, whole;
2. the rest is *pre-split* into chunks with a regular expression (words with their leading space,
   numbers, runs of punctuation, runs of whitespace); merges never cross a chunk boundary;
3. each chunk becomes its UTF-8 bytes, one starting token per byte (so any text can be encoded);
4. merges are applied, lowest rank (learned earliest) first, until none applies.

``BPETokenizer.train`` learns the merges from a corpus (count adjacent pairs, merge the most
frequent, repeat). ``BPETokenizer.from_hf`` reads the merges and vocabulary of a transformers
tokenizer, and then ``encode`` gives exactly the ids that tokenizer gives.

Internally a tokenizer is three tables:
    byte_ids[b]           the id of the one-byte token for byte b (0..255)
    merges[(a, b)] = c    merging tokens a and b gives token c; ``ranks[(a, b)]`` is its order
    vocab[id] = bytes     what each token stands for
"""

from __future__ import annotations

import heapq
import json
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache

import regex

from .errors import CourseError

# GPT-2's pre-split pattern (also the one tokenizers' ByteLevel pre-tokenizer uses): English
# contractions, letters with an optional leading space, numbers with an optional leading space,
# other symbols with an optional leading space, whitespace not followed by a non-space, whitespace.
GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

_CACHE_LIMIT = 200_000  # chunk -> ids entries kept by encode() before the cache is emptied


# --------------------------------------------------------------------------- the shared helpers


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


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte (0..255) to a printable character, used to store tokens as text.

    Printable bytes map to themselves; the rest (space, control bytes...) map to characters from
    U+0100 upwards, in byte order. That is why a leading space shows as 'Ġ' (byte 32 -> U+0120)
    and a newline as 'Ċ' (byte 10 -> U+010A) in byte-level vocabularies.
    """
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of `bytes_to_unicode`: printable character -> byte."""
    return {c: b for b, c in bytes_to_unicode().items()}


def token_text_to_bytes(token: str) -> bytes:
    """The bytes a byte-level vocabulary entry (such as 'Ġthe') stands for (b' the')."""
    inverse = unicode_to_bytes()
    if all(c in inverse for c in token):
        return bytes(inverse[c] for c in token)
    return token.encode("utf-8")  # an added token stored as plain text


def utf8_bytes(text: str) -> bytes:
    """The UTF-8 bytes of `text`; a CourseError for text that has no UTF-8 form (lone surrogates)."""
    if not isinstance(text, str):
        raise CourseError(f"Give the tokenizer a string, not {type(text).__name__}.")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = text[err.start:err.end]
        raise CourseError(f"The text holds {bad!r} at position {err.start}, a lone surrogate that is not a "
                          "character and has no UTF-8 bytes: remove it or pair it.") from None


def _tie_break_order() -> dict[int, int]:
    """Byte -> its place among the 256 bytes when sorted by their GPT-2 characters (printable bytes first)."""
    chars = bytes_to_unicode()
    return {b: place for place, b in enumerate(sorted(range(256), key=lambda b: chars[b]))}


# --------------------------------------------------------------------------- pre-splitting


def _isolate(pieces: list[str], pattern: regex.Pattern) -> list[str]:
    """Split each piece so that every match of `pattern` is a piece of its own (Isolated)."""
    out = []
    for piece in pieces:
        start = 0
        for m in pattern.finditer(piece):
            if m.start() > start:
                out.append(piece[start:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            start = m.end()
        if start < len(piece):
            out.append(piece[start:])
    return out


def _prefix_space(pieces: list[str]) -> list[str]:
    """Put a space before each piece that does not start with one (ByteLevel's add_prefix_space)."""
    return [p if p.startswith(" ") else " " + p for p in pieces]


@dataclass(frozen=True)
class PreSplitter:
    """Cuts text into chunks: a series of steps, each splitting every piece further.

    steps: compiled patterns (every match becomes a chunk of its own, and so does each gap between matches),
        or the function `_prefix_space`.
    normalize: a unicodedata form ("NFC"...) applied first, or None.
    """

    steps: tuple = (regex.compile(GPT2_SPLIT_PATTERN),)
    normalize: str | None = None

    def __call__(self, text: str) -> list[str]:
        if self.normalize:
            text = unicodedata.normalize(self.normalize, text)
        pieces = [text] if text else []
        for step in self.steps:
            pieces = _isolate(pieces, step) if isinstance(step, regex.Pattern) else step(pieces)
        return pieces


def _splitter_from_hf(pre: dict | None, normalizer: dict | None) -> PreSplitter:
    """Our PreSplitter for a tokenizers `pre_tokenizer` and `normalizer` config (dicts from tokenizer.json)."""
    steps = []

    def add(cfg):
        kind = cfg["type"]
        if kind == "Sequence":
            for sub in cfg["pretokenizers"]:
                add(sub)
        elif kind == "ByteLevel":
            if cfg.get("add_prefix_space"):
                steps.append(_prefix_space)
            if cfg.get("use_regex", True):
                steps.append(regex.compile(GPT2_SPLIT_PATTERN))
        elif kind == "Digits":  # Rust's char::is_numeric is the Unicode N* categories, i.e. \p{N}
            steps.append(regex.compile(r"\p{N}" if cfg.get("individual_digits") else r"\p{N}+"))
        elif kind == "Split" and cfg.get("behavior") == "Isolated" and not cfg.get("invert"):
            pat = cfg["pattern"]
            steps.append(regex.compile(pat["Regex"] if "Regex" in pat else regex.escape(pat["String"])))
        else:
            raise CourseError(f"This course's BPE does not know the pre-tokenizer {json.dumps(cfg)[:80]}: "
                              "use a byte-level BPE model such as SmolLM2, GPT-2 or Qwen2.5.")

    if pre is not None:
        add(pre)
    form = None
    if normalizer is not None:
        form = normalizer.get("type")
        if form not in ("NFC", "NFD", "NFKC", "NFKD"):
            raise CourseError(f"This course's BPE does not know the normalizer {form!r}: use a byte-level BPE "
                              "model such as SmolLM2, GPT-2 or Qwen2.5.")
    return PreSplitter(tuple(steps), form)


# --------------------------------------------------------------------------- the tokenizer


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


@dataclass(frozen=True)
class LearnedMerge:
    """A merge found by training: `left` and `right` (ids) became `new_id`; the pair occurred `count` times."""

    left: int
    right: int
    new_id: int
    count: int


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
        self._special_pattern = None
        if self.special_tokens:  # longest first, so that at one position the longest token wins
            alternatives = sorted(self.special_tokens, key=len, reverse=True)
            self._special_pattern = regex.compile("|".join(regex.escape(s) for s in alternatives))
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
    def train(cls, text: str, vocab_size: int, verbose: bool = False) -> BPETokenizer:
        """Learn `vocab_size - 256` merges from `text` with GPT-2's pre-split; returns the tokenizer.

        Each step merges the most frequent adjacent pair of tokens, counted inside the pre-split chunks
        (never across them). Ties go to the pair whose left token is older, then whose right token is
        older; the 256 byte tokens count as older than every merged one, among themselves in the order of
        GPT-2's byte-to-character table (printable bytes first, see `bytes_to_unicode`). That is the rule
        the tokenizers library's trainer uses, so both learn the same merges from the same text. The rule
        is deterministic: the same text always gives the same merges. Training stops early if no pair is
        left. `tokenizer.history` lists every merge with its count.

        Speed: pairs are counted once over the *distinct* chunks, each weighted by how often it occurs,
        and after a merge only the chunks that contain the merged pair are recounted.
        """
        if not isinstance(vocab_size, int) or vocab_size < 256:
            raise CourseError(f"vocab_size must be an int of at least 256 (one token per byte), not {vocab_size!r}.")
        utf8_bytes(text)  # refuse text that has no UTF-8 form
        splitter = PreSplitter()
        chunk_freq = Counter(splitter(text))
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
        order = _tie_break_order()

        def key(pair):
            return order.get(pair[0], pair[0]), order.get(pair[1], pair[1])

        heap = [(-c, key(pair), pair) for pair, c in counts.items()]
        heapq.heapify(heap)

        vocab = {i: bytes([i]) for i in range(256)}
        merges: dict[tuple[int, int], int] = {}
        history = []
        for new_id in range(256, vocab_size):
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
        tokenizer = cls(merges, vocab)
        tokenizer.history = history
        return tokenizer

    # ------------------------------------------------------------------ the model's own tokenizer

    @classmethod
    def from_hf(cls, tokenizer) -> BPETokenizer:
        """Our encoder with the vocabulary, merges, pre-split and special tokens of a transformers tokenizer.

        `tokenizer` is a transformers tokenizer backed by tokenizers (or a tokenizers.Tokenizer). Its
        tokenizer.json says everything: model.vocab (token text -> id), model.merges (in rank order),
        the pre_tokenizer (for SmolLM2: ByteLevel with GPT-2's pattern), and added_tokens.
        """
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not hasattr(backend, "to_str"):
            raise CourseError("from_hf needs a fast (tokenizers-backed) transformers tokenizer, such as "
                              "load_model().tokenizer.")
        spec = json.loads(backend.to_str())
        model = spec["model"]
        if model.get("type") != "BPE" or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") \
                or model.get("byte_fallback"):
            raise CourseError("from_hf rebuilds plain byte-level BPE tokenizers (SmolLM2, GPT-2, Qwen2.5), "
                              f"not this {model.get('type')} model.")
        text_to_id = model["vocab"]
        vocab = {i: token_text_to_bytes(t) for t, i in text_to_id.items()}
        byte_to_char = bytes_to_unicode()
        # A byte with no token of its own (SmolLM2 lacks 21: bytes that UTF-8 never uses, lead bytes of
        # unassigned Unicode planes, rare control characters) is dropped by the reference when the model
        # has no unknown token: so we drop it too.
        byte_ids = [text_to_id.get(byte_to_char[b]) for b in range(256)]
        if sum(i is None for i in byte_ids) > 128:
            raise CourseError("This tokenizer's vocabulary lacks most single bytes: it is not byte-level BPE.")
        if model.get("unk_token") is not None and model["unk_token"] in text_to_id:
            raise CourseError("from_hf rebuilds byte-level BPE without an unknown token; this one has one.")
        merges = {}
        for entry in model["merges"]:
            left, right = entry.split(" ", 1) if isinstance(entry, str) else entry
            merges[(text_to_id[left], text_to_id[right])] = text_to_id[left + right]
        special = {}
        for added in spec.get("added_tokens", []):
            special[added["content"]] = added["id"]
            vocab.setdefault(added["id"], added["content"].encode("utf-8"))
        splitter = _splitter_from_hf(spec.get("pre_tokenizer"), spec.get("normalizer"))
        return cls(merges, vocab, byte_ids, special, splitter, ignore_merges=bool(model.get("ignore_merges")))

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
        if not self._special_pattern:
            return [(text, False)] if text else []
        parts, start = [], 0
        for m in self._special_pattern.finditer(text):
            if m.start() > start:
                parts.append((text[start:m.start()], False))
            parts.append((m.group(), True))
            start = m.end()
        if start < len(text):
            parts.append((text[start:], False))
        return parts

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


def load_corpus(name: str = "python_docs_topics.txt") -> str:
    """The training corpus from data/ (by default Python's own documentation topics, about 467 KB)."""
    from .paths import data_path

    return data_path(name).read_text(encoding="utf-8")


def hf_trained_merges(text: str, vocab_size: int) -> list[tuple[bytes, bytes]]:
    """The merges (as byte pairs, in order) that the tokenizers library's BPE trainer learns from `text`.

    The reference for our `train`: same GPT-2 pre-split (ByteLevel), all 256 bytes as the start alphabet,
    no special tokens, so its vocabulary has the same size as ours.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=0, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    hf.train_from_iterator([text], trainer=trainer)
    merges = json.loads(hf.to_str())["model"]["merges"]
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
    return [(token_text_to_bytes(a), token_text_to_bytes(b)) for a, b in pairs]


def learned_merges(tokenizer: BPETokenizer) -> list[tuple[bytes, bytes]]:
    """The merges of `tokenizer` as byte pairs, in rank order (comparable across tokenizers)."""
    return [(tokenizer.vocab[a], tokenizer.vocab[b]) for a, b in tokenizer.merges]
