"""`python -m llm_anatomy bench api`: an OpenAI-compatible server measured from its client (notebook 11).

    python -m llm_anatomy bench api --json                      # starts our server on 127.0.0.1, then measures it
    python -m llm_anatomy bench api --url http://127.0.0.1:8000/v1 --rate 4 --requests 64
    python -m llm_anatomy bench api --transformers --json       # and `transformers serve --continuous-batching`

What vLLM's `bench serve` reports, through the official `openai` async client (server/client.py): completed and
failed requests, request and output-token throughput, mean / median / p99 of TTFT, TPOT, ITL and end-to-end latency,
request goodput under the stated objectives. With the server started here it also reports the targets of notebook 11:
- greedy streamed text equal to the course's own greedy decoding (generate/decode.py), and to transformers serve's;
- the server's own latency: client TTFT minus the engine's TTFT (measure/timing.py), p50 over requests sent one at a
  time by one warm client (target <= 10 ms), split into what the server's handler timed itself and the rest, and
  the same p50 at the run's rate; and again from a lean client (h11 on one connection, server/client.lean_stream),
  whose own work is next to nothing, so that the `openai` client's own share shows as the difference;
- under 2x overload with the queue limit sized from the TTFT objective (`--max-waiting auto`: the longest queue
  whose drain at the measured service rate fits 3x the shortest prefill, server/sizing.py), the admitted requests'
  p99 TTFT within 3x of the unloaded p99;
- our output tokens/s against transformers serve's with continuous batching (target >= 1.0x).
Every run is bounded in requests and in seconds. Benchmark on a quiet machine: the figures are this machine's.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

from ...errors import CourseError
from . import report

AIMS = {"server_overhead_p50_ms": 10.0, "overload_p99_over_unloaded_p99": 3.0, "ours_over_transformers_tokens": 1.0}
QUESTIONS = ("What is the capital of France?", "Name three colours.", "What is 2 + 2?", "Say hello politely.",
             "Name an animal that lives in the sea.", "What is the boiling point of water?")


def _prompts():
    return [[{"role": "user", "content": q}] for q in QUESTIONS]


def _greedy_texts(max_tokens: int) -> list[str]:
    """The course's own greedy answers (one decoding loop, fp32 on the CPU), the end of the turn cut."""
    import torch

    from ...generate.chat import chat_prompt_ids, end_of_turn_ids
    from ...generate.decode import generate_greedy
    from . import load_bench_model

    _, model, tok = load_bench_model("default", "cpu", torch.float32)
    ends = set(end_of_turn_ids(tok))
    texts = []
    for messages in _prompts():
        out = generate_greedy(model, chat_prompt_ids(tok, messages), max_tokens).tokens[0].tolist()
        cut = next((i for i, t in enumerate(out) if t in ends), len(out))
        texts.append(tok.decode(out[:cut]))
    return texts


def measure(url: str, model: str, api_key: str | None, rate: float, requests: int, max_tokens: int,
            timeout_s: float) -> tuple[dict, list]:
    from ...server.client import run_load, summarize

    results, took = run_load(url, model, _prompts(), requests=requests, rate=rate, max_tokens=max_tokens,
                             api_key=api_key, timeout_s=timeout_s)
    return summarize(results, took), results


def _ours(args, log) -> dict:
    from ...server.client import lean_stream, run_load, summarize
    from ...server.launch import ServerProcess

    out = {}
    with ServerProcess.ours("--max-batch", str(args.max_batch), ready_timeout_s=300) as server:
        model = json.loads(server.get("/v1/models"))["data"][0]["id"]
        log("ours: greedy answers, one at a time")
        alone = [run_load(server.url, model, [p], requests=1, max_tokens=args.max_tokens)[0][0] for p in _prompts()]
        out["texts"] = [r.text for r in alone]
        log("ours: one request at a time, one client (its first request is its warm-up)")
        results, took = run_load(server.url, model, _prompts(), requests=args.requests + 1, rate=math.inf,
                                 max_concurrency=1, max_tokens=args.max_tokens, timeout_s=args.timeout)
        unloaded = summarize(results[1:], took)
        out.update(_overhead(server, results[1:], "server_overhead"))
        log("ours: one request at a time from a lean client (h11 on one connection, no client library)")
        lean = lean_stream(server.url, model, _prompts()[2], requests=args.requests + 1, max_tokens=args.max_tokens,
                           timeout_s=args.timeout)
        out.update(_overhead(server, lean[1:], "server_overhead_lean_client"))
        log(f"ours: {args.requests} requests at {args.rate} req/s")
        out["load"], results = measure(server.url, model, None, args.rate, args.requests, args.max_tokens,
                                       args.timeout)
        out.update(_overhead(server, results, "server_overhead_under_load"))
        capacity = out["load"]["request_throughput"] if math.isinf(args.rate) else None
        burst = summarize(*run_load(server.url, model, _prompts(), requests=args.requests, rate=math.inf,
                                    max_tokens=args.max_tokens, timeout_s=args.timeout))
        capacity = capacity or burst["request_throughput"]
        _put_limit(server, "auto")  # sized from the TTFT objective at each decision (server/sizing.py)
        log(f"ours: 2x overload ({2 * capacity:.2f} req/s) with the queue limit sized from the TTFT objective")
        over_n = max(args.requests, 3 * args.max_batch)  # enough to fill the slots and a queue behind them
        over = summarize(*run_load(server.url, model, _prompts(), requests=over_n, rate=2 * capacity,
                                   max_tokens=args.max_tokens, timeout_s=args.timeout))
        out["overload_queue_limit_after"] = json.loads(server.get("/debug/requests"))["queue_limit"]
        out["unloaded_p99_ttft_ms"], out["overload"] = unloaded["p99_ttft_ms"], over
        out["overload_p99_over_unloaded_p99"] = over["p99_ttft_ms"] / unloaded["p99_ttft_ms"]
    return out


def _overhead(server, results, key: str) -> dict:
    """The p50 of the server's own latency (client TTFT - engine TTFT) of these requests, ms, and of its parts: what
    the server's handler timed itself, and the rest (the client, the loopback, the web server's HTTP work)."""
    from ...server.client import server_latency

    records = {r["name"]: r for r in json.loads(server.get("/debug/requests"))["requests"]}
    rows = server_latency(results, records)

    def p50(part):
        values = [row[part] for row in rows if not math.isnan(row[part])]
        return statistics.median(values) * 1e3 if values else math.nan
    return {f"{key}_p50_ms": p50("own"), f"{key}_in_handler_p50_ms": p50("in_handler"),
            f"{key}_outside_p50_ms": p50("outside"), f"{key}_requests": len(rows)}


def _put_limit(server, limit: int | str | None) -> None:
    import urllib.request

    request = urllib.request.Request(server.root + "/debug/max-waiting", method="PUT",
                                     data=json.dumps({"max_waiting": limit}).encode())
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10).close()


def _transformers(args, log) -> dict:
    from ...server.client import run_load
    from ...server.launch import ServerProcess
    from ...weights.cache import default_model_dir

    folder = str(default_model_dir())
    log("transformers serve --continuous-batching: starting (offline, the course's model files)")
    with ServerProcess.transformers(folder, "--continuous-batching", "--device", "cpu", "--dtype", "float32",
                                    ready_timeout_s=args.timeout) as server:
        alone = [run_load(server.url, folder, [p], requests=1, max_tokens=args.max_tokens)[0][0] for p in _prompts()]
        load, _ = measure(server.url, folder, None, args.rate, args.requests, args.max_tokens, args.timeout)
    return {"texts": [r.text for r in alone], "load": load}


def run(args, log=lambda message: None) -> dict:
    if args.url:  # someone else's server: the client's figures only
        from ...server.client import run_load  # noqa: F401  (fails early when openai is missing)

        model = args.model or "default"
        load, _ = measure(args.url, model, args.api_key, args.rate, args.requests, args.max_tokens, args.timeout)
        return {"url": args.url, "rate": _rate(args.rate), "requests": args.requests, "load": load}
    ours = _ours(args, log)
    reference = _greedy_texts(args.max_tokens)
    out = {"rate": _rate(args.rate), "requests": args.requests, "max_tokens": args.max_tokens, "aims": AIMS, "ours": ours,
           "greedy_equal_to_generate_greedy": ours["texts"] == reference}
    out["server_overhead_met"] = ours["server_overhead_p50_ms"] <= AIMS["server_overhead_p50_ms"]
    out["server_overhead_lean_client_met"] = (ours["server_overhead_lean_client_p50_ms"]
                                              <= AIMS["server_overhead_p50_ms"])
    out["overload_met"] = ours["overload_p99_over_unloaded_p99"] <= AIMS["overload_p99_over_unloaded_p99"]
    if args.transformers:
        try:
            theirs = _transformers(args, log)
        except CourseError as err:  # it did not come up offline, within the time: say so, keep our figures
            out["transformers"] = {"error": str(err)[:2000]}
        else:
            out["transformers"] = theirs
            out["greedy_equal_to_transformers_serve"] = theirs["texts"] == ours["texts"]
            ratio = ours["load"]["output_throughput"] / max(theirs["load"]["output_throughput"], 1e-9)
            out["ours_over_transformers_tokens"] = ratio
            out["tokens_met"] = ratio >= AIMS["ours_over_transformers_tokens"]
    return out


def _rate(rate: float):
    return "all at once" if math.isinf(rate) else rate


def format_table(out: dict) -> str:
    if "ours" not in out:
        load = out["load"]
        return "\n".join(f"{k:<24} {v:.3f}" if isinstance(v, float) else f"{k:<24} {v}" for k, v in load.items())
    ours, load = out["ours"], out["ours"]["load"]
    lines = [f"ours, {out['requests']} requests at {out['rate']} (req/s): {load['completed']} completed, "
             f"{load['output_throughput']:.1f} output tokens/s, TTFT p50 {load['median_ttft_ms']:.0f} ms "
             f"p99 {load['p99_ttft_ms']:.0f} ms, TPOT p50 {load['median_tpot_ms']:.0f} ms",
             f"greedy text equal to generate_greedy: {out['greedy_equal_to_generate_greedy']}",
             f"server's own latency (client TTFT - engine TTFT) p50: {ours['server_overhead_p50_ms']:.1f} ms "
             f"(target <= 10 ms: {'met' if out['server_overhead_met'] else 'missed'}), of which "
             f"{ours['server_overhead_in_handler_p50_ms']:.1f} ms in the handler (p50), the rest the client, the "
             f"loopback and the HTTP work; at {out['rate']} req/s {ours['server_overhead_under_load_p50_ms']:.1f} ms",
             f"the same from a lean client (h11, no client library): {ours['server_overhead_lean_client_p50_ms']:.1f} "
             f"ms p50 (target: {'met' if out['server_overhead_lean_client_met'] else 'missed'}), of which "
             f"{ours['server_overhead_lean_client_in_handler_p50_ms']:.1f} ms in the handler",
             f"2x overload, queue limit auto (last {ours['overload_queue_limit_after']}): p99 TTFT "
             f"{ours['overload']['p99_ttft_ms']:.0f} ms against unloaded "
             f"{ours['unloaded_p99_ttft_ms']:.0f} ms ({ours['overload_p99_over_unloaded_p99']:.1f}x; target <= 3x: "
             f"{'met' if out['overload_met'] else 'missed'}), {ours['overload']['refused_429']} refused"]
    theirs = out.get("transformers")
    if theirs and "error" in theirs:
        lines.append(f"transformers serve did not run: {theirs['error'][:300]}")
    elif theirs:
        lines.append(f"transformers serve: {theirs['load']['output_throughput']:.1f} output tokens/s; ours "
                     f"{out['ours_over_transformers_tokens']:.2f}x (target >= 1.0x: "
                     f"{'met' if out['tokens_met'] else 'missed'}); the same greedy text: "
                     f"{out['greedy_equal_to_transformers_serve']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from . import progress, set_threads

    p = argparse.ArgumentParser(prog="python -m llm_anatomy bench api", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--url", default=None, help="measure a running server at this base URL instead of starting ours")
    p.add_argument("--model", default=None, help="the model name to ask for (with --url)")
    p.add_argument("--api-key", default=None, help="the key for --url's server")
    p.add_argument("--rate", type=float, default=math.inf, help="requests per second, Poisson (default: all at once)")
    p.add_argument("--requests", type=int, default=12, help="requests per run (default 12)")
    p.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each request (default 16)")
    p.add_argument("--max-batch", type=int, default=8, help="our server's batch slots (default 8)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds at most per run (default 300)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch in this process")
    p.add_argument("--transformers", action="store_true", help="also run `transformers serve --continuous-batching`")
    args = p.parse_args(argv)
    if not 1 <= args.requests <= 10_000 or not args.rate > 0 or not args.max_tokens >= 1:
        raise CourseError("--requests must be 1 to 10,000, --rate > 0 and --max-tokens >= 1.")
    set_threads(args.threads)
    return report(run(args, progress(args.json)), args.json, format_table)
