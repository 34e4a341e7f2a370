"""Our byte-level BPE: the helpers, training (against the tokenizers trainer), and the model's
tokenizer rebuilt from its merges (against the model's own tokenizer, id for id)."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_anatomy.tokens.bpe import (BPETokenizer, bytes_to_unicode, hf_trained_merges, learned_merges, load_corpus,
                             merge, pair_counts, token_text_to_bytes)
from llm_anatomy.errors import CourseError

# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def reference(reference_tokenizer):
    return reference_tokenizer


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def without_dropped_bytes(tokenizer, text: str) -> str:
    """What decode(encode(text)) gives: 21 bytes have no token of their own in SmolLM2's vocabulary (rare
    control characters, and lead bytes of unassigned planes) and the reference drops them; so do we."""
    data = bytes(b for b in text.encode("utf-8") if tokenizer.byte_ids[b] is not None)
    return data.decode("utf-8", errors="replace")


TRICKY = {
    "empty": "",
    "ascii prose": "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, they've gone.",
    "code with tabs and mixed indentation": "def f(x):\n\tif x:\n        return x  # eight spaces\n\t    pass\r\n",
    "runs of spaces and newlines": "a  b   c    d\n\n\ne \n \n  \n\t\t\n   ",
    "only spaces": "     ",
    "only newlines": "\n\n\n",
    "numbers": "0 1 12 123 1234 12345 3.14159 -42 1,000,000 1e-9 0xFF 2024-11-30 ١٢٣ ½ Ⅻ",
    "punctuation runs": "!!! ??? ... --- ==> <=> ;;; ((())) {{}} [[]] @@ ## $$ %% ^^ && ** __ ~~ ``",
    "contractions": "don't DON'T I'm you're she's we've they'd I'll 's 't",
    "emoji": "😀 👍🏽 👩🏿‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 ❤️ 1️⃣",
    "cjk": "中文字符测试。日本語のテキスト、カタカナ。한국어 텍스트입니다.",
    "arabic and hebrew": "مرحبا بالعالم، كيف حالك؟ שלום עולם, מה שלומך?",
    "accents nfc": unicodedata.normalize("NFC", "café naïve Zürich São Paulo Ångström"),
    "accents nfd": unicodedata.normalize("NFD", "café naïve Zürich São Paulo Ångström"),
    "special tokens": "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "special tokens glued to words": "abc<|im_end|>def<|endoftext|><|endoftext|>x<file_sep>",
    "almost special": "<|im_start> <im_end|> <|IM_END|> < |im_end| >",
    "unusual whitespace": "a\u00a0b\u2003c\u3000d\u0085e\u2028f\u1680g\u202fh \u200bi",
    "controls": "\x00\x01\x07\x1b[31mred\x1b[0m\x7f",
    "rare bytes": "a\x04b\x06c\x13d",
    "mixed scripts": "Привет, мир! Γειά σου Κόσμε! नमस्ते दुनिया ສະບາຍດີ",
    "url and path": "https://example.com/a/b?c=1&d=2#frag ~/src/main.py C:\\Users\\me",
}


# ----------------------------------------------------------------------------- the helpers


def test_pair_counts_counts_overlapping_pairs():
    assert pair_counts([1, 2, 3, 1, 2]) == {(1, 2): 2, (2, 3): 1, (3, 1): 1}
    assert pair_counts([7, 7, 7]) == {(7, 7): 2}
    assert pair_counts([5], {(1, 2): 3}) == {(1, 2): 3}
    assert pair_counts([1, 2], weight=10) == {(1, 2): 10}


def test_merge_replaces_left_to_right_without_overlap():
    assert merge([1, 2, 3, 1, 2], (1, 2), 99) == [99, 3, 99]
    assert merge([7, 7, 7], (7, 7), 8) == [8, 7]
    assert merge([7, 7, 7, 7], (7, 7), 8) == [8, 8]
    assert merge([1, 3], (1, 2), 99) == [1, 3]
    assert merge([], (1, 2), 99) == []


def test_bytes_to_unicode_is_gpt2s_table():
    table = bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord("a")] == "a" and table[ord("!")] == "!"
    assert table[32] == "Ġ" and table[10] == "Ċ" and table[0] == "Ā"
    assert token_text_to_bytes("Ġthe") == b" the"
    assert token_text_to_bytes("ĊĊ") == b"\n\n"


# ----------------------------------------------------------------------------- training


def test_train_learns_the_most_frequent_pairs_first():
    tok = BPETokenizer.train("aaab aaab aaab xy", 256 + 3)
    learned = [(tok.vocab[m.left], tok.vocab[m.right], m.count) for m in tok.history]
    # chunks: "aaab" once, " aaab" twice, " xy" once. 'aa' occurs 2x per chunk -> 6; then 'aa'+'a'...
    assert learned[0] == (b"a", b"a", 6)
    assert tok.vocab[256] == b"aa"
    assert [m.new_id for m in tok.history] == [256, 257, 258]
    assert tok.vocab_size == 259


def test_train_never_merges_across_chunks():
    tok = BPETokenizer.train("ab ab ab ab. cd, cd, cd", 300)
    for piece in tok.vocab.values():
        assert not (piece.strip() and b" " in piece.strip()), piece  # no word-space-word tokens
    assert b"ab" in tok.vocab.values() and b" ab" in tok.vocab.values()


def test_train_is_deterministic_and_round_trips(corpus):
    text = corpus[:50_000]
    a = BPETokenizer.train(text, 400)
    b = BPETokenizer.train(text, 400)
    assert a.merges == b.merges
    ids = a.encode(text)
    assert a.decode(ids) == text
    assert len(text.encode()) / len(ids) > 1.8  # 144 merges already nearly halve the length


def test_train_stops_when_nothing_is_left_to_merge():
    tok = BPETokenizer.train("abc", 1000)
    assert tok.vocab_size == 258 and tok.encode("abc") == [257]


def test_train_refuses_bad_sizes_and_text():
    with pytest.raises(CourseError, match="256"):
        BPETokenizer.train("abc", 100)
    with pytest.raises(CourseError, match="surrogate"):
        BPETokenizer.train("a\ud800b", 300)


def test_the_plain_loop_and_the_fast_trainer_learn_the_same_merges(corpus):
    from llm_anatomy.tokens.bpe import train_fast, train_plain

    for text, specials in [(corpus[:8_000], ()), (_with_specials(corpus[8_000:16_000]), SPECIALS)]:
        plain, history = train_plain(text, 256 + len(specials) + 60, specials)
        fast, _, fast_history = train_fast(text, 256 + len(specials) + 60, special_tokens=specials)
        assert list(plain.items()) == list(fast.items()) and len(plain) == 60
        assert [m.count for m in history] == [m.count for m in fast_history]


def test_train_matches_the_tokenizers_trainer(corpus):
    """Same text, same pre-split, same tie-break: the tokenizers (Rust) trainer learns the same 1,000 merges."""
    ours = learned_merges(BPETokenizer.train(corpus, 256 + 1000))
    theirs = hf_trained_merges(corpus, 256 + 1000)
    assert len(ours) == len(theirs) == 1000
    assert ours == theirs
    assert ours[0] == (b" ", b" ")  # the docs are indented code: double spaces come first


SPECIALS = ["<|endoftext|>", "<|pad|>"]


def _with_specials(text: str, every: int = 700) -> str:
    """`text` with a special token glued in every `every` characters (in the middle of words, too)."""
    pieces = [text[i:i + every] for i in range(0, len(text), every)]
    return "".join(p + SPECIALS[i % 2] * (1 + i % 3) for i, p in enumerate(pieces))


def test_train_with_special_tokens_never_merges_across_or_into_them(corpus):
    text = _with_specials(corpus[:20_000])
    tok = BPETokenizer.train(text, 330, special_tokens=SPECIALS)
    assert tok.vocab_size == 330 and len(tok.merges) == 330 - 256 - 2  # the special tokens count in the size
    assert tok.special_tokens == {"<|endoftext|>": 328, "<|pad|>": 329}
    for token_id, piece in tok.vocab.items():
        if token_id < 328:
            assert not any(part in piece for part in (b"<|", b"|>", b"endof", b"pad|")), piece
    ids = tok.encode(text)
    assert tok.decode(ids) == text and ids.count(328) == text.count("<|endoftext|>")
    assert tok.encode("x<|pad|>y") == tok.encode("x") + [329] + tok.encode("y")
    with pytest.raises(CourseError, match="at least 258"):
        BPETokenizer.train(text, 257, special_tokens=SPECIALS)
    with pytest.raises(CourseError, match="distinct"):
        BPETokenizer.train(text, 300, special_tokens=["<|a|>", "<|a|>"])


def test_train_with_special_tokens_matches_the_tokenizers_trainer(corpus):
    """The tokenizers trainer, given the text between the special tokens, learns the same merges and encodes alike."""
    from llm_anatomy.tokens.bpe import hf_trained_tokenizer

    text = _with_specials(corpus[:60_000])
    ours = BPETokenizer.train(text, 256 + 2 + 300, special_tokens=SPECIALS)
    rust = hf_trained_tokenizer(text, 256 + 2 + 300, special_tokens=SPECIALS)
    assert learned_merges(ours) == hf_trained_merges(text, 256 + 2 + 300, SPECIALS)
    assert ours.vocab_size == rust.get_vocab_size() == 558
    sample = _with_specials(corpus[100_000:110_000], every=333)
    theirs = [s.encode() if s in SPECIALS else token_text_to_bytes(s) for s in rust.encode(sample).tokens]
    assert [ours.token_bytes(i) for i in ours.encode(sample)] == theirs


# ----------------------------------------------------------------------------- streaming


STREAM_PIECES = ["def f():\n  ", "  return 1\n\n", "\n   ", "   x", " <|im_", "end|>", "y 12", "34", "   ", "\t",
                 " ½", "x<", "|im_start|>", "", "  ", "word", "s and", " more<|endoftext", "|>"]


@pytest.mark.integration
def test_encode_iterable_gives_the_ids_of_the_whole_text(ours, reference, corpus):
    whole = "".join(STREAM_PIECES)
    expected = reference.backend_tokenizer.encode(whole, add_special_tokens=False).ids
    assert ours.encode(whole) == expected
    assert list(ours.encode_iterable(STREAM_PIECES)) == expected  # whitespace runs and special tokens cut in two
    assert list(ours.encode_iterable(whole)) == expected  # one character at a time
    lines = corpus.splitlines(keepends=True)
    assert list(ours.encode_iterable(lines)) == reference.backend_tokenizer.encode(corpus, add_special_tokens=False).ids
    assert list(ours.encode_iterable([])) == []


@pytest.mark.integration
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(FRAGMENTS_FOR_STREAMS := st.sampled_from([" ", "  ", "\n", "\t", "a", " the", "7", "½", ".", "!?", "😀",
                                                         "<|im_end|>", "<|im", "_end|>", "\r\n", "e\u0301"]),
                max_size=30), st.randoms(use_true_random=False))
def test_encode_iterable_matches_the_reference_however_the_text_is_cut(ours, reference, fragments, rng):
    whole = "".join(fragments)
    cuts = sorted(rng.sample(range(len(whole) + 1), min(len(whole) + 1, rng.randint(0, 6))))
    pieces = [whole[a:b] for a, b in zip([0] + cuts, cuts + [len(whole)])]
    assert list(ours.encode_iterable(pieces)) == reference(whole, add_special_tokens=False).input_ids


@pytest.mark.integration
def test_encode_iterable_streams_in_bounded_memory(ours):
    import itertools

    consumed = []

    def endless():
        for n, line in enumerate(itertools.cycle(["hello world\n", "    indented  code\n", "12345 <|im_end|>\n"])):
            consumed.append(n)
            yield line

    first = list(itertools.islice(ours.encode_iterable(endless()), 20_000))  # would never return if it buffered all
    assert len(first) == 20_000 and len(consumed) < 10_000
    stream = ours.encode_iterable(endless())
    next(stream)
    assert len(consumed) - 10_000 <= 2  # the first id comes after the first line or two, not the whole input


def test_encode_iterable_refuses_a_pre_split_that_changes_the_text():
    from llm_anatomy.tokens.bpe_hf import splitter_from_hf

    tok = BPETokenizer({}, {i: bytes([i]) for i in range(256)}, splitter=splitter_from_hf(None, {"type": "NFC"}))
    with pytest.raises(CourseError, match="whole text at once"):
        list(tok.encode_iterable(["a", "b"]))


# ----------------------------------------------------------------------------- the model's tokenizer


@pytest.mark.integration
def test_the_model_tokenizer_isolates_every_digit_as_smollm2_does(reference):
    """The GGUF names llama.cpp's "smollm" pre-tokenizer: digits isolated, then GPT-2's split (as on the hub)."""
    import json

    import gguf

    from llm_anatomy.weights.cache import GGUF_NAME, SMOLLM_PRE_TOKENIZER, cache_dir

    field = gguf.GGUFReader(cache_dir() / "gguf" / GGUF_NAME).fields["tokenizer.ggml.pre"]
    assert field.contents() == "smollm"
    assert json.loads(reference.backend_tokenizer.to_str())["pre_tokenizer"] == SMOLLM_PRE_TOKENIZER
    pieces = [p for p, _ in reference.backend_tokenizer.pre_tokenizer.pre_tokenize_str(" 2024 x\u00b2 \u00bd")]
    assert pieces == ["\u0120", "2", "0", "2", "4", "\u0120x", "\u00c2\u00b2", "\u0120", "\u00c2\u00bd"]


@pytest.mark.integration
def test_from_hf_reads_the_whole_vocabulary(ours, reference):
    assert ours.vocab_size == len(reference) == 49152
    assert len(ours.merges) == 48900
    assert ours.special_tokens["<|im_end|>"] == reference.convert_tokens_to_ids("<|im_end|>") == 2
    assert ours.token_bytes(reference.convert_tokens_to_ids("Ġthe")) == b" the"
    missing = [b for b in range(256) if ours.byte_ids[b] is None]
    assert len(missing) == 21 and {0x04, 0xC0, 0xC1, 0xF1, 0xFF} <= set(missing)  # bytes never seen in training


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(TRICKY))
def test_same_ids_as_the_model_tokenizer(ours, reference, name):
    text = TRICKY[name]
    ids = ours.encode(text)
    assert ids == reference(text, add_special_tokens=False).input_ids
    assert ids == reference.encode(text)
    assert ours.decode(ids) == without_dropped_bytes(ours, text) == reference.decode(ids)


QWEN_STYLE_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
OTHER_PRE_SPLITS = {
    "digits then byte level (SmolLM2 on the hub)": (None, {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}),
    "byte level with a prefix space (GPT-2 style)": (None, {"type": "ByteLevel", "add_prefix_space": True,
                                                             "trim_offsets": True, "use_regex": True}),
    "NFC, a split regex, then bytes (Qwen2.5 style)": ({"type": "NFC"}, {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_STYLE_SPLIT}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}),
}


@pytest.mark.integration
@pytest.mark.parametrize("variant", sorted(OTHER_PRE_SPLITS))
def test_other_pre_splits_match_the_tokenizers_library(reference, variant):
    """SmolLM2's vocabulary and merges under other models' pre-split rules: still the same ids as tokenizers."""
    import json

    from tokenizers import Tokenizer

    normalizer, pre = OTHER_PRE_SPLITS[variant]
    spec = json.loads(reference.backend_tokenizer.to_str())
    spec["normalizer"], spec["pre_tokenizer"] = normalizer, pre
    rust = Tokenizer.from_str(json.dumps(spec))
    ours = BPETokenizer.from_hf(rust)
    for text in list(TRICKY.values()) + ["x1234y 12.5%", "Hello", "a\n\r\nb  \n c"]:
        assert ours.encode(text) == rust.encode(text, add_special_tokens=False).ids, (variant, text)


@pytest.mark.integration
def test_same_ids_on_a_long_real_text(ours, reference, corpus):
    ids = ours.encode(corpus)
    assert len(ids) > 100_000
    assert ids == reference.backend_tokenizer.encode(corpus, add_special_tokens=False).ids
    assert ours.decode(ids) == corpus


@pytest.mark.integration
def test_the_chat_template_string_encodes_like_the_template(ours, reference):
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}]
    text = reference.apply_chat_template(messages, tokenize=False)
    ids = reference.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    assert text.startswith("<|im_start|>system\n")
    assert ours.encode(text) == list(ids)


@pytest.mark.integration
def test_decode_matches_the_reference_even_for_half_characters(ours, reference):
    ids = ours.encode("a 😀 b<|im_end|>c")
    for cut in range(len(ids) + 1):
        assert ours.decode(ids[:cut]) == reference.decode(ids[:cut])
    assert ours.decode([ours.byte_ids[0xF0]]) == "\ufffd"


@pytest.mark.integration
def test_encode_ordinary_treats_special_text_as_text(ours, reference):
    text = "<|im_end|>"
    assert ours.encode(text) == [2]
    assert ours.encode_ordinary(text) == reference(text, add_special_tokens=False, split_special_tokens=True).input_ids
    assert len(ours.encode_ordinary(text)) > 1


@pytest.mark.integration
def test_chunks_show_the_pre_split(ours):
    assert ours.chunks("Hello world, it's") == ["Hello", " world", ",", " it", "'s"]
    assert ours.chunks("a  b") == ["a", " ", " b"]  # the last space stays with the word
    assert ours.chunks("x<|im_end|>y") == ["x", "<|im_end|>", "y"]


@pytest.mark.integration
def test_encode_with_trace_explains_encode(ours):
    for text in [" unbelievably", "Tokenization", "😀", "hello world<|im_end|>"]:
        ids, steps = ours.encode_with_trace(text)
        assert ids == ours.encode(text)
        for chunk in {s.chunk for s in steps}:
            ranks = [s.rank for s in steps if s.chunk == chunk]
            assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)  # lowest rank first, each once
            last = [s for s in steps if s.chunk == chunk][-1]
            assert b"".join(last.pieces) == chunk.encode("utf-8")
    ids, steps = ours.encode_with_trace(" the")
    assert len(ids) == 1 and steps[-1].merged == b" the" and steps[0].rank < 10


@pytest.mark.integration
def test_bad_input_gets_one_clear_sentence(ours):
    with pytest.raises(CourseError, match="surrogate"):
        ours.encode("ok \ud800 no")
    with pytest.raises(CourseError, match="string"):
        ours.encode(b"bytes")
    with pytest.raises(CourseError, match="not a token id"):
        ours.decode([10**9])
    with pytest.raises(CourseError, match="tokenizers-backed"):
        BPETokenizer.from_hf(object())


# ----------------------------------------------------------------------------- property-based

FRAGMENTS = st.sampled_from([" ", "  ", "\n", "\t", "'s", "'ll", "a", "the", " the", "0", "123", ".", "!?",
                             "😀", "👍🏽", "\u200d", "é", "e\u0301", "中", "ب", "<|im_end|>", "<|im", "\r\n", "\u00a0"])


@pytest.mark.integration
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=60))
def test_random_unicode_text_matches_the_reference(ours, reference, text):
    ids = ours.encode(text)
    assert ids == reference(text, add_special_tokens=False).input_ids
    assert ours.decode(ids) == without_dropped_bytes(ours, text) == reference.decode(ids)


@pytest.mark.integration
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(FRAGMENTS, max_size=25).map("".join))
def test_random_tricky_fragments_match_the_reference(ours, reference, text):
    ids = ours.encode(text)
    assert ids == reference(text, add_special_tokens=False).input_ids
    assert ours.decode(ids) == text


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_a_trained_tokenizer_round_trips_any_text(text):
    tok = _small_trained()
    assert tok.decode(tok.encode(text)) == text


_SMALL = []


def _small_trained():
    if not _SMALL:
        _SMALL.append(BPETokenizer.train(load_corpus()[:30_000], 300))
    return _SMALL[0]
