"""The KV memory calculator: published figures, users that fit, refused inputs, and the widget's callbacks."""

from __future__ import annotations

import pytest
import torch
from transformers import FalconConfig, LlamaConfig

from llm_anatomy.errors import CourseError
from llm_anatomy.model.kv_cache import kv_cache_bytes
from llm_anatomy.measure.kv_memory import (FAMOUS_MODELS, GIB, GPU_MEMORY_GIB, kv_bytes_per_token, kv_report, model_shape,
                                       users_that_fit)
from llm_anatomy.widgets.kv_calculator import KVCalculator


@pytest.mark.parametrize("name, dtype, per_token", [
    ("Llama-2-7B", "fp16", 524_288), ("Llama-3-8B", "bf16", 131_072), ("Falcon-7B", "bf16", 8_192),
    ("SmolLM2-135M", "bf16", 23_040), ("Llama-2-70B", "fp16", 327_680), ("Llama-3-8B", "fp32", 262_144),
    ("Llama-3-8B", "fp8", 65_536),
])
def test_published_bytes_per_token(name, dtype, per_token):
    assert kv_bytes_per_token(name, dtype) == per_token


def test_the_plain_numbers_agree_with_the_models_transformers_configs():
    """The table's four numbers per model give what transformers' own configs of those models give."""
    falcon = FalconConfig(hidden_size=4544, num_attention_heads=71, num_hidden_layers=32, multi_query=True)
    llama3 = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32)
    assert model_shape("Falcon-7B").kv_bytes_per_token(2) == kv_cache_bytes(falcon, 1, 1, torch.bfloat16)
    assert model_shape("Llama-3-8B").kv_bytes_per_token(2) == kv_cache_bytes(llama3, 1, 1, torch.bfloat16)
    kinds = {m.attention for m in FAMOUS_MODELS.values()}
    assert kinds == {"MHA", "GQA", "MQA"}


def test_report_numbers():
    r = kv_report("Llama-3-8B", length=8192, users=10, dtype="bf16", gpu_memory_gib=80)
    assert r.per_user_bytes == 131_072 * 8192 == 2**30
    assert r.total_bytes == 10 * 2**30 and r.total_gib == 10
    assert r.weight_bytes == int(8.03e9 * 2)
    # an "80 GB" GPU holds 80 GiB = 85.9e9 bytes: 65 caches of 1 GiB fit beside 16.06e9 bytes of weights
    assert r.users_fit == int((80 * 2**30 - r.weight_bytes) // 2**30) == 65 and r.fits


@pytest.mark.parametrize("card", sorted(GPU_MEMORY_GIB))
def test_a_card_sold_as_n_gb_holds_n_gib(card):
    """Memory is counted in GiB: a card whose name says "80 GB" holds 80 GiB, and so many 1-GiB caches fit."""
    n = float(card.split("(")[1].split(" GB")[0])
    assert GPU_MEMORY_GIB[card] == n
    assert users_that_fit(GIB, GPU_MEMORY_GIB[card]) == int(n)  # 1 GiB per user, no weights
    assert kv_report("Llama-3-8B", length=8192, users=1, dtype="bf16", gpu_memory_gib=GPU_MEMORY_GIB[card]).total_gib == 1


def test_users_that_fit_after_the_weights():
    assert users_that_fit(10, 10 / GIB) == 1  # 10 bytes of memory, 10 bytes per user
    assert users_that_fit(GIB, 10, weight_bytes=int(4.5 * GIB)) == 5
    assert users_that_fit(GIB, 10, weight_bytes=int(11 * GIB)) == 0  # the weights alone do not fit


@pytest.mark.parametrize("kwargs, message", [
    (dict(model="GPT-5"), "Unknown model"),
    (dict(length=0), "at least 1"),
    (dict(length=-5), "at least 1"),
    (dict(length=10**12), "too large"),
    (dict(length=2.5), "whole number"),
    (dict(users=0), "at least 1"),
    (dict(users=10**9), "too large"),
    (dict(dtype="int3"), "Unknown number format"),
    (dict(gpu_memory_gib=0), "positive"),
    (dict(gpu_memory_gib=-8), "positive"),
    (dict(gpu_memory_gib=1e9), "more memory"),
])
def test_refused_inputs_say_what_to_do(kwargs, message):
    args = dict(model="Llama-3-8B", length=4096, users=1, dtype="bf16", gpu_memory_gib=80) | kwargs
    with pytest.raises(CourseError, match=message):
        kv_report(**args)


def test_widget_shows_the_report_and_has_css_classes():
    w = KVCalculator()
    assert "la-kvcalc" in w._dom_classes
    for part, box in [("model", w.model_box), ("length", w.length_box), ("users", w.users_box),
                      ("dtype", w.dtype_box), ("memory", w.memory_box), ("result", w.result), ("error", w.error)]:
        assert f"la-kvcalc-{part}" in box._dom_classes
    assert "131,072 B" in w.result_text and "65" in w.result_text and "GiB" in w.result_text and w.error.text == ""


def test_widget_callbacks_update_in_place():
    w = KVCalculator(model="Llama-3-8B", length=1024, users=1)
    w.set_model("Llama-2-7B")
    assert "524,288 B" in w.result_text and w.state["model"] == "Llama-2-7B"
    w.users_box.value = 100  # the browser path: the observer calls set_users
    assert w.state["users"] == 100 and "does not fit" not in w.result_text
    w.set_length(100_000)
    assert "does not fit" in w.result_text and w.report.users_fit == 1
    w.set_dtype("fp32")
    assert "1,048,576 B" in w.result_text
    w.set_gpu_memory(141)
    assert w.report.gpu_memory_gib == 141 and "141 GiB" in w.result_text


@pytest.mark.parametrize("method, value", [("set_length", 0), ("set_length", -3), ("set_length", 10**12),
                                           ("set_users", 0), ("set_users", -1), ("set_gpu_memory", 0),
                                           ("set_gpu_memory", -80), ("set_model", "nope"), ("set_dtype", "int3")])
def test_widget_refuses_bad_values_without_changing_state(method, value):
    w = KVCalculator()
    before_state, before_html = dict(w.state), w.result.value
    getattr(w, method)(value)  # never raises
    assert w.error.text != "" and w.state == before_state and w.result.value == before_html
    w.set_users(2)  # a good value clears the error
    assert w.error.text == "" and w.state["users"] == 2


def test_widget_refuses_bad_values_typed_in_the_browser():
    w = KVCalculator()
    before = dict(w.state)
    w.length_box.value = -100
    assert "at least 1" in w.error.text and w.state == before


def test_a_config_dict_gives_the_cache_of_every_layout():
    from llm_anatomy.measure.kv_memory import LAYOUT_CONFIGS, kv_cache_bytes_from_config, layout_name
    from llm_anatomy.model.kv_cache import kv_cache_bytes
    from llm_anatomy.weights.random import random_llama

    assert {layout_name(c) for c in LAYOUT_CONFIGS.values()} == {"MHA", "GQA", "MQA", "MLA", "sliding", "hybrid"}
    tiny = random_llama("tiny").config  # MHA/GQA: the same bytes as the library's formula on a real config
    assert kv_cache_bytes_from_config(tiny.to_dict(), 100, 4) == kv_cache_bytes(tiny, 100, dtype=torch.float32)
    assert kv_cache_bytes_from_config(LAYOUT_CONFIGS["DeepSeek-V3"], 1, 2) == 61 * (512 + 64) * 2  # no factor 2
    mistral = LAYOUT_CONFIGS["Mistral-7B-v0.1"]  # every layer keeps at most its 4,096-token window
    assert kv_cache_bytes_from_config(mistral, 10_000, 2) == kv_cache_bytes_from_config(mistral, 4096, 2)
    gemma = LAYOUT_CONFIGS["Gemma-2-9B"]  # half the layers local: beyond the window only the global half grows
    grow = kv_cache_bytes_from_config(gemma, 8192, 2) - kv_cache_bytes_from_config(gemma, 4096, 2)
    assert grow == 21 * 2 * 8 * 256 * 2 * 4096
