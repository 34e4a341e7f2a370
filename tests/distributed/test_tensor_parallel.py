"""Tensor parallelism (C21), picotron-style: slice a plain layer's weight, compare outputs bit for bit; then the whole
model split over ranks (threads of this process, then real spawned gloo ranks) against one process, and against
transformers' own tp_plan="auto"."""

from __future__ import annotations

import pytest
import torch
from thread_group import run_threads
from llm_anatomy.weights.random import random_llama

from llm_anatomy.claims import ClaimFailed
from llm_anatomy.errors import CourseError
from llm_anatomy.distributed.tensor_parallel import (COLUMN, ROW, Communicator, check_tp_logits, check_tp_size,
                                                     check_tp_traffic, kv_head_replicas, kv_heads_of_rank,
                                                     local_config, shard, split_dim, state_dict_reader,
                                                     tensor_parallel_llama, valid_tp_sizes, weight_bytes)
from llm_anatomy.generate.decode import generate_greedy
from llm_anatomy.model.scratch import ScratchLlama

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TP3 = dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=3, head_dim=16, intermediate_size=192,
           vocab_size=192)  # a tiny model that 3 ranks can share


@pytest.fixture(scope="module")
def tiny3():
    return ScratchLlama.from_hf(random_llama(seed=3, **TP3))


def test_which_weights_are_split_and_how():
    assert [split_dim(f"layers.4.self_attn.{n}.weight") for n in ("q_proj", "k_proj", "v_proj", "o_proj")] == \
        [COLUMN, COLUMN, COLUMN, ROW]
    assert [split_dim(f"layers.0.mlp.{n}.weight") for n in ("gate_proj", "up_proj", "down_proj")] == [0, 0, 1]
    assert split_dim("embed_tokens.weight") == split_dim("lm_head.weight") == 0  # by vocabulary
    assert split_dim("layers.0.input_layernorm.weight") is None and split_dim("norm.weight") is None


def _integer_layer(out_features: int, in_features: int, seed: int):
    """A layer and an input of small whole numbers: every sum is exact in fp32, in any order, on any machine, so
    "bit for bit" does not depend on how a matmul kernel orders its additions."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randint(-4, 5, (out_features, in_features), generator=g).float()  # [out, in]
    x = torch.randint(-4, 5, (2, 5, in_features), generator=g).float()  # [batch, seq, in]
    return weight, x


def test_a_column_split_is_a_slice_of_the_output_bit_for_bit():
    weight, x = _integer_layer(24, 40, seed=0)
    full = x @ weight.T  # [2, 5, 24]
    for rank in range(3):
        part = shard(weight, COLUMN, rank, 3)
        assert torch.equal(part, weight[rank * 8:(rank + 1) * 8])
        assert torch.equal(x @ part.T, full[..., rank * 8:(rank + 1) * 8])


def test_row_splits_add_up_to_the_output_after_the_all_reduce():
    weight, x = _integer_layer(20, 48, seed=1)
    parts = [x[..., r * 16:(r + 1) * 16] @ shard(weight, ROW, r, 3).T for r in range(3)]
    assert torch.equal(parts[0] + parts[1] + parts[2], x @ weight.T)  # what the all-reduce computes
    assert not torch.equal(parts[0], x @ weight.T)  # one rank's partial sum is not the answer
    g = torch.Generator().manual_seed(2)  # real numbers: equal to rounding, the sums taken in another order
    layer, y = torch.nn.Linear(48, 20, bias=False), torch.randn(3, 48, generator=g)
    total = sum(y[..., r * 16:(r + 1) * 16] @ shard(layer.weight, ROW, r, 3).T for r in range(3))
    assert torch.allclose(total, layer(y), rtol=0, atol=1e-6)


def test_only_sizes_that_divide_the_heads_are_allowed(real):
    cfg = ScratchLlama.from_hf(real).cfg
    assert valid_tp_sizes(cfg) == [1, 3]  # 9 query heads, 3 KV heads
    with pytest.raises(CourseError, match=r"^TP = 2 does not divide this model's 9 query heads and 3 KV heads: .*"
                                          r"choose a TP size from \[1, 3\]\.$"):
        check_tp_size(cfg, 2)
    for bad in (0, -3, 1.5, True, "3"):
        with pytest.raises(CourseError, match="whole number"):
            check_tp_size(cfg, bad)
    assert local_config(cfg, 3).num_heads == 3 and local_config(cfg, 3).num_kv_heads == 1
    assert local_config(cfg, 3).intermediate_size == 512


def test_smollm2_360m_allows_tp5_and_a_1b_shape_allows_powers_of_two():
    from transformers import LlamaConfig

    from llm_anatomy.model.scratch import ScratchConfig
    from llm_anatomy.weights.random import RANDOM_SHAPES

    shapes = {n: ScratchConfig.from_hf(LlamaConfig(**RANDOM_SHAPES[n])) for n in ("360m", "1b")}
    assert valid_tp_sizes(shapes["360m"]) == [1, 5]  # 15 query heads, 5 KV heads; the vocabulary is padded
    assert valid_tp_sizes(shapes["1b"]) == [1, 2, 4, 8]  # 32 and 8
    # vLLM's rule: TP divides the query heads; beyond the KV heads it must be a multiple of them (copies of each)
    assert valid_tp_sizes(shapes["1b"], replicate_kv=True) == [1, 2, 4, 8, 16, 32]
    assert valid_tp_sizes(shapes["360m"], replicate_kv=True) == [1, 5]  # 15 does not divide the MLP's 2,560


def test_beyond_the_kv_heads_each_rank_holds_the_kv_head_its_query_heads_read():
    from dataclasses import replace

    from transformers import LlamaConfig

    from llm_anatomy.model.scratch import ScratchConfig
    from llm_anatomy.weights.random import RANDOM_SHAPES

    one_b = ScratchConfig.from_hf(LlamaConfig(**RANDOM_SHAPES["1b"]))  # 32 query heads, 8 KV heads
    assert [kv_head_replicas(one_b, tp) for tp in (1, 2, 4, 8, 16, 32)] == [1, 1, 1, 1, 2, 4]
    assert kv_heads_of_rank(one_b, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]  # shared out, no copies
    at16 = kv_heads_of_rank(one_b, 16)
    assert at16 == [[r // 2] for r in range(16)]  # ranks 2k and 2k + 1 both hold KV head k
    for tp in (8, 16, 32):  # a rank's query heads h read KV head h // 4: exactly the one it holds
        q = 32 // tp
        assert all(kv_heads_of_rank(one_b, tp)[r] == [r * q // 4] for r in range(tp))
    sixes = replace(one_b, num_heads=24)  # 24 query heads, 8 KV heads
    assert 12 not in valid_tp_sizes(sixes, replicate_kv=True)  # divides 24, but 12 ranks cannot share 8 KV heads
    for bad in (3, 12):
        with pytest.raises(CourseError, match=rf"^TP = {bad} fits neither way: .*choose from \[.*\]\.$"):
            kv_head_replicas(sixes if bad == 12 else one_b, bad)


def test_tp2_is_refused_before_any_weight_is_read(tiny3):
    read_calls = []

    def read(*args):
        read_calls.append(args)
        raise AssertionError("no weight should be read")

    with pytest.raises(CourseError, match="TP = 2"):
        tensor_parallel_llama(read, tiny3.cfg, 0, 2)
    assert read_calls == []


def test_tp1_gives_exactly_the_plain_models_logits_and_tokens(tiny3):
    alone = tensor_parallel_llama(state_dict_reader(tiny3), tiny3.cfg, 0, 1, Communicator())
    ids = torch.tensor([[5, 17, 99, 3, 150, 42]])
    assert torch.equal(alone(ids), tiny3(ids))
    assert torch.equal(generate_greedy(alone, ids, 12).tokens, generate_greedy(tiny3, ids, 12).tokens)
    alone.comm.reset()
    alone(ids)  # a rank alone sends nothing, but records where the collectives would be
    assert alone.comm.counts() == {"embedding": 1, "attention": 2, "mlp": 2, "logits": 1}


def _tp3(model, ids, drop=(), new_tokens=0):
    def work(rank, comm):
        m = tensor_parallel_llama(state_dict_reader(model), model.cfg, rank, 3, comm)
        logits = m(ids)
        calls = list(m.comm.calls)
        tokens = generate_greedy(m, ids, new_tokens).tokens if new_tokens else None
        return {"logits": logits, "calls": calls, "tokens": tokens, "bytes": weight_bytes(m),
                "kv": m.new_cache(1, 20).allocated_bytes()}

    return run_threads(3, work, drop)


def test_tp3_in_threads_matches_one_process(tiny3):
    ids = torch.tensor([[5, 17, 99, 3, 150, 42, 7]])
    ranks = _tp3(tiny3, ids, new_tokens=10)
    want = tiny3(ids)
    for r in ranks:
        assert torch.allclose(r["logits"], want, rtol=0, atol=1e-5)
        assert torch.equal(r["tokens"], generate_greedy(tiny3, ids, 10).tokens)
    sites = [c.site for c in ranks[0]["calls"]]
    assert sites == ["embedding"] + ["attention", "mlp"] * tiny3.cfg.num_layers + ["logits"]
    hidden_bytes = 1 * 7 * 96 * 4  # batch x tokens x hidden x fp32
    assert {c.bytes for c in ranks[0]["calls"] if c.op == "all_reduce"} == {hidden_bytes}
    assert 3 * ranks[0]["kv"] == tiny3.new_cache(1, 20).allocated_bytes()  # each rank: its own KV heads
    norms = sum(p.numel() * 4 for n, p in tiny3.named_parameters() if "norm" in n)  # the norms are kept whole
    assert 3 * (ranks[0]["bytes"] - norms) == weight_bytes(tiny3) - norms


def test_a_vocabulary_that_tp_does_not_divide_is_padded():
    odd = ScratchLlama.from_hf(random_llama(seed=4, **{**TP3, "vocab_size": 190}))  # 190 = 3 x 63 + 1
    ids = torch.tensor([[189, 0, 64, 63, 127, 128]])  # the first and last rows of each rank's share
    ranks = _tp3(odd, ids, new_tokens=6)
    assert ranks[0]["logits"].shape == (1, 6, 190)
    assert torch.allclose(ranks[0]["logits"], odd(ids), rtol=0, atol=1e-5)
    assert torch.equal(ranks[2]["tokens"], generate_greedy(odd, ids, 6).tokens)


IDS = torch.tensor([[5, 17, 99, 3, 150, 42, 7]])


def _logits_check(model, got):
    """C21's logits check (notebook 10's cell calls the same function) on a TP = 3 run's logits, tokens and shards
    left as they hold, so that only the logits decide."""
    want = model(IDS)
    return check_tp_logits((got - want).abs().max().item(), want.abs().max().item(), True, 3, 3, 3, 0)


def _traffic_check(model, calls, kv=None, weights=None):
    """C21's traffic check (notebook 10's cell calls the same function) on one rank's collectives."""
    norms = sum(p.numel() * 4 for n, p in model.named_parameters() if "norm" in n)
    whole_kv = model.new_cache(1, 20).allocated_bytes()
    share = (weight_bytes(model) - norms) // 3 + norms
    return check_tp_traffic([(c.op, c.site, c.bytes) for c in calls], model.cfg.num_layers, 7 * 96 * 4, 3,
                            kv or [whole_kv // 3] * 3, whole_kv, weights or [share] * 3, weight_bytes(model), norms)


def test_tp3_holds_both_checks_of_the_claim(tiny3):
    ranks = _tp3(tiny3, IDS)
    assert _logits_check(tiny3, ranks[0]["logits"]).passed
    assert _traffic_check(tiny3, ranks[0]["calls"], kv=[r["kv"] for r in ranks], weights=[r["bytes"] for r in ranks])


@pytest.mark.parametrize("site", ["attention", "mlp", "embedding"])
@pytest.mark.counterfactual("C21", "an all-reduce skipped (after attention, after the MLP, or the embedding's): the "
                                   "ranks' partial sums go on unsummed")
def test_a_missing_all_reduce_breaks_the_claims_evidence(tiny3, site):
    """The C21 claim cell compares the logits: a model that forgets one all-reduce fails it."""
    got = _tp3(tiny3, IDS, drop={site})[0]["logits"]
    with pytest.raises(ClaimFailed, match="C21 FAILED"):
        _logits_check(tiny3, got)


@pytest.mark.counterfactual("C21", "an engine that skips the MLP's all-reduce, and so never counts it")
def test_an_all_reduce_skipped_fails_the_count(tiny3):
    calls = [c for c in _tp3(tiny3, IDS)[0]["calls"] if c.site != "mlp"]
    with pytest.raises(ClaimFailed, match="C21 FAILED"):
        _traffic_check(tiny3, calls)


@pytest.mark.parametrize("per_layer", [1, 3])
@pytest.mark.counterfactual("C21", "all-reduces counted other than two per layer per step (one: attention and MLP "
                                   "summed together; three: an extra one after q/k/v)")
def test_other_than_two_all_reduces_per_layer_fail_the_count(tiny3, per_layer):
    calls = _tp3(tiny3, IDS)[0]["calls"]
    head, blocks, tail = calls[:1], calls[1:-1], calls[-1:]
    if per_layer == 1:
        blocks = blocks[::2]  # the attention's only
    else:
        blocks = [c for pair in zip(blocks[::2], blocks[::2], blocks[1::2]) for c in pair]
    assert len(blocks) == per_layer * tiny3.cfg.num_layers
    with pytest.raises(ClaimFailed, match="C21 FAILED"):
        _traffic_check(tiny3, head + blocks + tail)


@pytest.mark.counterfactual("C21", "the KV cache kept whole on every rank instead of each rank's own KV heads")
def test_a_kv_cache_not_split_fails_the_claim(tiny3):
    whole = tiny3.new_cache(1, 20).allocated_bytes()
    with pytest.raises(ClaimFailed, match="C21 FAILED"):
        _traffic_check(tiny3, _tp3(tiny3, IDS)[0]["calls"], kv=[whole] * 3)


@pytest.mark.counterfactual("C21", "rows of q_proj interleaved (every third) instead of contiguous blocks: the heads "
                                   "no longer line up")
def test_a_wrong_split_breaks_the_claims_evidence(tiny3):
    weights = tiny3.state_dict()

    def strided(name, dim=None, start=0, stop=None):
        if dim == COLUMN and "q_proj" in name:
            size = stop - start
            return weights[name][start // size::3].clone()  # every third row, from this rank's first
        return state_dict_reader(tiny3)(name, dim, start, stop)

    def work(rank, comm):
        return tensor_parallel_llama(strided, tiny3.cfg, rank, 3, comm)(IDS)

    with pytest.raises(ClaimFailed, match="C21 FAILED"):
        _logits_check(tiny3, run_threads(3, work)[0])


@pytest.mark.parametrize("name", ["q_proj", "o_proj", "gate_proj", "down_proj"])
@pytest.mark.counterfactual("C21", "a shard cut along the wrong dimension (inputs for outputs, or outputs for inputs), "
                                   "transposed to the shape the rank expects")
def test_a_shard_cut_along_the_wrong_dimension_fails_the_claim(name):
    """Square weights (hidden 96 = 6 heads x 16; MLP width 96) let the wrong cut pass the shape check."""
    model = ScratchLlama.from_hf(random_llama(seed=5, **{**TP3, "intermediate_size": 96}))
    weights = model.state_dict()

    def wrong(key, dim=None, start=0, stop=None):
        if dim is not None and key.endswith(f"{name}.weight"):
            other = 1 - dim
            return weights[key].narrow(other, start, stop - start).T.clone()  # the other dim's block, transposed
        return state_dict_reader(model)(key, dim, start, stop)

    def work(rank, comm):
        return tensor_parallel_llama(wrong, model.cfg, rank, 3, comm)(IDS)

    with pytest.raises(ClaimFailed, match="C21 FAILED"):
        _logits_check(model, run_threads(3, work)[0])


def test_a_shard_of_the_wrong_shape_is_refused(tiny3):
    weights = tiny3.state_dict()
    with pytest.raises(CourseError, match="rank 0's share has shape"):
        tensor_parallel_llama(lambda name, *where: weights[name], tiny3.cfg, 0, 3)  # unsplit weights
