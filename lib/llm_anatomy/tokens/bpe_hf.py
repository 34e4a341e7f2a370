"""Reading a model's own tokenizer: its tokenizer.json, turned into our encoder's tables (notebook 01).

tokenizer.json says everything: model.vocab (token text -> id), model.merges (in rank order), the
pre_tokenizer chain (for SmolLM2: Digits with individual_digits, then ByteLevel with GPT-2's pattern),
the normalizer, and the added (special) tokens.
"""

from __future__ import annotations

import json

import regex

from ..errors import CourseError
from .pretokenize import GPT2_SPLIT_PATTERN, PreSplitter, _prefix_space, bytes_to_unicode, token_text_to_bytes


def splitter_from_hf(pre: dict | None, normalizer: dict | None) -> PreSplitter:
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




def tables_from_hf(tokenizer) -> dict:
    """The tables of `BPETokenizer(...)` for a transformers tokenizer backed by tokenizers (or a tokenizers.Tokenizer)."""
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
    splitter = splitter_from_hf(spec.get("pre_tokenizer"), spec.get("normalizer"))
    return dict(merges=merges, vocab=vocab, byte_ids=byte_ids, special_tokens=special, splitter=splitter,
                ignore_merges=bool(model.get("ignore_merges")))
