"""`python -m llm_anatomy bench` (topic "decode", the default): prefill and decode, measured here.

    python -m llm_anatomy bench                       # the default model, on the best device
    python -m llm_anatomy bench --json                # one JSON object instead of the table
    python -m llm_anatomy bench --quick               # CI-sized: a few seconds
    python -m llm_anatomy bench --model-size 1b       # a 1B-shaped Llama with random weights (GPU)

Figures: the machine's measured peaks; from-scratch decoding against transformers' `generate` on
the same prompt and length; decoding with and without the KV cache; prefill tokens/s at several
prompt lengths; decode tokens/s at several batch sizes; the fraction of the memory-bandwidth limit
that decode reaches. On a CUDA GPU it also captures the from-scratch decode step in a CUDA graph,
which removes the per-kernel launch cost of Python and PyTorch, and shows it beside the eager figure.
Random weights are honest for timing: speed does not depend on the weight values.
"""

from __future__ import annotations

import sys

import torch

from ...generate.decode import StaticDecoder, generate_greedy, prefill
from ...device import default_dtype, pick_device, synchronize, timed
from ...measure.peaks import measure_peaks
from ...measure.roofline import forward_work
from ...measure.timing import time_generation, time_interleaved, time_it
from . import load_bench_model, parser, progress, report, set_threads

TARGETS = {  # what the course aims for; printed beside the figures, never asserted
    "scratch_vs_transformers": 1.0,
    "kv_cache_speedup_256": 5.0,
    "decode_bandwidth_fraction_cpu": 0.6,
    "decode_bandwidth_fraction_gpu": 0.5,
}


def _sizes(device: torch.device, quick: bool, model_size: str) -> dict:
    gpu = device.type == "cuda"
    if model_size == "tiny" or quick:
        return dict(gen_tokens=8, nocache_tokens=32, prefill=[16, 64], batches=[1, 4], decode_steps=4, repeats=1,
                    prompt=24)
    if gpu:
        return dict(gen_tokens=128, nocache_tokens=256, prefill=[128, 512, 2048, 4096], batches=[1, 8, 32, 128],
                    decode_steps=16, repeats=3, prompt=32)
    return dict(gen_tokens=32, nocache_tokens=256, prefill=[32, 128, 512], batches=[1, 4, 16], decode_steps=8,
                repeats=2, prompt=32)


def _prompt(tokenizer, size: str, length: int, vocab: int, device) -> torch.Tensor:
    if tokenizer is not None:
        from ...generate.chat import chat_prompt_ids

        ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": "Explain what a KV cache is."}])
        return ids.to(device)  # the whole chat prompt (38 tokens), so that greedy answers make sense
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, vocab, (1, length), generator=g).to(device)


def run(device: str = "auto", model_size: str = "default", quick: bool = False, graphs: bool = True,
        log=lambda message: None) -> dict:
    """Run every measurement and return the figures as a dict (what --json prints)."""
    from ...model.scratch import ScratchLlama

    dev = pick_device(device)
    dtype = default_dtype(dev)  # fp32 on the CPU; bf16 where the GPU has it natively, else fp16
    sizes = _sizes(dev, quick, model_size)
    log(f"loading the {model_size} model on {dev.type} ...")
    hf, model, tokenizer = load_bench_model(model_size, dev, dtype)
    cfg = model.cfg
    elem = torch.tensor([], dtype=dtype).element_size()
    params = sum(p.numel() for p in hf.parameters())
    result = {"device": dev.type, "dtype": str(dtype).removeprefix("torch."), "model": model_size,
              "parameters": params, "threads": torch.get_num_threads(), "quick": quick}

    log("measuring the machine's peaks ...")
    peaks = measure_peaks(dev, dtype, quick=quick)
    log(f"  {peaks.flops_per_s / 1e9:.1f} GFLOP/s, {peaks.bytes_per_s / 1e9:.1f} GB/s")
    result["device_name"] = peaks.device
    result["peaks"] = {"matmul_flops_per_s": peaks.flops_per_s, "bandwidth_bytes_per_s": peaks.bytes_per_s,
                       "how": peaks.how,
                       "published_flops_per_s": peaks.published[0] if peaks.published else None,
                       "published_bytes_per_s": peaks.published[1] if peaks.published else None}

    prompt = _prompt(tokenizer, model_size, sizes["prompt"], cfg.vocab_size, dev)
    p_len, reps = prompt.shape[1], sizes["repeats"]

    # 1. from scratch against transformers' generate, same prompt, same number of new tokens
    n = sizes["gen_tokens"]
    log(f"from-scratch decoding against transformers generate, {n} new tokens ...")

    import copy

    settings = copy.deepcopy(hf.generation_config)  # greedy, exactly n tokens: no end-of-text stop
    settings.eos_token_id, settings.do_sample, settings.max_new_tokens, settings.pad_token_id = None, False, n, 0
    settings.temperature = settings.top_p = settings.top_k = None

    def hf_generate():
        with torch.inference_mode():
            return hf.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=settings)[:, p_len:]

    ours_tokens = generate_greedy(model, prompt, n).tokens  # the warm-up runs give the tokens to compare
    theirs_tokens = hf_generate()
    timings = time_interleaved({"ours": lambda: generate_greedy(model, prompt, n), "theirs": hf_generate}, dev,
                               warmup=0, repeats=reps)  # in turns: a busy moment slows both alike
    ours, theirs = timings["ours"], timings["theirs"]
    result["generate"] = {"prompt_tokens": p_len, "new_tokens": n,
                          "scratch_tokens_per_s": n / ours.median_s,
                          "transformers_tokens_per_s": n / theirs.median_s,
                          "ratio": theirs.median_s / ours.median_s,
                          "same_tokens": bool(torch.equal(ours_tokens.cpu(), theirs_tokens.cpu())),
                          "spread": {"scratch": ours.spread, "transformers": theirs.spread}}
    log(f"  scratch {n / ours.median_s:.1f} tokens/s, transformers {n / theirs.median_s:.1f} tokens/s")

    # 2. with and without the KV cache (one run each: the run without the cache is the slow one)
    n = sizes["nocache_tokens"]
    log(f"decoding {n} tokens with and without the KV cache ...")
    short = prompt[:, :8]
    t_with, cached = timed(lambda: generate_greedy(model, short, n), dev)
    t_without, uncached = timed(lambda: generate_greedy(model, short, n, use_cache=False), dev)
    result["kv_cache"] = {"prompt_tokens": short.shape[1], "new_tokens": n,
                          "with_cache_tokens_per_s": n / t_with,
                          "without_cache_tokens_per_s": n / t_without,
                          "speedup": t_without / t_with,
                          "same_tokens": bool(torch.equal(cached.tokens, uncached.tokens)),
                          # in 16-bit numbers the two runs add in another order: a near-tie can flip (fp32 is exact)
                          "first_divergence": _first_divergence(cached.tokens, uncached.tokens)}
    log(f"  with the cache {n / t_with:.1f} tokens/s, without {n / t_without:.1f} tokens/s")

    # 3. prefill at several prompt lengths, through the plain attention and through SDPA (timed in turns)
    log("prefill at several prompt lengths, plain attention and SDPA ...")
    result["prefill"] = []
    fused = ScratchLlama.from_hf(hf, attention="sdpa")  # the same weights, torch's fused attention kernel
    for length in sizes["prefill"]:
        length = min(length, cfg.max_position_embeddings)
        ids = torch.randint(3, cfg.vocab_size, (1, length), generator=torch.Generator().manual_seed(length)).to(dev)
        cache = model.new_cache(1, length)

        def run_prefill(ids=ids, cache=cache, path=model):
            cache.reset()
            prefill(path, ids, cache)  # logits for the last position only, as in generation

        both = {"naive": run_prefill, "sdpa": lambda ids=ids, cache=cache: run_prefill(ids, cache, fused)}
        times = time_interleaved(both, dev, warmup=1, repeats=reps)
        t, t_sdpa = times["naive"], times["sdpa"]
        # the plain attention computes and writes out the whole score matrix, so it counts as FLOPs and bytes moved;
        # SDPA's causal kernel keeps no scores; every op's reads and writes are counted (most of a long prefill's bytes)
        work = forward_work(cfg, length, 0, 1, elem, materialized_scores=True, activations=True)
        fused_work = forward_work(cfg, length, 0, 1, elem, activations=True)
        result["prefill"].append({"prompt_tokens": length, "seconds": t.median_s, "tokens_per_s": length / t.median_s,
                                  "flops_per_s": work.flops / t.median_s, "intensity": work.intensity,
                                  "naive_flops_per_s": work.flops / t.median_s,
                                  "sdpa_seconds": t_sdpa.median_s, "sdpa_tokens_per_s": length / t_sdpa.median_s,
                                  "sdpa_flops_per_s": fused_work.flops / t_sdpa.median_s,
                                  "sdpa_intensity": fused_work.intensity})
        log(f"  prefill {length} tokens: {length / t.median_s:.0f} tokens/s plain, {length / t_sdpa.median_s:.0f} SDPA")
    del fused

    # 4. decode at several batch sizes (time per output token after a prefill of the prompt)
    log("decode at several batch sizes ...")
    result["decode_batch"] = []
    steps = sizes["decode_steps"]
    for batch in sizes["batches"]:
        ids = prompt.expand(batch, -1).contiguous()
        tpot = time_generation(model, ids, steps + 1, warmup=False).tpot_s  # the median decode step
        work = forward_work(cfg, 1, p_len + steps // 2, batch, elem, materialized_scores=True)
        result["decode_batch"].append({"batch": batch, "tpot_s": tpot, "tokens_per_s": batch / tpot,
                                       "flops_per_s": work.flops / tpot, "intensity": work.intensity})
        log(f"  decode batch {batch}: {batch / tpot:.1f} tokens/s")

    # 5. how close decode comes to the bandwidth limit (batch 1, the cached run of step 2)
    kv = result["kv_cache"]
    per_token = forward_work(cfg, 1, short.shape[1] + kv["new_tokens"] // 2, 1, elem, materialized_scores=True).bytes
    speed = kv["with_cache_tokens_per_s"]
    result["bandwidth_use"] = {"bytes_per_token": per_token, "tokens_per_s": speed,
                               "attained_bytes_per_s": per_token * speed,
                               "fraction": per_token * speed / peaks.bytes_per_s}

    # 6. on a CUDA GPU: the same decode step replayed from a CUDA graph
    if dev.type == "cuda" and graphs:
        log("capturing the decode step in a CUDA graph ...")
        try:
            n = sizes["nocache_tokens"]
            decoder = StaticDecoder(model, 1, short.shape[1] + n)
            eager_tokens = decoder.generate(short, n)
            decoder.prefill(short)
            decoder.capture()
            graph_tokens = decoder.generate(short, n)

            def replay():
                decoder.prefill(short)
                for _ in range(n - 1):
                    decoder.step()

            t = time_it(replay, dev, warmup=1, repeats=reps)
            synchronize(dev)
            speed = n / t.median_s
            result["cuda_graph"] = {"tokens_per_s": speed, "eager_tokens_per_s": kv["with_cache_tokens_per_s"],
                                    "fraction": per_token * speed / peaks.bytes_per_s,
                                    "same_tokens_as_static_eager": bool(torch.equal(eager_tokens, graph_tokens))}
        except Exception as err:  # report, do not hide the other figures
            result["cuda_graph"] = {"error": f"{type(err).__name__}: {err}"}

    result["targets"] = _targets(result)
    return result


def _first_divergence(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The index of the first new token where two greedy runs `[batch, n]` differ, or None when they agree."""
    differ = (a != b).any(dim=0).nonzero()
    return int(differ[0]) if len(differ) else None


def _targets(r: dict) -> dict:
    gpu = r["device"] == "cuda"
    fraction = r["bandwidth_use"]["fraction"]
    if gpu and "fraction" in r.get("cuda_graph", {}):
        fraction = max(fraction, r["cuda_graph"]["fraction"])
    rows = {
        "scratch_vs_transformers": (r["generate"]["ratio"], TARGETS["scratch_vs_transformers"]),
        "kv_cache_speedup": (r["kv_cache"]["speedup"], TARGETS["kv_cache_speedup_256"]),
        "decode_bandwidth_fraction": (fraction, TARGETS["decode_bandwidth_fraction_gpu" if gpu
                                                        else "decode_bandwidth_fraction_cpu"]),
    }
    return {k: {"value": v, "target": t, "met": bool(v >= t)} for k, (v, t) in rows.items()}


def format_table(r: dict) -> str:
    """The figures as readable text."""
    p, g, kv, bw = r["peaks"], r["generate"], r["kv_cache"], r["bandwidth_use"]
    lines = [f"Decode benchmark: {r['model']} model ({r['parameters'] / 1e6:.0f} M parameters), {r['dtype']}, "
             f"on {r['device_name']}" + (" [quick]" if r["quick"] else ""),
             "",
             f"measured matmul peak        {p['matmul_flops_per_s'] / 1e12:10.3f} TFLOP/s",
             f"measured read bandwidth     {p['bandwidth_bytes_per_s'] / 1e9:10.1f} GB/s   ({p['how']})"]
    if p["published_flops_per_s"]:
        lines.append(f"data sheet (this GPU)       {p['published_flops_per_s'] / 1e12:10.0f} TFLOP/s, "
                     f"{p['published_bytes_per_s'] / 1e9:.0f} GB/s")
    lines += ["",
              f"generation, prompt {g['prompt_tokens']} tokens, {g['new_tokens']} new (greedy, end to end):",
              f"  from scratch              {g['scratch_tokens_per_s']:10.1f} tokens/s",
              f"  transformers generate     {g['transformers_tokens_per_s']:10.1f} tokens/s",
              f"  ratio (scratch / theirs)  {g['ratio']:10.2f} x    same tokens: {g['same_tokens']}",
              "",
              f"KV cache, {kv['new_tokens']} new tokens after {kv['prompt_tokens']}:",
              f"  with the cache            {kv['with_cache_tokens_per_s']:10.1f} tokens/s",
              f"  without (recompute all)   {kv['without_cache_tokens_per_s']:10.1f} tokens/s",
              f"  speedup                   {kv['speedup']:10.1f} x    same tokens: {kv['same_tokens']}"
              + ("" if kv.get("first_divergence") is None else
                 f" (first divergence at new token {kv['first_divergence']}: {r['dtype']} is not bit-exact; "
                 "fp32 is)"),
              "",
              "prefill:   prompt tokens   tokens/s    GFLOP/s   FLOP/byte   (plain attention | SDPA)"]
    for row in r["prefill"]:
        lines.append(f"           {row['prompt_tokens']:13d} {row['tokens_per_s']:10.0f} {row['flops_per_s'] / 1e9:10.1f}"
                     f" {row['intensity']:11.1f}   | {row['sdpa_tokens_per_s']:8.0f} {row['sdpa_flops_per_s'] / 1e9:8.1f}"
                     f" {row['sdpa_intensity']:8.1f}")
    lines.append("decode:    batch    ms/token   tokens/s    GFLOP/s   FLOP/byte")
    for row in r["decode_batch"]:
        lines.append(f"           {row['batch']:5d} {row['tpot_s'] * 1e3:11.2f} {row['tokens_per_s']:10.1f}"
                     f" {row['flops_per_s'] / 1e9:10.1f} {row['intensity']:11.2f}")
    lines += ["",
              f"decode reads {bw['bytes_per_token'] / 1e6:.1f} MB per token (weights + KV cache); at "
              f"{bw['tokens_per_s']:.1f} tokens/s that is {bw['attained_bytes_per_s'] / 1e9:.1f} GB/s = "
              f"{bw['fraction']:.0%} of the measured bandwidth"]
    if "cuda_graph" in r:
        cg = r["cuda_graph"]
        if "error" in cg:
            lines.append(f"CUDA graph decode failed: {cg['error']}")
        else:
            lines.append(f"CUDA graph decode: {cg['tokens_per_s']:.1f} tokens/s (eager {cg['eager_tokens_per_s']:.1f}) = "
                         f"{cg['fraction']:.0%} of the measured bandwidth; the graph removes per-kernel launch cost")
    lines += ["", "targets:"]
    for name, t in r["targets"].items():
        lines.append(f"  {name:<28} {t['value']:8.2f}  (target >= {t['target']})  {'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser("decode", __doc__, ["default", "360m", "1b", "tiny"],
               "default: SmolLM2-135M; 1b: a 1B-shaped random-weight Llama (GPU); tiny: for tests")
    p.add_argument("--no-graphs", action="store_true", help="skip the CUDA graph measurement")
    args = p.parse_args(argv)
    set_threads(args.threads, args.device)
    return report(run(args.device, args.model_size, args.quick, not args.no_graphs, progress(args.json)), args.json,
                  format_table)

if __name__ == "__main__":
    sys.exit(main())
