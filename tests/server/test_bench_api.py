"""`python -m llm_anatomy bench api --url ...`: the client benchmark against a running server (conftest.py's), bounded,
with vLLM's figures in one JSON object; and its table."""

from __future__ import annotations

import json
import math

import pytest

from conftest import KEY
from llm_anatomy.errors import CourseError
from llm_anatomy.server.client import Result, summarize


def test_bench_api_measures_a_running_server(server, model_id, capsys):
    from llm_anatomy.cli.bench import api

    assert api.main(["--url", server.url, "--api-key", KEY, "--model", model_id, "--requests", "3", "--max-tokens",
                     "3", "--rate", "20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    load = out["load"]
    assert load["completed"] + load["refused_429"] == 3 and load["failed"] == load["refused_429"]
    assert load["output_throughput"] > 0 and 0 < load["median_ttft_ms"] <= load["p99_ttft_ms"]
    assert load["median_e2e_ms"] >= load["median_ttft_ms"]
    with pytest.raises(CourseError):
        api.main(["--url", server.url, "--requests", "0"])


def test_the_summary_is_vllms_figures_from_the_clients_records():
    ok = Result(0.0, 200, [0.2, 0.3, 0.5], 3, "abc", 0.5)  # TTFT 0.2, gaps 0.1 and 0.2, TPOT 0.15, E2E 0.5
    slow = Result(1.0, 200, [3.0, 3.1], 2, "ab", 3.1)  # TTFT 2.0: misses a 1 s objective
    refused = Result(1.5, 429, done_s=1.52, retry_after_s=2.0)
    out = summarize([ok, slow, refused], duration_s=4.0, ttft_slo_s=1.0, tpot_slo_s=0.2)
    assert (out["completed"], out["failed"], out["refused_429"]) == (2, 1, 1)
    assert out["request_throughput"] == 0.5 and out["output_throughput"] == 5 / 4
    assert out["median_ttft_ms"] == pytest.approx(1100) and out["mean_itl_ms"] == pytest.approx(400 / 3)
    assert out["request_goodput"] == 0.25 and out["median_refusal_ms"] == pytest.approx(20)
    assert ok.tpot_s == pytest.approx(0.15) and ok.e2e_s == pytest.approx(0.5)
    assert out["p99_ttft_ms"] == pytest.approx(1982)  # linear between the two nearest, numpy's way
    assert out["p99_tpot_ms"] == pytest.approx(100 + 0.99 * 50)  # between 0.1 and 0.15 s
    nothing = summarize([refused], duration_s=1.0)
    assert all(math.isnan(nothing[f"{s}_ttft_ms"]) for s in ("mean", "median", "p99")) and nothing["completed"] == 0


def test_the_server_latency_is_split_into_the_handlers_part_and_the_rest():
    from llm_anatomy.server.client import server_latency

    # client: sent at 0, first text at 0.30 s; engine: received 0.001 s before arrival, first token 0.27 s after it,
    # its chunk handed to the web server 0.002 s later
    r = Result(0.0, 200, [0.30, 0.35], 2, "ab", 0.35, name="chatcmpl-a")
    record = {"arrival_s": 10.0, "received_s": 9.999, "first_token_s": 10.27, "first_sent_s": 10.272, "ttft_s": 0.27}
    untimed = dict(record, received_s=None)  # an older record, or a whole (not streamed) answer
    rows = server_latency([r, Result(0.0, 429), Result(0.0, 200, [0.2], 1, "a", 0.2, name="chatcmpl-b")],
                          {"chatcmpl-a": record, "chatcmpl-b": untimed})
    assert [row["name"] for row in rows] == ["chatcmpl-a", "chatcmpl-b"]  # the refused request has no record
    assert rows[0]["own"] == pytest.approx(0.03) and rows[0]["in_handler"] == pytest.approx(0.003)
    assert rows[0]["outside"] == pytest.approx(0.027) and math.isnan(rows[1]["in_handler"])


def test_a_streamed_request_records_when_its_handler_began_and_sent_its_first_text(server, model_id):
    from llm_anatomy.server.client import run_load, server_latency

    results, _ = run_load(server.url, model_id, [[{"role": "user", "content": "Say hi."}]], requests=2,
                          max_concurrency=1, max_tokens=3, api_key=KEY)
    records = {r["name"]: r for r in json.loads(server.get("/debug/requests"))["requests"]}
    for r in results:
        e = records[r.name]
        assert e["received_s"] <= e["arrival_s"] <= e["first_token_s"] <= e["first_sent_s"]
    rows = server_latency(results, records)
    assert len(rows) == 2 and all(0 <= row["in_handler"] <= row["own"] for row in rows)


def test_a_lean_client_times_the_same_stream_without_a_client_library(server, model_id):
    from llm_anatomy.server.client import lean_stream, server_latency

    results = lean_stream(server.url, model_id, [{"role": "user", "content": "Say hi."}], requests=2, max_tokens=3,
                          api_key=KEY)
    assert len(results) == 2 and all(r.ok and r.text and 1 <= r.output_tokens <= 3 for r in results)
    assert all(r.name.startswith("chatcmpl-") for r in results) and results[0].name != results[1].name
    records = {r["name"]: r for r in json.loads(server.get("/debug/requests"))["requests"]}
    rows = server_latency(results, records)
    assert len(rows) == 2 and all(row["own"] >= 0 and 0 <= row["in_handler"] <= row["own"] for row in rows)
    refused = lean_stream(server.url, model_id, [{"role": "user", "content": "Hi"}], requests=1, api_key="wrong")
    assert refused[0].status == 401 and not refused[0].ok
