"""`python -m llm_anatomy parallel --tp 3 [--pp 2] [--json]`: tensor and pipeline parallelism, on this machine.

    python -m llm_anatomy parallel --tp 3           # TP = 3 ranks (gloo on the CPU; NCCL with a GPU per rank)
    python -m llm_anatomy parallel --tp 3 --pp 2    # and a 2-stage pipeline
    python -m llm_anatomy parallel --json --quick   # one JSON object; fewer tokens, sizes and repeats

Figures, on the default model in fp32:
- TP: the largest logit difference from one process (over the logits' scale), whether the greedy tokens are identical,
  the collectives of one forward pass, each rank's weight and KV-cache bytes against the whole;
- the all-reduce of this group: latency and bandwidth fitted from a sweep of message sizes, with the spread of repeats;
- decode steps of one rank alone (one thread, and all cores) and of the TP group, interleaved; the predicted TP step
  (compute / TP, in turns where ranks share cores, + each collective's latency and bytes) and the prediction's error;
- with --pp: bit-identical logits from the pipeline, and the bubble for 1, 2 and 4 micro-batches against
  (p - 1) / (m + p - 1).
A TP size that does not divide the model's heads is refused before any rank starts.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from ...errors import CourseError
from . import progress, report

PROMPT = "The capital of France is Paris. The capital of Italy is"


def run(tp: int = 3, pp: int = 0, quick: bool = False, timeout_s: float = 60.0, log=lambda message: None) -> dict:
    """Every measurement, as a dict (what --json prints). Seconds, bytes, bytes per second."""
    from ...distributed import collectives as coll
    from ...device import torch_threads
    from ...distributed.launch import pick_backend, run_ranks
    from ...distributed.pipeline import bubble_fraction, check_stages, measured_bubble
    from ...distributed.runs import cost_run, pipeline_run, tp_run
    from ...distributed.tensor_parallel import check_tp_size, weight_bytes
    from ...generate.decode import generate_greedy
    from ...model.scratch import ScratchConfig
    from ...weights.cache import fetch_default_model
    from . import load_bench_model

    folder = str(fetch_default_model())
    from transformers import AutoConfig

    cfg = ScratchConfig.from_hf(AutoConfig.from_pretrained(folder))
    check_tp_size(cfg, tp)  # before any rank starts, and before any forward pass
    if pp:
        check_stages(cfg, pp)
    backend, device = pick_backend(tp)
    # --quick: the sizes of tests/distributed/test_runs.py's runs, so that a test session spawns each of them once
    new_tokens, repeats, steps, sizes = (8, 3, 3, [4, 2304, 262_144]) if quick else (48, 15, 20, coll.SWEEP_BYTES)
    log("loading the model for the one-process reference ...")
    _, plain, tokenizer = load_bench_model("default", "cpu", torch.float32)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids  # [1, seq]
    with torch_threads(1):  # the ranks' thread count: the same roundings
        ref_logits = plain(ids)
        ref_tokens = generate_greedy(plain, ids, new_tokens).tokens
    result = {"tp": tp, "pp": pp, "backend": backend, "device": device, "quick": quick,
              "prompt_tokens": ids.shape[1], "new_tokens": new_tokens}

    log(f"TP = {tp}: {tp} ranks on {backend} ...")
    ranks = run_ranks(tp_run, tp, cfg, folder, ids, new_tokens, timeout_s=timeout_s)
    diff = (ranks[0]["logits"] - ref_logits).abs().max().item()
    kv_whole = plain.new_cache(1, ids.shape[1] + new_tokens).allocated_bytes()
    sites = [site for _, site, _ in ranks[0]["forward_calls"]]
    result["tensor_parallel"] = {
        "max_logit_difference": diff, "logit_scale": ref_logits.abs().max().item(),
        "relative_difference": diff / ref_logits.abs().max().item(),
        "same_tokens": all(torch.equal(r["tokens"], ref_tokens) for r in ranks),
        "collectives_per_forward": {s: sites.count(s) for s in dict.fromkeys(sites)},
        "bytes_per_all_reduce": sorted({b for op, _, b in ranks[0]["forward_calls"] if op == "all_reduce"}),
        "weight_bytes_per_rank": [r["weight_bytes"] for r in ranks], "weight_bytes_whole": weight_bytes(plain),
        "kv_bytes_per_rank": [r["kv_bytes"] for r in ranks], "kv_bytes_whole": kv_whole}

    log("the all-reduce sweep and the decode steps ...")
    cost = run_ranks(cost_run, tp, cfg, folder, sizes, repeats, steps, timeout_s=timeout_s)[0]
    link = coll.fit_link(cost["sweep"])
    alone, group = statistics.median(cost["alone_s"]), statistics.median(cost["tp_s"])
    result["cores"] = cost["cores"]  # the cores rank 0 found free for its steps (the course's thread policy)
    predicted = coll.predict_tp_step(alone, tp, coll.tp_step_collectives(cfg, tp), link,
                                     cores=cost["cores"] if device == "cpu" else None)
    result["all_reduce"] = {"latency_s": link.latency_s, "bytes_per_s": link.bytes_per_s,
                            "half_bandwidth_bytes": link.half_bytes,
                            "median_s": {str(n): statistics.median(t) for n, t in cost["sweep"].items()},
                            "spread": {str(n): coll.spread(t) for n, t in cost["sweep"].items()}}
    result["decode_step"] = {
        "tp1_s": alone, "tp1_all_cores_s": statistics.median(cost["alone_all_cores_s"]), f"tp{tp}_s": group,
        "spread_tp1": coll.spread(cost["alone_s"]), f"spread_tp{tp}": coll.spread(cost["tp_s"]),
        "inside_collectives_s": statistics.median(cost["inside_s"]), "predicted_s": predicted["total_s"],
        "predicted": predicted, "prediction_error": (group - predicted["total_s"]) / group}

    if pp:
        log(f"a pipeline of {pp} stages ...")
        g = torch.Generator().manual_seed(0)
        batch = torch.randint(3, cfg.vocab_size, (4, 12 if quick else 16), generator=g)  # [4, seq]
        with torch_threads(1):
            ref = plain(batch)
        stages = run_ranks(pipeline_run, pp, cfg, folder, batch, [1, 2, 4], 2 if quick else 3, timeout_s=timeout_s)
        bubbles = {m: [measured_bubble([s["runs"][m][k] for s in stages]) for k in range(len(stages[0]["runs"][m]))]
                   for m in (1, 2, 4)}
        result["pipeline"] = {"stages": pp, "identical_logits": bool(torch.equal(stages[-1]["logits"], ref)),
                              "bubble": {str(m): statistics.median(b) for m, b in bubbles.items()},
                              "bubble_formula": {str(m): bubble_fraction(pp, m) for m in (1, 2, 4)}}
    return result


def format_table(r: dict) -> str:
    t, a, d = r["tensor_parallel"], r["all_reduce"], r["decode_step"]
    tp = r["tp"]
    lines = [f"TP = {tp} on {r['backend']} ({r['device']}, {r['cores']} cores)",
             f"  logits vs one process   max |diff| {t['max_logit_difference']:.2e} ({t['relative_difference']:.1e} of "
             f"the scale); {r['new_tokens']} greedy tokens identical: {t['same_tokens']}",
             f"  collectives per forward {t['collectives_per_forward']}, {t['bytes_per_all_reduce']} bytes each",
             f"  weights per rank        {t['weight_bytes_per_rank'][0] / 1e6:.1f} MB of {t['weight_bytes_whole'] / 1e6:.1f}",
             f"  KV cache per rank       {t['kv_bytes_per_rank'][0]:,} of {t['kv_bytes_whole']:,} bytes",
             f"all-reduce                {a['latency_s'] * 1e3:.3f} ms + bytes / {a['bytes_per_s'] / 1e9:.2f} GB/s "
             f"(latency-bound below {a['half_bandwidth_bytes']:,.0f} bytes)",
             f"decode step               TP = 1 (one thread) {d['tp1_s'] * 1e3:.1f} ms, all cores "
             f"{d['tp1_all_cores_s'] * 1e3:.1f} ms; TP = {tp} {d[f'tp{tp}_s'] * 1e3:.1f} ms, "
             f"{d['inside_collectives_s'] * 1e3:.1f} ms of it inside collectives",
             f"  predicted TP = {tp}       {d['predicted_s'] * 1e3:.1f} ms (compute {d['predicted']['compute_s'] * 1e3:.1f}, "
             f"latency {d['predicted']['latency_s'] * 1e3:.1f}, bytes {d['predicted']['bytes_s'] * 1e3:.2f}); "
             f"error {d['prediction_error']:+.0%}"]
    if max(d["spread_tp1"], d[f"spread_tp{tp}"]) > 0.5:
        lines.append("  (the repeats spread widely: the machine was busy; run again when it is idle)")
    if "pipeline" in r:
        p = r["pipeline"]
        lines.append(f"pipeline of {p['stages']} stages  identical logits: {p['identical_logits']}; bubble "
                     + ", ".join(f"m={m}: {p['bubble'][m]:.0%} (formula {p['bubble_formula'][m]:.0%})"
                                 for m in p["bubble"]))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m llm_anatomy parallel", description=__doc__.split("\n")[0])
    p.add_argument("--tp", type=int, default=3, help="tensor-parallel ranks (must divide the heads: 1 or 3 here)")
    p.add_argument("--pp", type=int, default=0, help="pipeline stages to run too (0: none)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--quick", action="store_true", help="fewer tokens, message sizes and repeats (CI)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a rank waits for the others (default 60)")
    args = p.parse_args(argv)
    if args.pp < 0:
        raise CourseError(f"--pp must be 0 (no pipeline) or a number of stages, not {args.pp}.")
    return report(run(args.tp, args.pp, args.quick, args.timeout, progress(args.json)), args.json, format_table)
