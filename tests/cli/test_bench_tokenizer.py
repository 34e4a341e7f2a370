"""`bench tokenizer`'s text and a small real run: our BPE gives the reference's ids and the figures are real."""

from __future__ import annotations

import pytest

from llm_anatomy.cli.bench import tokenizer
from llm_anatomy.texts import load_corpus

from bench_helpers import positive


def test_the_bench_text_is_three_different_sets_of_words_cut_to_size():
    corpus = load_corpus()
    text = tokenizer.bench_text(10**9)  # more than there is: all three parts
    assert text == "\n".join([corpus, corpus.upper(), corpus.swapcase()])
    cut = tokenizer.bench_text(1001)
    assert len(cut.encode()) <= 1001 and text.startswith(cut) and len(cut) > 900


@pytest.mark.integration
def test_a_small_run_agrees_with_the_reference_and_measures(monkeypatch):
    r = tokenizer.run(repeat=1, merges=20, n_bytes=20_000)
    assert r["ids_equal"] is True and r["tokens"] > 1000
    assert r["text_bytes"] <= 20_000 and r["merges"] == 20
    assert r["merges_equal_to_tokenizers"] == 20  # our trainer learns the Rust trainer's merges, in order
    for key in ("ours_encode_s", "rust_encode_s", "ours_train_s", "playground_update_ms"):
        assert positive(r[key]), key
    assert r["ratio_ours_to_rust"] == pytest.approx(r["ours_encode_s"] / r["rust_encode_s"])
