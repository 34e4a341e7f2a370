"""`python -m llm_anatomy bench serving`: static against continuous batching, paged KV memory, prefix caching.

    python -m llm_anatomy bench serving            # the default model, on the best device, in fp32
    python -m llm_anatomy bench serving --json     # one JSON object instead of the table
    python -m llm_anatomy bench serving --quick    # CI-sized: a few requests, a few tokens

Figures, all on one fixed, seeded mix of requests (mostly short answers and a few long ones):
- the service rate (capacity) of each engine first: every request waiting at time 0, requests finished per second;
- static (request-level) against continuous (iteration-level) batching with the same batch size, on a Poisson trace
  at 0.7x the continuous engine's capacity: throughput, TTFT and TPOT at p50 and p99, goodput under latency
  targets set from this machine's own decode step, and whether both gave the same greedy tokens;
- the latency-vs-rate sweep: the same requests at 0.3x to 1.2x that capacity, both engines, TTFT, TPOT, ITL and
  end-to-end latency at p50 and p99, and goodput as DistServe defines it (the highest rate at which 90% of
  requests meet both objectives);
- KV memory utilisation, reserve-max-length against paged, for 1,000 requests whose lengths (ShareGPT's published
  means, log-normal parts) are known only at the end (the vLLM paper: 20-38% for earlier servers, over 90% paged);
- prefix caching: TTFT of a request whose long system prompt is not cached, over one whose is;
- our continuous batching, padded and flattened, against transformers' own engine (`generate_batch`) on the same
  requests, all at once: the same tokens (checked), each the faster of two runs taken in turns, on the wall clock
  around the whole run (start-up and the scheduler's own work included, on both sides);
- the continuous engine padded (a decode call and a padded prompt-chunk call per iteration) against flattened (one
  call per iteration, serve/flat_step.py) on the trace's requests all waiting at once: the same tokens (checked),
  tokens/s of each on the measured clock (the faster of two alternating runs) and their ratio.
Timings depend on the machine and on what else runs on it (`--threads 1` helps on a busy, shared machine).
"""

from __future__ import annotations

import statistics

import numpy as np
import torch

from ...device import dtype_named
from . import load_bench_model, parser, progress, report, set_threads

LOAD = 0.7  # the headline trace's arrival rate, as a fraction of the continuous engine's capacity
AIMS = {"continuous_over_static_throughput": 2.0, "paged_utilisation": 0.9, "prefix_hit_ttft_speedup": 3.0,
        "ours_over_generate_batch": 1.0, "flattened_over_generate_batch": 1.5}


def _sizes(device: torch.device, quick: bool) -> dict:
    if quick:
        return dict(n=8, prompts=[8, 16], outputs=[2, 2, 3, 8], batch=4, budget=64, system=64,
                    question=8, hits=2, cb_requests=4, cb_tokens=4)
    if device.type == "cuda":
        return dict(n=64, prompts=[32, 64, 128, 256], outputs=[8, 8, 16, 16, 16, 128, 256], batch=16,
                    budget=512, system=2048, question=32, hits=3, cb_requests=16, cb_tokens=32)
    return dict(n=32, prompts=[16, 32, 64], outputs=[4, 4, 6, 6, 8, 48, 64], batch=8, budget=128,
                system=512, question=16, hits=3, cb_requests=8, cb_tokens=16)


def _prefix_ratio(model, system: list[int], questions: list[list[int]], block_size: int) -> dict:
    """TTFT of each question after the system prompt, with the prefix cache cold (miss) and warm (hit)."""
    from ...serve.batching import Request
    from ...serve.block_manager import pool_blocks
    from ...serve.paged_kv import PagedKVPool
    from ...serve.scheduler import ContinuousScheduler

    blocks = pool_blocks([len(system) + max(map(len, questions)) + 8] * 2, block_size)
    miss, hit = [], []
    for question in questions:
        sched = ContinuousScheduler(model, PagedKVPool.for_model(model, blocks, block_size), 1, prefix_cache=True)
        first = sched.run([Request(system + question, 1)])[0]  # cold: the whole prompt is prefilled
        again = sched.run([Request(system + question[::-1], 1, arrival_s=sched.now)])[0]  # warm: the system prompt
        miss.append(first.ttft_s)
        hit.append(again.ttft_s)
    return {"system_tokens": len(system), "question_tokens": len(questions[0]), "ttft_miss_s": statistics.median(miss),
            "ttft_hit_s": statistics.median(hit), "speedup": statistics.median(miss) / statistics.median(hit)}


def _flattened_against_padded(model, requests, max_batch: int, budget: int, max_len: int, block_size: int) -> dict:
    """Output tokens per second of the continuous engine padded and flattened on `requests` (all waiting at time 0),
    each the faster of two runs taken in turns; raises CourseError when they give different tokens."""
    from ...errors import CourseError
    from ...serve.batching import Request
    from ...serve.block_manager import pool_blocks
    from ...serve.paged_kv import PagedKVPool
    from ...serve.scheduler import ContinuousScheduler

    waiting = [Request(r.prompt, r.max_new_tokens, 0.0, r.eos_token_id) for r in requests]
    seconds, outputs = {"padded": [], "flattened": []}, {}
    for _ in range(2):
        for name in seconds:
            pool = PagedKVPool.for_model(model, pool_blocks([max_len] * max_batch, block_size), block_size)
            engine = ContinuousScheduler(model, pool, max_batch, budget, flatten=name == "flattened")
            outputs[name] = [r.output for r in engine.run(waiting)]
            seconds[name].append(engine.now)
    if outputs["padded"] != outputs["flattened"]:
        raise CourseError("The flattened engine gave other tokens than the padded one on the same requests.")
    tokens = sum(map(len, outputs["padded"]))
    rates = {f"{name}_tokens_per_s": tokens / min(s) for name, s in seconds.items()}
    return {"requests": len(waiting), "output_tokens": tokens, **rates, "same_tokens": True,
            "ratio": rates["flattened_tokens_per_s"] / rates["padded_tokens_per_s"]}


def run(device: str = "auto", model_size: str = "default", quick: bool = False, dtype: str = "fp32",
        log=lambda message: None) -> dict:
    """Run every measurement and return the figures as a dict (what --json prints)."""
    from ...device import pick_device, timed
    from ...serve.load import SWEEP, engines, goodput_rate, load_sweep, service_rate
    from ...measure.timing import decode_tokens_per_s
    from ...serve.metrics import (poisson_trace, serving_metrics, sharegpt_like_lengths, simulate_utilisation,
                                  transformers_generate_batch)
    from ...serve.block_manager import pool_blocks
    from ...serve.paged_kv import PagedKVPool
    from ...serve.scheduler import ContinuousScheduler

    dev = pick_device(device)
    torch_dtype = dtype_named(dtype)
    sizes = _sizes(dev, quick)
    log(f"loading the {model_size} model on {dev.type} in {dtype} ...")
    hf, model, _ = load_bench_model(model_size, dev, torch_dtype)
    vocab, block_size = model.cfg.vocab_size, 16
    result = {"device": dev.type, "dtype": dtype, "model": model_size, "threads": torch.get_num_threads(),
              "quick": quick, "aims": AIMS}

    # 1. capacity first, then static against continuous batching on one seeded trace at a stated fraction of it
    mix = poisson_trace(sizes["n"], 1.0, sizes["prompts"], sizes["outputs"], seed=8, vocab_size=vocab)
    most = max(len(r.prompt) + r.max_new_tokens for r in mix)
    servers = engines(model, sizes["batch"], most, max_batched_tokens=sizes["budget"], block_size=block_size)
    log(f"capacity: {len(mix)} requests waiting at once, static then continuous (batch {sizes['batch']}) ...")
    capacity = {name: service_rate(serve, mix) for name, serve in servers.items()}
    step_s = 1 / decode_tokens_per_s(model, 1, max(sizes["prompts"]))  # this machine's batch-1 decode step
    targets = {"ttft_target_s": 50 * step_s, "tpot_target_s": 4 * step_s}
    rate = LOAD * capacity["continuous"]
    trace = poisson_trace(sizes["n"], rate, sizes["prompts"], sizes["outputs"], seed=8, vocab_size=vocab)
    log(f"serving {len(trace)} requests at {LOAD}x capacity, static then continuous batching ...")
    static, cont = servers["static"](trace), servers["continuous"](trace)
    s, c = serving_metrics(static, **targets), serving_metrics(cont, **targets)
    result["capacity_req_s"] = capacity
    result["trace"] = {"requests": len(trace), "rate_per_s": rate, "load": LOAD, "max_batch": sizes["batch"],
                       "max_batched_tokens": sizes["budget"], **targets,
                       "same_tokens": all(a.output == b.output for a, b in zip(static, cont))}
    result["static"], result["continuous"] = s, c
    mean_tokens = sum(r.max_new_tokens for r in mix) / len(mix)
    result["continuous_over_static_throughput"] = capacity["continuous"] / capacity["static"]  # saturated, same tokens
    result["capacity_tokens_per_s"] = {k: v * mean_tokens for k, v in capacity.items()}
    log(f"  static {s['throughput_tok_s']:.1f} tokens/s, continuous {c['throughput_tok_s']:.1f} tokens/s")
    log("latency against load: the same requests at 0.3x to 1.2x capacity ...")
    sweep = load_sweep(servers, capacity["continuous"], sizes["n"], sizes["prompts"], sizes["outputs"],
                       fractions=SWEEP if not quick else (0.3, 0.7, 1.2), ttft_slo_s=targets["ttft_target_s"],
                       tpot_slo_s=targets["tpot_target_s"], short_tokens=min(sizes["outputs"]), seed=8,
                       vocab_size=vocab)
    result["load_sweep"] = [{k: v for k, v in row.items() if k != "outputs"} for row in sweep]
    result["goodput_distserve_req_s"] = {name: goodput_rate(sweep, name) for name in servers}

    # 2. KV memory: reserve the maximum length, or hand out blocks as the sequences grow
    lengths = sharegpt_like_lengths(1000, seed=0, max_len=2048)  # ShareGPT's published means, log-normal parts
    result["kv_utilisation"] = {**simulate_utilisation(lengths, max_len=2048, block_size=block_size),
                                "requests": 1000, "max_len": 2048, "block_size": block_size}

    # 3. prefix caching: a long shared system prompt, cold against warm
    log("prefix caching: TTFT with the system prompt cold and warm ...")
    rng = np.random.default_rng(1)
    system = rng.integers(3, vocab, sizes["system"]).tolist()
    questions = [rng.integers(3, vocab, sizes["question"]).tolist() for _ in range(sizes["hits"])]
    result["prefix_cache"] = _prefix_ratio(model, system, questions, block_size)

    # 4. against transformers' continuous batching, every request at once: ours padded and flattened, in turns
    log("our continuous batching, padded and flattened, against transformers' generate_batch ...")
    together = [r.fresh() for r in trace[:sizes["cb_requests"]]]
    for r in together:
        r.arrival_s, r.max_new_tokens = 0.0, sizes["cb_tokens"]
    blocks = pool_blocks([most + sizes["cb_tokens"]] * len(together), block_size, spare=8)
    ours_s, ours, theirs_s = {"padded": [], "flattened": []}, {}, []
    for _ in range(2):
        for name in ours_s:  # the wall clock around the whole run (the scheduler's own work too), as theirs is
            seconds, served = timed(lambda name=name: ContinuousScheduler(
                model, PagedKVPool.for_model(model, blocks, block_size), len(together), sizes["budget"],
                flatten=name == "flattened").run(together), dev)
            ours[name] = [r.output for r in served]
            ours_s[name].append(seconds)
        seconds, theirs = transformers_generate_batch(hf, [r.prompt for r in together], sizes["cb_tokens"], block_size)
        theirs_s.append(seconds)
    tokens = sum(map(len, ours["padded"]))
    result["vs_generate_batch"] = {"requests": len(together), "new_tokens": sizes["cb_tokens"],
                                   "ours_tokens_per_s": tokens / min(ours_s["padded"]),
                                   "flattened_tokens_per_s": tokens / min(ours_s["flattened"]),
                                   "theirs_tokens_per_s": tokens / min(theirs_s),
                                   "ratio": min(theirs_s) / min(ours_s["padded"]),
                                   "flattened_ratio": min(theirs_s) / min(ours_s["flattened"]),
                                   "same_tokens": ours["padded"] == ours["flattened"] == theirs}

    # 5. one flattened call per iteration against the padded decode and prompt-chunk calls
    log("continuous batching padded against flattened, every request waiting at once ...")
    result["flattened"] = _flattened_against_padded(model, trace, sizes["batch"], sizes["budget"], most, block_size)
    return result


def format_table(r: dict) -> str:
    s, c, t = r["static"], r["continuous"], r["trace"]
    lines = [f"serving on {r['device']} ({r['dtype']}, {r['threads']} threads), model {r['model']}"
             + (" [quick]" if r["quick"] else ""),
             f"capacity (all waiting at once): static {r['capacity_req_s']['static']:.2f} req/s, continuous "
             f"{r['capacity_req_s']['continuous']:.2f} req/s",
             f"trace: {t['requests']} requests, Poisson {t['rate_per_s']:.2f}/s ({t['load']:g}x capacity), batch "
             f"{t['max_batch']}, "
             f"max batched tokens {t['max_batched_tokens']}; same greedy tokens: {t['same_tokens']}",
             f"{'':<12}{'tokens/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT p50':>10}{'TPOT p99':>10}{'req goodput':>13}"]
    for name, m in (("static", s), ("continuous", c)):
        lines.append(f"{name:<12}{m['throughput_tok_s']:>10.1f}{m['ttft_p50_s'] * 1e3:>8.0f}ms"
                     f"{m['ttft_p99_s'] * 1e3:>8.0f}ms{m['tpot_p50_s'] * 1e3:>8.1f}ms{m['tpot_p99_s'] * 1e3:>8.1f}ms"
                     f"{m['request_goodput_req_s']:>11.2f}/s")
    a = r["aims"]
    lines.append(f"{'load':>5} {'engine':<11}{'TTFT p50':>9}{'p99':>8}{'TPOT p50':>9}{'p99':>8}{'ITL p99':>8}"
                 f"{'E2E p99':>8}{'met both':>9}")
    for row in r["load_sweep"]:
        lines.append(f"{row['fraction']:>4}x {row['server']:<11}{row['ttft_p50_s'] * 1e3:>7.0f}ms"
                     f"{row['ttft_p99_s'] * 1e3:>6.0f}ms{row['tpot_p50_s'] * 1e3:>7.1f}ms"
                     f"{row['tpot_p99_s'] * 1e3:>6.1f}ms"
                     f"{row['itl_p99_s'] * 1e3:>6.0f}ms{row['e2e_p99_s'] * 1e3:>6.0f}ms{row['attainment']:>9.0%}")
    lines.append("goodput (DistServe: highest rate with >= 90% meeting both objectives): "
                 + ", ".join(f"{k} {v:.2f} req/s" for k, v in r["goodput_distserve_req_s"].items()))
    lines.append("continuous / static capacity (all waiting, same tokens): "
                 f"{r['continuous_over_static_throughput']:.2f}x "
                 f"(aim >= {a['continuous_over_static_throughput']:g}x); goodput targets TTFT <= "
                 f"{t['ttft_target_s'] * 1e3:.0f} ms, TPOT <= {t['tpot_target_s'] * 1e3:.0f} ms")
    kv = r["kv_utilisation"]
    lines.append(f"KV utilisation, {kv['requests']} requests: reserve-max-length {kv['reserve_max_utilisation']:.1%}, "
                 f"paged (blocks of {kv['block_size']}) {kv['paged_utilisation']:.1%} "
                 f"(aim >= {a['paged_utilisation']:.0%})")
    p = r["prefix_cache"]
    lines.append(f"prefix cache, {p['system_tokens']}-token system prompt: TTFT {p['ttft_miss_s'] * 1e3:.0f} ms cold, "
                 f"{p['ttft_hit_s'] * 1e3:.0f} ms cached: {p['speedup']:.1f}x "
                 f"(aim >= {a['prefix_hit_ttft_speedup']:g}x)")
    g = r["vs_generate_batch"]
    lines.append(f"ours vs transformers generate_batch, {g['requests']} requests x {g['new_tokens']} tokens: padded "
                 f"{g['ours_tokens_per_s']:.1f}, flattened {g['flattened_tokens_per_s']:.1f} vs "
                 f"{g['theirs_tokens_per_s']:.1f} tokens/s ({g['ratio']:.2f}x, aim >= {a['ours_over_generate_batch']:g}x; "
                 f"{g['flattened_ratio']:.2f}x, aim >= {a['flattened_over_generate_batch']:g}x); "
                 f"same tokens: {g['same_tokens']}")
    f = r["flattened"]
    lines.append(f"continuous, {f['requests']} requests all waiting: padded {f['padded_tokens_per_s']:.1f} vs "
                 f"flattened {f['flattened_tokens_per_s']:.1f} tokens/s ({f['ratio']:.2f}x); "
                 f"same tokens: {f['same_tokens']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser("serving", __doc__, ["default", "360m", "1b", "tiny"],
               "the default model, or a Llama of that shape with random weights")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="number format (fp32: the same greedy tokens everywhere)")
    args = p.parse_args(argv)
    set_threads(args.threads, args.device)
    return report(run(args.device, args.model_size, args.quick, args.dtype, progress(args.json)), args.json,
                  format_table)
