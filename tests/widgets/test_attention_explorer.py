"""The attention explorer: pure data for one layer and head, and the widget's callbacks."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy import CourseError
from llm_anatomy.model.explore import head_attention
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.views.attention import attention_view, draw_attention, token_labels
from llm_anatomy.weights.random import random_llama
from llm_anatomy.widgets.attention_explorer import AttentionExplorer


class CharTokenizer:
    """One token per character (ids 0..127): enough to drive the tiny model."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 128 for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


@pytest.fixture
def tiny():
    return ScratchLlama.from_hf(random_llama()), CharTokenizer()


def test_a_view_is_one_head_of_one_layer(tiny):
    model, tok = tiny
    view = attention_view(head_attention(model, tok, "hello world", layer=1, head=3), tok)
    assert view.tokens == list("hello·world") and view.weights.shape == (11, 11)
    assert view.kv_head == 1 and "layer 1, head 3" in view.title and view.note == ""
    ids = torch.tensor([tok.encode("hello world")])
    assert torch.equal(view.weights, model.trace(ids, attention_layers=(1,)).attentions[1][0, 3])
    assert torch.allclose(view.weights.sum(-1), torch.ones(11), atol=1e-5)


def test_the_weights_come_from_one_forward_pass(tiny, monkeypatch):
    model, tok = tiny
    calls = []
    for i, block in enumerate(model.layers):
        original = block.forward
        monkeypatch.setattr(block, "forward", lambda *a, _i=i, _f=original, **k: (calls.append(_i), _f(*a, **k))[1])
    head_attention(model, tok, "abc", layer=1, head=0)
    assert calls == [0, 1]  # each block once: the weights are the ones layer 1's attention computed, not a re-run


def test_long_prompts_are_capped_with_a_message(tiny):
    model, tok = tiny
    view = attention_view(head_attention(model, tok, "x" * 100, layer=0, head=0, max_tokens=64), tok)
    assert view.weights.shape == (64, 64) and "100 tokens" in view.note and "first 64" in view.note


@pytest.mark.parametrize("prompt, layer, head, message", [
    ("", 0, 0, "Type a prompt"), ("   ", 0, 0, "Type a prompt"), ("hi", 2, 0, "layer must be .*from 0 to 1"),
    ("hi", 0, 4, "head must be .*from 0 to 3"), ("hi", -1, 0, "layer"), ("hi", True, 0, "layer")])
def test_bad_requests_are_refused_clearly(tiny, prompt, layer, head, message):
    model, tok = tiny
    with pytest.raises(CourseError, match=message):
        head_attention(model, tok, prompt, layer, head)


def test_labels_show_spaces_and_new_lines():
    assert token_labels(CharTokenizer(), [ord(" "), ord("\n"), ord("a")]) == ["·", "↵", "a"]


def test_the_heatmap_is_labelled():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    draw_attention(torch.eye(3), ["a", "b", "c"], ax=ax, title="t")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert "key" in ax.get_xlabel() and "query" in ax.get_ylabel() and ax.get_title() == "t"
    plt.close(fig)


def test_the_widget_draws_and_follows_its_controls(tiny):
    model, tok = tiny
    w = AttentionExplorer(model, tok, prompt="hello")
    assert "la-attention" in w._dom_classes
    parts = {c for child in [w.prompt_box, w.show_button, w.layer_slider, w.head_slider, w.heatmap, w.caption,
                             w.note, w.error] for c in child._dom_classes}
    assert {"la-attention-prompt", "la-attention-show", "la-attention-layer", "la-attention-head",
            "la-attention-heatmap", "la-attention-caption", "la-attention-note", "la-attention-error"} <= parts
    assert w.heatmap.value[:4] == b"\x89PNG" and w.view.weights.shape == (5, 5) and w.error.text == ""
    assert (w.layer_slider.max, w.head_slider.max) == (1, 3)
    first = w.heatmap.value
    w.set_head(2)
    assert w.view.head == 2 and "head 2" in w.caption.value and w.heatmap.value != first
    w.layer_slider.value = 1  # as a browser would
    assert w.view.layer == 1 and "layer 1" in w.caption.value
    w.set_prompt("a longer prompt")
    assert w.view.weights.shape == (15, 15) and w.view.tokens[1] == "·"


def test_widget_errors_show_inside_and_change_nothing(tiny):
    model, tok = tiny
    w = AttentionExplorer(model, tok, prompt="hello")
    picture, view = w.heatmap.value, w.view
    w.set_prompt("")
    assert "Type a prompt" in w.error.text and w.heatmap.value == picture and w.view is view
    w.set_layer(7)
    assert "layer must be from 0 to 1" in w.error.text and w.layer_slider.value == 0
    w.set_prompt("ok")
    assert w.error.text == "" and w.view.weights.shape == (2, 2)


def test_widget_caps_long_prompts(tiny):
    model, tok = tiny
    w = AttentionExplorer(model, tok, prompt="y" * 80, max_tokens=64)
    assert "80 tokens" in w.note.value and w.view.weights.shape == (64, 64)


def test_the_widget_on_the_real_model(real):
    w = AttentionExplorer(real, real.tokenizer, prompt="The cat sat on the mat because it was tired.", layer=3, head=4)
    assert (w.layer_slider.max, w.head_slider.max) == (29, 8)
    assert w.view.kv_head == 1 and w.view.tokens[:3] == ["The", "·cat", "·sat"]
    scratch = ScratchLlama.from_hf(real.model)
    ids = torch.tensor([real.tokenizer.encode("The cat sat on the mat because it was tired.")])
    assert torch.allclose(w.view.weights, scratch.attention_weights(ids, 3)[0, 4], atol=1e-5)
    w.set_prompt("word " * 100)
    assert "showing the first 64" in w.note.value and w.view.weights.shape == (64, 64)
