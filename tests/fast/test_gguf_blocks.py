"""Tests for gguf_blocks.py: the course's GGUF file read by hand, Q4_1 and Q8_0 blocks dequantized bit for
bit equal to the gguf package and to the safetensors that transformers made from the same file."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from llm_anatomy.fast import gguf_blocks as gb
from llm_anatomy.fast import quantize as q
from llm_anatomy.errors import CourseError

# GGUF tensor -> transformers tensor, as transformers' GGUF loader names them
# (transformers/integrations/ggml.py, GGUF_TO_TRANSFORMERS_MAPPING for llama).
HF_PARTS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
SAMPLES = ["blk.0.ffn_down.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.7.attn_v.weight",
           "blk.29.ffn_gate.weight", "blk.12.attn_output.weight", "token_embd.weight", "blk.3.attn_norm.weight"]


def hf_name(gguf_name: str) -> str:
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    if gguf_name in top:
        return top[gguf_name]
    _, layer, part, kind = gguf_name.split(".")
    return f"model.layers.{layer}.{HF_PARTS[part]}.{kind}"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


@pytest.fixture(scope="module")
def gguf_path():
    from llm_anatomy.weights.cache import ensure_gguf

    return ensure_gguf(progress=False)


@pytest.fixture(scope="module")
def reader(gguf_path):
    from gguf import GGUFReader

    return {t.name: t for t in GGUFReader(gguf_path).tensors}


@pytest.fixture(scope="module")
def cached():
    """The cached fp32 safetensors that transformers made from the same GGUF (opened lazily)."""
    from safetensors import safe_open

    from llm_anatomy.weights.cache import default_model_dir

    with safe_open(default_model_dir() / "model.safetensors", framework="pt") as handle:
        yield handle


def bits(t: torch.Tensor) -> np.ndarray:
    return t.numpy().view(np.uint32)  # compare bit patterns: tells -0.0 from 0.0, and NaN payloads


# --------------------------------------------------------------------------- 1. GGUF blocks by hand


def test_q4_1_block_layout_by_hand():
    codes = np.arange(32) % 16  # weight i has code i mod 16
    packed = (codes[:16] | (codes[16:] << 4)).astype(np.uint8)  # byte j: weight j low, weight j + 16 high
    raw = np.concatenate([np.array([0.5, -1.0], dtype=np.float16).view(np.uint8), packed])
    d, m, ours = gb.q4_1_blocks(raw)
    assert d.tolist() == [0.5] and m.tolist() == [-1.0] and ours[0].tolist() == codes.tolist()
    assert gb.dequantize_q4_1(raw, (1, 32))[0].tolist() == [0.5 * c - 1.0 for c in codes]


def test_q4_1_matches_gguf_quantizer_round_trip():
    import gguf

    w = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)  # [4, 40] bytes
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1)
    assert np.array_equal(bits(gb.dequantize_q4_1(raw.reshape(-1), (4, 64))), theirs.view(np.uint32))


def test_the_file_holds_q4_1_q8_0_and_f32(gguf_path):
    index = gb.gguf_index(gguf_path)
    assert Counter(entry[3] for entry in index.values()) == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert index["token_embd.weight"][2:] == ((49152, 576), "Q8_0")
    for _, n_bytes, shape, type_name in index.values():
        if type_name == "Q4_1":
            assert n_bytes / math.prod(shape) == 0.625 == q.bytes_per_weight("q4_1")  # 5 bits per weight


@pytest.mark.parametrize("name", SAMPLES)
def test_dequantize_equals_gguf_bit_for_bit(gguf_path, reader, name):
    import gguf

    raw, shape, type_name = gb.read_gguf_tensor(gguf_path, name)
    assert type_name == reader[name].tensor_type.name and raw.size == reader[name].n_bytes
    theirs = gguf.quants.dequantize(reader[name].data, reader[name].tensor_type).reshape(shape)
    ours = gb.dequantize_gguf(raw, shape, type_name)
    assert ours.dtype == torch.float32 and tuple(ours.shape) == shape
    assert np.array_equal(bits(ours), theirs.view(np.uint32))


@pytest.mark.parametrize("name", SAMPLES)
def test_dequantize_equals_cached_safetensors(gguf_path, cached, name):
    """transformers' GGUF loader dequantizes with gguf, renames, and undoes llama.cpp's q/k row
    permutation (LlamaTensorProcessor._reverse_permute_weights); everything else is unchanged."""
    ours = gb.dequantize_gguf(*gb.read_gguf_tensor(gguf_path, name))
    theirs = cached.get_tensor(hf_name(name))
    if ".attn_q." in name or ".attn_k." in name:
        assert not torch.equal(ours, theirs)  # in the file's row order they differ ...
        ours = gb.unpermute_qk(ours, 9 if ".attn_q." in name else 3)  # ... 9 query heads, 3 kv heads
    assert torch.equal(ours, theirs) and np.array_equal(bits(ours), bits(theirs))


def test_gguf_errors(gguf_path, tmp_path):
    raw, shape, _ = gb.read_gguf_tensor(gguf_path, "blk.0.ffn_down.weight")
    with pytest.raises(CourseError, match="Q4_K"):
        gb.dequantize_gguf(raw, shape, "Q4_K")
    with pytest.raises(CourseError, match="bytes"):
        gb.dequantize_q4_1(raw[:-20], shape)  # one block short
    with pytest.raises(CourseError, match="bytes"):
        gb.q4_1_blocks(raw[:-3])
    with pytest.raises(CourseError, match="uint8"):
        gb.dequantize_q4_1(raw.view(np.uint16), shape)
    with pytest.raises(CourseError, match="blocks"):
        gb.dequantize_q4_1(raw, (raw.size // 20 * 2, 16))  # rows of 16 weights: half a block
    with pytest.raises(CourseError, match="no tensor"):
        gb.read_gguf_tensor(gguf_path, "blk.0.nonsense.weight")
    with pytest.raises(CourseError, match="ensure_gguf"):
        gb.read_gguf_tensor(tmp_path / "missing.gguf", "token_embd.weight")


def test_summary_counts_every_tensor_once(gguf_path):
    summary = gb.gguf_summary(gguf_path)
    assert {t: row["tensors"] for t, row in summary.items()} == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert summary["Q4_1"]["bytes"] * 8 == summary["Q4_1"]["weights"] * 5  # 5 bits per weight
    assert summary["Q8_0"]["bytes"] == 49152 * 576 // 32 * 34
    assert sum(row["bytes"] for row in summary.values()) < 98_362_432  # the rest of the file: header, vocabulary

