"""Random-weight Llama shapes, for timing at realistic sizes."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.weights.random import RANDOM_SHAPES, random_llama


def test_random_llama_has_the_named_shape():
    model = random_llama("tiny", torch.device("cpu"), torch.float32)
    assert model.config.num_key_value_heads == 2 and next(model.parameters()).dtype == torch.float32
    with pytest.raises(CourseError, match="Unknown model size"):
        random_llama("7b", torch.device("cpu"), torch.float32)


def test_the_1b_shape_is_llama_3_2_1b():
    shape = RANDOM_SHAPES["1b"]
    assert (shape["num_hidden_layers"], shape["hidden_size"], shape["num_key_value_heads"]) == (16, 2048, 8)
