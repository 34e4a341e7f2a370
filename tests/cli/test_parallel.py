"""`python -m llm_anatomy parallel`: a TP size that does not divide the heads is refused in one sentence, before any
rank starts; a quick run on the real model gives every figure, with identical tokens and logits."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from bench_helpers import positive
from cli_helpers import run_cli

from llm_anatomy.cli.bench.parallel import format_table


def test_tp2_is_refused_in_one_sentence():
    """The command's one subprocess run: the real entry, exit status 1 and one sentence on stderr, nothing else."""
    proc = subprocess.run([sys.executable, "-m", "llm_anatomy", "parallel", "--tp", "2"], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == ("error: TP = 2 does not divide this model's 9 query heads and 3 KV heads: each "
                                   "rank must hold whole heads and an equal share, so choose a TP size from [1, 3].")


def test_a_pipeline_that_does_not_divide_the_layers_is_refused():
    run = run_cli("parallel", "--pp", "4")
    assert run.code == 1 and "4 stages do not cut this model's 30 layers" in run.err


@pytest.fixture(scope="module")
def quick_json():
    """One quick run in this process. Its pipeline and cost runs are tests/distributed/test_runs.py's (the same
    ranks, model and inputs): spawn_once starts each once in a session, for whichever file comes first."""
    from spawn_once import spawn_once

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("llm_anatomy.distributed.launch.run_ranks", spawn_once)
        return run_cli("parallel", "--tp", "3", "--pp", "2", "--quick", "--json").json()


@pytest.mark.integration
def test_json_has_every_figure(quick_json):
    r = quick_json
    assert r["tp"] == 3 and r["pp"] == 2 and r["backend"] in ("gloo", "nccl") and r["quick"] is True
    t = r["tensor_parallel"]
    assert t["same_tokens"] is True and t["relative_difference"] <= 1e-5
    assert t["collectives_per_forward"] == {"embedding": 1, "attention": 30, "mlp": 30, "logits": 1}
    assert [3 * k for k in t["kv_bytes_per_rank"]] == [t["kv_bytes_whole"]] * 3
    a, d = r["all_reduce"], r["decode_step"]
    assert positive(a["latency_s"]) and positive(a["bytes_per_s"]) and positive(a["half_bandwidth_bytes"])
    for key in ("tp1_s", "tp1_all_cores_s", "tp3_s", "inside_collectives_s", "predicted_s"):
        assert positive(d[key]), key
    assert d["prediction_error"] == pytest.approx((d["tp3_s"] - d["predicted_s"]) / d["tp3_s"])
    p = r["pipeline"]
    assert p["identical_logits"] is True and set(p["bubble"]) == {"1", "2", "4"}
    assert p["bubble_formula"] == {"1": 0.5, "2": 1 / 3, "4": 0.2}


@pytest.mark.integration
def test_the_table_names_each_figure(quick_json):
    table = format_table(quick_json)
    for words in ("logits vs one process", "collectives per forward", "KV cache per rank", "all-reduce",
                  "predicted TP = 3", "error", "pipeline of 2 stages", "bubble"):
        assert words in table, words
