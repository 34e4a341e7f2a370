"""The experiments of notebook 10, in real spawned gloo ranks, on the real model: TP = 3 against one process and
against transformers' own tp_plan="auto"; a 2-stage pipeline; the cost measurement. One group per test; the pipeline
and the cost run are the ones `python -m llm_anatomy parallel --quick` makes too (tests/cli/test_parallel.py), and
spawn_once starts each once in a session."""

from __future__ import annotations

import statistics

import pytest
import torch
from spawn_once import spawn_once

from llm_anatomy.device import torch_threads
from llm_anatomy.distributed.collectives import (BYTES_MARGIN, SMALL_TP2, check_latency_bound, fit_link,
                                                 free_cores_for, predict_from_shard, tp_step_collectives)
from llm_anatomy.distributed.launch import run_ranks
from llm_anatomy.distributed.pipeline import bubble_fraction, measured_bubble
from llm_anatomy.distributed.runs import cost_run, pipeline_run, tp_run
from llm_anatomy.distributed.tensor_parallel import RandomWeights, weight_bytes
from llm_anatomy.errors import CourseError
from llm_anatomy.generate.decode import generate_greedy
from llm_anatomy.model.scratch import ScratchConfig, ScratchLlama
from llm_anatomy.weights.cache import default_model_dir

PROMPT = "The capital of France is Paris. The capital of Italy is"


@pytest.fixture(scope="module")
def plain(real):
    return ScratchLlama.from_hf(real)


@pytest.fixture(scope="module")
def ids(real):
    return real.tokenizer(PROMPT, return_tensors="pt").input_ids  # [1, seq]


@pytest.fixture(scope="module")
def tp3(plain, ids):
    """One TP = 3 group for the two tests below (starting the ranks and loading is most of the time): our 48 greedy
    tokens, and in the same group transformers' tp_plan="auto" model with 16 of its own."""
    return run_ranks(tp_run, 3, plain.cfg, str(default_model_dir()), ids, 48, True, 16, timeout_s=150)


def test_tp3_gives_one_process_logits_and_48_identical_greedy_tokens(plain, ids, tp3):
    with torch_threads(1):  # the ranks' thread count, so that only the split changes the roundings
        want_logits = plain(ids)
        want_tokens = generate_greedy(plain, ids, 48).tokens
    ranks = tp3
    scale = want_logits.abs().max().item()
    assert (ranks[0]["logits"] - want_logits).abs().max().item() / scale <= 1e-5
    assert all(torch.equal(r["tokens"], want_tokens) for r in ranks)  # cached decode, 48 tokens, every rank
    sites = [site for _, site, _ in ranks[0]["forward_calls"]]
    assert sites == ["embedding"] + ["attention", "mlp"] * 30 + ["logits"]  # 2 all-reduces per layer per forward
    assert {b for op, _, b in ranks[0]["forward_calls"] if op == "all_reduce"} == {1 * ids.shape[1] * 576 * 4}
    assert ranks[0]["generation_calls"] == 48 * 62  # the prefill and 47 decode steps, 62 collectives each
    whole_kv = plain.new_cache(1, ids.shape[1] + 48).allocated_bytes()
    assert [3 * r["kv_bytes"] for r in ranks] == [whole_kv] * 3  # each rank holds its one KV head of three
    norms = 61 * 576 * 4  # the RMSNorm weights are kept whole on every rank
    assert all(3 * (r["weight_bytes"] - norms) == weight_bytes(plain) - norms for r in ranks)
    assert ranks[1]["shapes"]["layers.0.self_attn.q_proj.weight"] == (192, 576)  # 3 of 9 heads
    assert ranks[1]["shapes"]["layers.0.mlp.down_proj.weight"] == (576, 512)  # 512 of 1,536 inputs


@pytest.mark.integration
def test_each_rank_holds_the_shard_of_transformers_tp_plan(tp3):
    """Each rank's weights equal the local shards (to_local() of the DTensors) of transformers'
    from_pretrained(..., tp_plan="auto") in the same gloo group, and both models give the same logits and tokens."""
    for r in tp3:
        t = r["transformers"]
        assert t["weights"] == 272 and t["equal"] == 272 and t["different"] == []
        assert t["max_logit_difference"] / t["scale"] <= 1e-5
        assert t["tokens"].shape == (1, 16) and torch.equal(t["tokens"], r["tokens"][:, :16])


@pytest.mark.integration
def test_transformers_loads_tp2_and_fails_mid_forward_where_ours_refuses(plain):
    """What notebook 10 says of transformers: with TP = 2 (9 query heads) it loads, then its first forward pass fails
    with a shape error. Ours refuses before any rank starts (test_tensor_parallel.py)."""
    import rank_targets

    with pytest.raises(CourseError, match=r"RuntimeError: shape .* is invalid for input of size"):
        run_ranks(rank_targets.transformers_forward, 2, str(default_model_dir()), timeout_s=60)


def test_a_two_stage_pipeline_is_bit_identical_and_micro_batches_fill_its_bubble(plain):
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(3, plain.cfg.vocab_size, (4, 12), generator=g)  # [4, 12]
    with torch_threads(1):
        want = plain(batch)
    stages = spawn_once(pipeline_run, 2, plain.cfg, str(default_model_dir()), batch, [1, 2, 4], 2, timeout_s=60)
    assert stages[0]["logits"] is None and torch.equal(stages[1]["logits"], want)  # layers 0-14, then 15-29
    bubble = {m: statistics.median(measured_bubble([s["runs"][m][k] for s in stages]) for k in range(2))
              for m in (1, 2, 4)}
    assert bubble[1] == pytest.approx(bubble_fraction(2, 1), abs=0.05)  # one batch: half, plus the hidden state's trip
    assert bubble[4] < bubble[1]  # micro-batches fill the bubble
    kinds = [seg[0] for seg in stages[1]["runs"][4][0]]
    assert kinds == ["wait", "compute"] * 4  # the second stage waits for each micro-batch, then works on it


def test_the_cost_run_times_the_sweep_and_both_steps(plain):
    sizes = [4, 2304, 262_144]
    ranks = spawn_once(cost_run, 3, plain.cfg, str(default_model_dir()), sizes, 3, 3, timeout_s=60)
    first = ranks[0]
    assert sorted(first["sweep"]) == sizes and all(len(t) == 3 and min(t) > 0 for t in first["sweep"].values())
    link = fit_link(first["sweep"])
    assert link.latency_s > 0 and link.bytes_per_s > 0
    assert len(first["alone_s"]) == len(first["alone_all_cores_s"]) == 3 and ranks[1]["alone_s"] == []
    for r in ranks:
        assert len(r["tp_s"]) == len(r["inside_s"]) == 3
        assert all(0 < inside < step for inside, step in zip(r["inside_s"], r["tp_s"]))  # a part of the step
        assert len(r["last_step"]) == 62 and all(seconds > 0 for *_, seconds in r["last_step"])


def test_the_small_models_tp2_cost_run_gives_a_latency_bound_prediction():
    """Notebook 10's C22 run, shortened: 2 ranks of the small random-weight model; the prediction from the fastest
    repeats holds the claim where each rank has a free core (the gate, read from the machine before the run), and is
    amber otherwise, as on this 2-core machine (measured at load 12: latency 11.7 ms, against 4.4 ms of compute saved
    and 0.015 ms of bytes, but the latency there is the OS's time slice)."""
    cfg = ScratchConfig(**SMALL_TP2)
    shown, why = free_cores_for(2)
    ranks = run_ranks(cost_run, 2, cfg, RandomWeights(cfg, 0), [4, 2304, 65536], 5, 4, timeout_s=60)
    first = ranks[0]
    assert len(first["shard_s"]) == len(first["alone_s"]) == 4 and ranks[1]["shard_s"] == []
    calls = tp_step_collectives(cfg, 2)
    predicted = predict_from_shard(min(first["alone_s"]), min(first["shard_s"]), calls,
                                   fit_link(first["sweep"], pick=min))
    verdict = str(check_latency_bound(predicted, len(calls), shown, why))
    assert ("C22 holds" in verdict) if shown else ("C22 not shown" in verdict)  # amber on a 2-core machine
    assert predicted["latency_s"] >= BYTES_MARGIN * predicted["bytes_s"]  # the plumbing: latency-bound messages


def test_the_serial_engine_waits_for_the_last_stage_before_each_micro_batch():
    """pipeline_run's counterfactual engine (serial=True): stage 0 starts micro-batch i only after stage 1 has finished
    i - 1, so the two never compute at once."""
    from llm_anatomy.weights.random import random_config

    cfg = ScratchConfig.from_hf(random_config("tiny", num_hidden_layers=2))
    batch = torch.randint(3, cfg.vocab_size, (4, 8), generator=torch.Generator().manual_seed(0))
    stages = run_ranks(pipeline_run, 2, cfg, RandomWeights(cfg, 0), batch, [1, 4], 1, None, True, False, timeout_s=60)
    first = [seg[0] for seg in stages[0]["runs"][4][0]]
    assert first == ["compute", "wait"] * 3 + ["compute"]
    assert [seg[0] for seg in stages[1]["runs"][4][0]] == ["wait", "compute"] * 4
