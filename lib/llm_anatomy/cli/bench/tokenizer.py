"""`python -m llm_anatomy bench tokenizer`: our BPE against the reference (Rust) tokenizer.

Prints: encoding a ~1 MB text with our encoder (`BPETokenizer.from_hf`) and with the model's own
tokenizer (tokenizers, in Rust; and through transformers), the ratio, whether the ids agree;
training a 1,000-merge vocabulary on the data/ corpus with ours and with the tokenizers trainer;
and how long the tokenizer playground takes to update for a paragraph.

The ~1 MB text is the data/ corpus, then the same upper-cased, then swap-cased, cut to 1,000,000 bytes:
three different sets of words, so that no encoder can answer the second half from a cache of the first.
Each encoder starts with an empty cache; times are the best of --repeat runs, in seconds.
"""

from __future__ import annotations

import argparse
import json
import platform

from ...device import timed
from ...measure.timing import time_interleaved, time_it

TARGETS = {"encode_ratio_max": 20.0, "train_1000_merges_s_max": 30.0, "playground_update_ms_max": 100.0}


def bench_text(n_bytes: int = 1_000_000) -> str:
    """About `n_bytes` of text built from the corpus (see the module docstring)."""
    from ...texts import load_corpus

    corpus = load_corpus()
    text = "\n".join([corpus, corpus.upper(), corpus.swapcase()])
    data = text.encode("utf-8")[:n_bytes]
    return data.decode("utf-8", errors="ignore")


def run(repeat: int = 3, merges: int = 1000, n_bytes: int = 1_000_000) -> dict:
    """Measure everything; returns a dict of figures (seconds unless the name says otherwise). The test runs it small:
    n_bytes of text to encode, `merges` merges to train."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from ...texts import load_corpus
    from ...tokens.bpe import BPETokenizer, hf_trained_merges, learned_merges
    from ...weights.cache import fetch_default_model

    reference = AutoTokenizer.from_pretrained(fetch_default_model())
    spec = reference.backend_tokenizer.to_str()
    ours = BPETokenizer.from_hf(reference)
    text = bench_text(n_bytes)

    ids = {}
    fresh = [Tokenizer.from_str(spec) for _ in range(repeat)]  # a fresh Rust tokenizer has an empty cache too

    def encode_ours():
        ours._cache.clear()  # start cold, every run
        ids["ours"] = ours.encode(text)

    def encode_rust():
        ids["rust"] = fresh.pop().encode(text, add_special_tokens=False).ids

    def encode_transformers():
        ids["transformers"] = reference(text, add_special_tokens=False).input_ids

    timings = time_interleaved({"ours": encode_ours, "rust": encode_rust, "transformers": encode_transformers},
                               warmup=0, repeats=repeat)  # in turns; the fastest of each counts
    ours_s, rust_s, hf_s = (timings[name].min_s for name in ("ours", "rust", "transformers"))
    our_ids, rust_ids, hf_ids = ids["ours"], ids["rust"], ids["transformers"]

    corpus = load_corpus()
    train_s, trained = timed(lambda: BPETokenizer.train(corpus, 256 + merges))
    hf_train_s, hf_merges = timed(lambda: hf_trained_merges(corpus, 256 + merges))
    same = sum(1 for a, b in zip(learned_merges(trained), hf_merges) if a == b)

    from ...widgets.playground import TokenizerPlayground, sample_paragraph

    widget = TokenizerPlayground(ours, reference)
    paragraph = sample_paragraph()
    typed = iter(paragraph + " " * k for k in range(6))  # a slightly different paragraph each time, as when typing
    update = time_it(lambda: widget.set_text(next(typed)), warmup=1, repeats=5)
    return {
        "text_bytes": len(text.encode("utf-8")),
        "tokens": len(our_ids),
        "ids_equal": our_ids == rust_ids == hf_ids,
        "ours_encode_s": ours_s,
        "rust_encode_s": rust_s,
        "transformers_encode_s": hf_s,
        "ratio_ours_to_rust": ours_s / rust_s,
        "corpus_bytes": len(corpus.encode("utf-8")),
        "merges": merges,
        "ours_train_s": train_s,
        "tokenizers_train_s": hf_train_s,
        "merges_equal_to_tokenizers": same,
        "playground_paragraph_chars": len(paragraph),
        "playground_update_ms": 1000 * update.min_s,
        "playground_update_ms_max": 1000 * update.max_s,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_anatomy bench tokenizer")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeat", type=int, default=3, help="runs per encoder; the best counts (default 3)")
    args = parser.parse_args(argv)
    r = run(repeat=max(1, args.repeat))
    if args.json:
        print(json.dumps({"results": r, "targets": TARGETS}, indent=2))
        return 0
    mb = r["text_bytes"] / 1e6
    print(f"Encoding {r['text_bytes']:,} bytes ({r['tokens']:,} tokens), best of {args.repeat}, empty caches:")
    print(f"  {'ours (Python, llm_anatomy.tokens.bpe)':<34}{r['ours_encode_s']:>8.3f} s  {mb / r['ours_encode_s']:>6.2f} MB/s")
    print(f"  {'reference (tokenizers, Rust)':<34}{r['rust_encode_s']:>8.3f} s  {mb / r['rust_encode_s']:>6.2f} MB/s")
    print(f"  {'reference through transformers':<34}{r['transformers_encode_s']:>8.3f} s")
    print(f"  time ours / Rust: {r['ratio_ours_to_rust']:.2f} (target: at most {TARGETS['encode_ratio_max']:.0f}); "
          f"same ids: {r['ids_equal']}")
    print(f"Training {r['merges']:,} merges on the corpus ({r['corpus_bytes']:,} bytes):")
    print(f"  {'ours (Python)':<34}{r['ours_train_s']:>8.2f} s  (target < {TARGETS['train_1000_merges_s_max']:.0f} s)")
    print(f"  {'tokenizers BpeTrainer (Rust)':<34}{r['tokenizers_train_s']:>8.2f} s")
    print(f"  merges identical to the tokenizers trainer's, in order: {r['merges_equal_to_tokenizers']:,} "
          f"of {r['merges']:,}")
    print(f"Playground update for a {r['playground_paragraph_chars']}-character paragraph: "
          f"{r['playground_update_ms']:.1f} ms (worst of 5: {r['playground_update_ms_max']:.1f} ms; "
          f"target < {TARGETS['playground_update_ms_max']:.0f} ms)")
    print(f"machine: {r['machine']}")
    return 0
