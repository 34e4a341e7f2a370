"""The model's pictures: the parameter breakdown counts each tensor once; the course map is drawn around the residual
stream, names the shapes inside the block, highlights each notebook's parts, and no label prints over another."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from label_boxes import assert_apart, labels_inside, rendered_labels  # noqa: E402

from llm_anatomy import CourseError  # noqa: E402
from llm_anatomy.model.scratch import ScratchLlama  # noqa: E402
from llm_anatomy.views.anatomy import HERE, draw_model_map, parameter_groups  # noqa: E402
from llm_anatomy.weights.random import random_llama  # noqa: E402


def test_parameter_groups_count_each_tensor_once():
    hf = random_llama()
    groups = parameter_groups(hf)
    assert sum(groups.values()) == sum(p.numel() for p in hf.parameters())
    assert groups == parameter_groups(ScratchLlama.from_hf(hf))
    cfg = hf.config
    embedding = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    assert groups["embedding (= LM head, tied)"] == embedding
    assert groups["MLP"] == cfg.num_hidden_layers * 3 * cfg.hidden_size * cfg.intermediate_size


def test_parameter_groups_refuse_an_unknown_parameter():
    import torch

    with pytest.raises(CourseError, match="no role"):
        parameter_groups(torch.nn.Linear(2, 2))


@pytest.fixture(scope="module")
def cfg():
    from llm_anatomy.weights.random import random_config

    return random_config("135m")  # the real model's shapes, without its weights


def test_the_map_is_drawn_around_the_residual_stream(cfg):
    drawn = draw_model_map(cfg)
    edges = set(drawn.edges)
    for norm, sublayer, add in [("input_norm", "attention", "add_attention"), ("post_norm", "mlp", "add_mlp")]:
        assert ("stream", norm) in edges and (norm, sublayer) in edges  # each norm reads the stream
        assert (sublayer, add) in edges and (add, "stream") in edges  # its sublayer adds into the stream
    assert ("embed", "stream") in edges and ("stream", "final_norm") in edges  # the final norm reads the stream
    assert ("attention", "post_norm") not in edges and ("mlp", "final_norm") not in edges  # no box-to-box chain
    assert ("rope", "attention") in edges and ("final_norm", "lm_head") in edges
    plt.close(drawn.ax.figure)


def test_the_map_names_the_shapes_inside_the_block(cfg):
    drawn = draw_model_map(cfg)
    texts = " ".join(t.get_text() for t in drawn.ax.texts)
    for shape in ("[1, 9, seq, 64]", "[1, 3, seq, 64]", "[1, 9, seq, seq]", "[1, seq, 1,536]", "[1, seq, 576]",
                  "[1, seq, 49,152]", "[1, seq]"):
        assert shape in texts, shape
    assert "30 of them" in texts and "03 · attention" in texts  # the course map names each part's notebook
    plt.close(drawn.ax.figure)


@pytest.mark.parametrize("here", [None, *HERE])
def test_no_label_prints_over_another_or_out_of_its_box(cfg, here):
    drawn = draw_model_map(cfg, here=here)
    renderer, labels = rendered_labels(drawn.ax)
    assert_apart(labels)
    for name, patch in drawn.boxes.items():
        assert labels_inside(patch, labels, renderer, name), f"the {name} box has no label"
    plt.close(drawn.ax.figure)


def test_you_are_here_highlights_the_notebooks_parts_only(cfg):
    drawn = draw_model_map(cfg, here="03")
    lit = {name for name, patch in drawn.boxes.items() if patch.get_linewidth() > 2}
    assert lit == {"attention", "rope"} == drawn.here
    assert any(t.get_text() == "you are here" for t in drawn.ax.texts)
    plain = draw_model_map(cfg)
    assert not any(p.get_linewidth() > 2 for p in plain.boxes.values())
    assert not any(t.get_text() == "you are here" for t in plain.ax.texts)
    with pytest.raises(CourseError, match="here must be one of"):
        draw_model_map(cfg, here="07")
    plt.close("all")
