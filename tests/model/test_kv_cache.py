"""The KV cache: its bytes against real tensors (ours and transformers') and published figures, and its errors."""

from __future__ import annotations

import pytest
import torch
from transformers import FalconConfig, GPT2Config, LlamaConfig

from llm_anatomy.errors import CourseError
from llm_anatomy.model.kv_cache import KVCache, kv_bytes, kv_cache_bytes, kv_layout
from llm_anatomy.model.scratch import ScratchLlama


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _hf_cache(model, ids):
    out = model(ids, use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    return [layer.keys for layer in cache.layers] + [layer.values for layer in cache.layers]


@pytest.mark.parametrize("batch, seq", [(1, 1), (1, 7), (3, 5)])
def test_formula_matches_our_cache_and_transformers_dynamic_cache(tiny_model, batch, seq):
    ids = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(seq))
    ours = ScratchLlama.from_hf(tiny_model)
    cache = ours.new_cache(batch, 32)
    ours(ids, cache)
    expected = kv_cache_bytes(tiny_model.config, seq, batch, dtype=torch.float32)
    assert cache.used_bytes() == expected
    assert cache.allocated_bytes() == kv_cache_bytes(tiny_model.config, 32, batch, dtype=torch.float32)
    with torch.no_grad():
        theirs = _hf_cache(tiny_model, ids)
    assert _tensor_bytes(theirs) == expected
    assert theirs[0].shape == (batch, 2, seq, 16)  # [batch, kv_heads, seq, head_dim]


def test_formula_matches_the_real_models_cache(real):
    assert kv_cache_bytes(real.config, 1) == 23_040  # bf16, per token, as published
    ids = real.tokenizer("The cache grows by one position per token.", return_tensors="pt").input_ids
    with torch.no_grad():
        theirs = _hf_cache(real.model, ids)
    assert _tensor_bytes(theirs) == kv_cache_bytes(real.config, ids.shape[1], dtype=torch.float32)


@pytest.mark.parametrize("config, dtype, per_token", [
    (LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, num_hidden_layers=32),
     torch.float16, 524_288),  # Llama-2-7B, MHA
    (LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32),
     torch.bfloat16, 131_072),  # Llama-3-8B, GQA
    (FalconConfig(hidden_size=4544, num_attention_heads=71, num_hidden_layers=32, multi_query=True,
                  new_decoder_architecture=False), torch.bfloat16, 8_192),  # Falcon-7B, MQA
    (FalconConfig(hidden_size=8192, num_attention_heads=128, num_kv_heads=8, num_hidden_layers=60,
                  new_decoder_architecture=True), torch.bfloat16, 2 * 60 * 8 * 64 * 2),  # Falcon-40B, GQA
    (LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=30,
                 head_dim=64), torch.bfloat16, 23_040),  # SmolLM2-135M
    (GPT2Config(), torch.float32, 2 * 12 * 12 * 64 * 4),  # GPT-2: n_layer, n_head, n_embd names
])
def test_published_figures(config, dtype, per_token):
    assert kv_cache_bytes(config, 1, dtype=dtype) == per_token
    assert kv_cache_bytes(config, 4096, batch_size=8, dtype=dtype) == per_token * 4096 * 8


def test_falcon_multi_query_ignores_its_num_kv_heads():
    config = FalconConfig(hidden_size=4544, num_attention_heads=71, num_hidden_layers=32, multi_query=True,
                          new_decoder_architecture=False)
    assert config.num_kv_heads == 71  # transformers fills it in, but the model uses one KV head
    assert kv_layout(config) == (32, 1, 64)
    mha = FalconConfig(hidden_size=4544, num_attention_heads=71, num_hidden_layers=32, multi_query=False,
                       new_decoder_architecture=False)
    assert kv_layout(mha) == (32, 71, 64)


def test_bad_sizes_and_configs_are_refused():
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2)
    with pytest.raises(CourseError, match="zero or more"):
        kv_cache_bytes(config, -1)
    with pytest.raises(CourseError, match="decoder"):
        kv_cache_bytes(object(), 1)


def test_update_writes_at_length_and_advance_moves_it():
    cache = KVCache.allocate(num_layers=2, batch_size=1, kv_heads=2, max_len=5, head_dim=4)
    k = torch.ones(1, 2, 3, 4)
    keys, values = cache.update(0, k, 2 * k)
    assert keys.shape == (1, 2, 3, 4) and torch.equal(values, 2 * k)
    assert cache.length == 0  # only advance moves it, once per forward pass, after every layer
    cache.update(1, k, k)
    cache.advance(3)
    keys, _ = cache.update(0, 3 * torch.ones(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    assert keys.shape[2] == 4 and torch.equal(keys[:, :, 3], 3 * torch.ones(1, 2, 4))
    assert torch.equal(keys[:, :, :3], k)  # the past is kept, not recomputed
    cache.advance(1)
    assert cache.used_bytes() == 2 * 2 * 2 * 4 * 4 * 4  # K and V x layers x kv_heads x head_dim x 4 positions x fp32
    cache.reset()
    assert cache.length == 0 and cache.used_bytes() == 0


def test_overflow_and_bad_allocation_are_clear_errors():
    cache = KVCache.allocate(num_layers=1, batch_size=1, kv_heads=1, max_len=2, head_dim=2)
    with pytest.raises(CourseError, match="full"):
        cache.update(0, torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    with pytest.raises(CourseError, match="batch_size"):
        KVCache.allocate(num_layers=1, batch_size=0, kv_heads=1, max_len=2, head_dim=2)


def test_the_formula_in_plain_numbers_matches_the_config_reader():
    assert kv_bytes(30, 3, 64, 2) == 23_040  # SmolLM2-135M, bf16
    assert kv_bytes(32, 32, 128, 2) == 524_288  # Llama-2-7B
    assert kv_bytes(32, 8, 128, 2, seq_len=10, batch_size=3) == 131_072 * 30
    llama3 = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32)
    assert kv_cache_bytes(llama3, 1, 1, torch.bfloat16) == kv_bytes(*kv_layout(llama3), 2)
    with pytest.raises(CourseError, match="kv_heads"):
        kv_bytes(30, -1, 64, 2)


def test_every_cache_of_the_course_has_the_one_interface(tiny_model):
    """KVCache, the paged caches (notebook 08) and the CUDA-graph slot writer all are KVCacheInterfaces, and the
    model runs on each of them the same way (a view given its positions by whoever built it)."""
    from llm_anatomy.generate.decode import SlotWriter
    from llm_anatomy.model.kv_cache import KVCacheInterface
    from llm_anatomy.serve.paged_kv import PagedKVPool, RaggedPagedView

    model = ScratchLlama.from_hf(tiny_model)
    pool = PagedKVPool.for_model(model, num_blocks=8, block_size=4)
    contiguous = model.new_cache(1, 8)
    caches = [contiguous, pool.new_cache(1), RaggedPagedView(pool, [[0, 1]], [0], [3]),
              SlotWriter(model.new_cache(1, 8), torch.zeros(1, dtype=torch.long))]
    assert all(isinstance(c, KVCacheInterface) for c in caches)
    assert not isinstance(object(), KVCacheInterface)
    ids = torch.tensor([[5, 6, 7]])
    want = model(ids, contiguous)[:, -1]
    paged, view = caches[1:3]
    assert (model(ids, paged)[:, -1] - want).abs().max() < 1e-5
    assert (model(ids, view, view.mask, positions=view.positions)[:, -1] - want).abs().max() < 1e-5
    for cache in caches:  # the interface is what a cache does; the positions and the mask are the batch's
        assert not hasattr(cache, "key_mask") and not callable(getattr(cache, "positions", None))


def test_an_object_with_only_the_attention_numbers_is_enough():
    """Notebook 03 asks the formula about MHA and MQA variants of the model with a SimpleNamespace of four fields."""
    from types import SimpleNamespace

    mqa = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=1, head_dim=64)
    assert kv_cache_bytes(mqa, 1) == kv_bytes(30, 1, 64, 2) == 23_040 // 3
    mha = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=9, hidden_size=576)
    assert kv_cache_bytes(mha, 1) == 3 * 23_040  # head_dim from hidden_size // heads


def test_written_positions_reads_the_stored_tensors_not_the_length(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    cache = model.new_cache(1, 16)
    assert cache.written_positions() == 0
    model(torch.tensor([[5, 6, 7, 8, 9]]), cache)
    assert cache.length == 5 and cache.written_positions() == 5
    cache.advance(3)  # the length moves, nothing is written
    assert cache.length == 8 and cache.written_positions() == 5
    cache.values[-1].zero_()  # one layer's values lost: no position is whole any more
    assert cache.written_positions() == 0
