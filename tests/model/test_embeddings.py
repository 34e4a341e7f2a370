"""The embedding helpers of notebook 02: lookup = one-hot @ table (C2), neighbours, PCA, tied weights."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy import CourseError
from llm_anatomy.model.embeddings import (cosine_similarities, embedding_table, nearest_neighbours, one_hot_lookup,
                                    pca_2d, tied_embeddings, token_id)
from llm_anatomy.model.scratch import ScratchLlama

from llm_anatomy.weights.random import random_llama


def test_one_hot_times_the_table_is_the_lookup(tiny_model):
    table = embedding_table(tiny_model)
    ids = torch.tensor([[5, 0, 127, 5]])
    assert torch.equal(one_hot_lookup(ids, table), tiny_model.model.embed_tokens(ids))
    assert one_hot_lookup(ids, table).shape == (1, 4, 64)
    with pytest.raises(CourseError, match="from 0 to 127"):
        one_hot_lookup(torch.tensor([128]), table)


def test_embedding_table_of_each_kind_of_model(tiny_model):
    scratch = ScratchLlama.from_hf(tiny_model)
    assert embedding_table(scratch).data_ptr() == embedding_table(tiny_model).data_ptr()
    with pytest.raises(CourseError, match="no embedding table"):
        embedding_table(torch.nn.Linear(2, 2))


def test_nearest_neighbours_by_cosine():
    table = torch.tensor([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.0], [0.0, 1.0], [10.0, 0.5]])
    found = nearest_neighbours(table, 0, k=2)
    assert [n.token_id for n in found] == [4, 1]  # length does not matter, direction does
    assert found[0].similarity == pytest.approx(10 / (100.25 ** 0.5), abs=1e-6)
    assert nearest_neighbours(table, torch.tensor([-1.0, 0.0]), k=1)[0].token_id == 2
    assert [n.token_id for n in nearest_neighbours(table, 0, k=2, exclude=[4])] == [1, 3]
    assert torch.allclose(cosine_similarities(table, table[3]), torch.nn.functional.cosine_similarity(table, table[3:4]))
    with pytest.raises(CourseError, match="k must be"):
        nearest_neighbours(table, 0, k=0)
    with pytest.raises(CourseError, match="token id"):
        nearest_neighbours(table, 9)


def test_pca_finds_the_main_directions():
    g = torch.Generator().manual_seed(0)
    points = torch.randn(50, 1, generator=g) * torch.tensor([[3.0, 0.0, 0.0, 4.0]]) + 0.01 * torch.randn(50, 4, generator=g)
    coords, explained = pca_2d(points)
    assert coords.shape == (50, 2)
    assert explained[0] > 0.99 and explained.sum() <= 1.0 + 1e-6
    # the first coordinate is the position along (3, 0, 0, 4) / 5, up to sign
    along = (points - points.mean(0)) @ torch.tensor([0.6, 0.0, 0.0, 0.8])
    assert torch.allclose(coords[:, 0].abs(), along.abs(), atol=0.05)
    with pytest.raises(CourseError, match="at least 3"):
        pca_2d(torch.zeros(2, 4))


def test_tied_embeddings_share_storage():
    assert tied_embeddings(random_llama())
    assert not tied_embeddings(random_llama(tie_word_embeddings=False))


def test_the_real_table_and_its_neighbours(real):
    table = embedding_table(real)
    assert table.shape == (49152, 576) and tied_embeddings(real)
    tok = real.tokenizer
    cat = token_id(tok, " cat")
    neighbours = nearest_neighbours(table, cat, k=10, tokenizer=tok)
    words = [n.token.strip().lower() for n in neighbours]
    assert any(w in words for w in ["cats", "dog", "kitten", "cat"]), words  # an animal or the same word
    assert all(-1 <= n.similarity <= 1 for n in neighbours) and neighbours[0].similarity >= neighbours[-1].similarity
    with pytest.raises(CourseError, match="not one"):
        token_id(tok, " unbelievablenessly")
