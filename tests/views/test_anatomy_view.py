"""The model's pictures: the parameter breakdown counts each tensor once; the block diagram names every shape."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from llm_anatomy import CourseError  # noqa: E402
from llm_anatomy.model.scratch import ScratchLlama  # noqa: E402
from llm_anatomy.views.anatomy import draw_block_diagram, parameter_groups  # noqa: E402
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


def test_the_block_diagram_shows_the_shapes():
    cfg = ScratchLlama.from_hf(random_llama()).cfg
    ax = draw_block_diagram(cfg)
    texts = " ".join(t.get_text() for t in ax.texts)
    assert f"[1, seq, {cfg.hidden_size}]" in texts and f"repeated {cfg.num_layers} times" in texts
    assert f"{cfg.num_heads} heads" in texts and f"{cfg.num_kv_heads} heads of {cfg.head_dim}" in texts
    plt.close(ax.figure)
