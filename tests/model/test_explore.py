"""model/explore.py's weight_from_to: every head's weight from one position onto another, read out of a trace,
equal to attention_weights at that query and key (tiny random model)."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy import CourseError
from llm_anatomy.model.explore import weight_from_to
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.weights.random import random_llama

IDS = torch.tensor([[5, 9, 17, 5, 9, 23, 41]])


@pytest.fixture(scope="module")
def scratch():
    return ScratchLlama.from_hf(random_llama())


@pytest.fixture(scope="module")
def traced(scratch):
    return scratch.trace(IDS, keep_hidden=False, attention_layers=range(scratch.cfg.num_layers), logits_to_keep=1)


def test_every_layer_and_head_matches_attention_weights_at_that_query_and_key(scratch, traced):
    got = weight_from_to(traced, query=4, key=2)
    cfg = scratch.cfg
    assert got.shape == (cfg.num_layers, cfg.num_heads) and got.dtype == torch.float32
    for layer in range(cfg.num_layers):
        weights = scratch.attention_weights(IDS, layer)[0]  # [heads, seq, seq]
        torch.testing.assert_close(got[layer], weights[:, 4, 2].float(), rtol=0, atol=1e-6)
    assert ((got > 0) & (got < 1)).all()  # a fraction of 1, from a query that sees five keys
    assert not torch.equal(got, weight_from_to(traced, query=4, key=3))  # another key, other weights


@pytest.mark.parametrize("query, key, message", [(1, 2, "key <= query"), (7, 0, "query < 7"), (-1, -2, "0 <= key")])
def test_positions_out_of_order_or_range_are_refused(traced, query, key, message):
    with pytest.raises(CourseError, match=message):
        weight_from_to(traced, query, key)


def test_a_trace_without_every_layers_weights_is_refused(scratch):
    partial = scratch.trace(IDS, keep_hidden=False, attention_layers=[1], logits_to_keep=1)
    with pytest.raises(CourseError, match="attention_layers=range"):
        weight_from_to(partial, 3, 1)
    batch = scratch.trace(IDS.repeat(2, 1), keep_hidden=False, attention_layers=range(scratch.cfg.num_layers),
                          logits_to_keep=1)
    with pytest.raises(CourseError, match="one prompt"):
        weight_from_to(batch, 3, 1)


def test_repeated_random_tokens_repeat_or_not_and_refuse_a_too_short_test():
    from llm_anatomy.errors import CourseError
    from llm_anatomy.model.explore import repeated_random_tokens

    ids = repeated_random_tokens(5, seed=1, bos=7)
    assert ids.shape == (1, 11) and ids[0, 0] == 7 and torch.equal(ids[0, 1:6], ids[0, 6:])
    control = repeated_random_tokens(5, seed=1, bos=7, repeat=False)
    assert torch.equal(control[0, :6], ids[0, :6]) and not torch.equal(control[0, 6:], ids[0, 6:])
    assert torch.equal(repeated_random_tokens(5, seed=1, bos=7), ids)  # the same seed, the same tokens
    with pytest.raises(CourseError, match="at least 2"):
        repeated_random_tokens(1, seed=1)


def test_induction_scores_read_the_weight_on_the_token_after_the_earlier_occurrence():
    import types

    from llm_anatomy.errors import CourseError
    from llm_anatomy.model.explore import induction_scores

    length, seq = 4, 9  # a BOS, then two halves of 4
    perfect = torch.zeros(1, 2, seq, seq)
    for q in range(seq - length + 1, seq):
        perfect[0, 0, q, q - length + 1] = 1.0  # head 0: all weight on the token after the earlier occurrence
        perfect[0, 1, q, q - 1] = 1.0  # head 1: the previous token, never the copy's source
    scores = induction_scores(types.SimpleNamespace(attentions={0: perfect, 1: perfect.flip(1)}), length)
    assert scores.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(CourseError, match="attention_layers=range"):
        induction_scores(types.SimpleNamespace(attentions={1: perfect}), length)
    with pytest.raises(CourseError, match="no two halves"):
        induction_scores(types.SimpleNamespace(attentions={0: perfect}), 6)
