"""`python -m llm_anatomy bench fast`: the four levers of notebook 09, measured here.

    python -m llm_anatomy bench fast            # the default model, on the best device
    python -m llm_anatomy bench fast --json     # one JSON object instead of the table
    python -m llm_anatomy bench fast --compile  # also torch.compile the decode step (minutes on a small CPU)

Figures: from-scratch decoding (plain, fused projections, fused with weights stored [in, out]) against
transformers' `generate`, with the same greedy tokens; the fraction of the measured read bandwidth that the
fastest decode reaches; prompt-lookup speculative decoding against plain decoding on an editing task (the
answer copies its input), identical tokens; the peak memory of tiled against plain attention at 4,096 tokens;
an int8 weight kernel against fp32; on a GPU, the decode step replayed from a CUDA graph. Timings of the
variants are interleaved, run by run, so that a busy machine slows them all alike; ratios come from one run.
"""

from __future__ import annotations

import copy
import sys

import torch

from ...model.attention import attention
from ...generate.decode import StaticDecoder, generate_greedy
from ...device import default_dtype, pick_device
from ...errors import CourseError
from ...fast.fused import compile_step, fuse
from ...measure.memory import peak_tensor_bytes
from ...measure.peaks import measure_peaks
from ...measure.roofline import forward_work
from ...measure.timing import time_interleaved, time_it
from ...fast.quantize import time_int8_vs_fp32
from ...fast.speculative import PromptLookupDraft, editing_task, speculative_generate
from ...fast.tiled_attention import tiled_attention
from . import parser, progress, report, set_threads

TARGETS = {"fused_vs_transformers": 1.3, "decode_read_bandwidth_fraction": 0.7, "prompt_lookup_speedup": 1.5,
           "tiled_peak_memory_ratio_4096": 0.1}  # the last one is a ceiling: at most a tenth


def _load(dev, dtype, model_size: str):
    from ...model.scratch import ScratchLlama

    if model_size == "default":
        from ...generate.chat import chat_prompt_ids
        from ...weights.load import load_model

        loaded = load_model(device=dev, dtype=dtype, verbose=False)
        hf, tokenizer = loaded.model, loaded.tokenizer
        chat = chat_prompt_ids(tokenizer, [{"role": "user", "content": "Explain what a KV cache is."}]).to(dev)
        editing = chat_prompt_ids(tokenizer, editing_task()).to(dev)
    else:
        from ...weights.random import random_llama

        hf = random_llama(model_size, dev, dtype)
        g = torch.Generator().manual_seed(0)
        chat = torch.randint(3, hf.config.vocab_size, (1, 24), generator=g).to(dev)
        editing = torch.cat([chat, chat[:, :12]], dim=1)  # a prompt that repeats itself
    return hf, ScratchLlama.from_hf(hf), chat, editing


def run(device: str = "auto", model_size: str = "default", quick: bool = False, compile_: bool = False,
        log=lambda message: None) -> dict:
    """Every measurement, as a dict (what --json prints)."""
    dev = pick_device(device)
    dtype = default_dtype(dev)
    gpu, small = dev.type == "cuda", quick or model_size == "tiny"
    reps = 1 if small else 3
    log(f"loading the {model_size} model on {dev.type} ...")
    hf, plain, chat, editing = _load(dev, dtype, model_size)
    fused, fused_in_out = fuse(plain), fuse(plain, "in_out")
    elem = torch.tensor([], dtype=dtype).element_size()
    result = {"device": dev.type, "dtype": str(dtype).removeprefix("torch."), "model": model_size, "quick": quick,
              "threads": torch.get_num_threads()}

    log("measuring the machine's read bandwidth ...")
    peaks = measure_peaks(dev, dtype, quick=small)
    read_bw = (peaks.bandwidth_by_method or {}).get("sum", peaks.bytes_per_s)
    result["device_name"], result["read_bandwidth_bytes_per_s"] = peaks.device, read_bw

    # 1. decode: transformers generate, our plain model, fused, fused [in, out]; the same greedy tokens
    n = 8 if small else (128 if gpu else 32)
    log(f"decoding {n} tokens four ways ...")
    settings = copy.deepcopy(hf.generation_config)
    settings.eos_token_id, settings.do_sample, settings.max_new_tokens, settings.pad_token_id = None, False, n, 0
    settings.temperature = settings.top_p = settings.top_k = None

    def generate():
        with torch.inference_mode():
            return hf.generate(chat, attention_mask=torch.ones_like(chat), generation_config=settings)[:, chat.shape[1]:]

    ways = {"transformers": generate, "plain": lambda: generate_greedy(plain, chat, n).tokens,
            "fused": lambda: generate_greedy(fused, chat, n).tokens,
            "fused_in_out": lambda: generate_greedy(fused_in_out, chat, n).tokens}
    tokens = {name: fn().cpu() for name, fn in ways.items()}
    timings = time_interleaved(ways, dev, warmup=1, repeats=reps)  # in turns: a busy moment slows all alike
    speed = {name: n / t.median_s for name, t in timings.items()}
    best = max(("plain", "fused", "fused_in_out"), key=speed.get)
    result["decode"] = {"new_tokens": n, "prompt_tokens": chat.shape[1],
                        "tokens_per_s": speed, "same_tokens": all(torch.equal(t, tokens["transformers"])
                                                                  for t in tokens.values()),
                        "fastest": best, "fused_vs_transformers": speed[best] / speed["transformers"],
                        "plain_vs_transformers": speed["plain"] / speed["transformers"],
                        "spread": {name: t.spread for name, t in timings.items()}}

    # 2. how close the fastest decode comes to the read bandwidth (weights + KV cache read per token)
    per_token = forward_work(plain.cfg, 1, chat.shape[1] + n // 2, 1, elem).bytes
    result["bandwidth"] = {"bytes_per_token": per_token, "tokens_per_s": speed[best],
                           "fraction_of_read_bandwidth": per_token * speed[best] / read_bw}

    # 3. prompt-lookup speculation on an editing task: plain and speculative decoding of the same model, for each
    #    fused layout (a CPU's matmul library may run a few rows at once much slower in one layout than the other)
    n, k = (8, 4) if small else (96, 8)
    log(f"prompt-lookup speculative decoding, {n} tokens, k = {k} ...")
    result["speculative"] = {"task": "proofread a paragraph (the answer copies its input)", "new_tokens": n,
                             "draft_length": k, "prompt_tokens": editing.shape[1], "by_model": {}}
    for name, model in (("fused", fused), ("fused_in_out", fused_in_out)):
        plain_tokens = generate_greedy(model, editing, n).tokens[0].tolist()
        last = {}

        def speculate(model=model, last=last):
            last["result"] = speculative_generate(model, editing, n, PromptLookupDraft(), k)

        timings = time_interleaved({"plain": lambda model=model: generate_greedy(model, editing, n),
                                    "speculative": speculate}, dev, warmup=1, repeats=reps)
        seconds = {name: t.median_s for name, t in timings.items()}
        spec = last["result"]
        result["speculative"]["by_model"][name] = {
            "same_tokens": spec.tokens == plain_tokens, "acceptance_rate": spec.acceptance_rate,
            "tokens_per_round": spec.tokens_per_round, "plain_tokens_per_s": n / seconds["plain"],
            "speculative_tokens_per_s": n / seconds["speculative"], "speedup": seconds["plain"] / seconds["speculative"]}
    rows = result["speculative"]["by_model"]
    best_spec = max(rows, key=lambda name: rows[name]["speedup"])
    result["speculative"].update(best=best_spec, speedup=rows[best_spec]["speedup"],
                                 same_tokens=all(row["same_tokens"] for row in rows.values()))
    model = {"plain": plain, "fused": fused, "fused_in_out": fused_in_out}[best]

    # 4. tiled attention: peak extra memory of one layer's attention at 4,096 tokens
    length = 512 if small else 4096
    log(f"attention memory at {length} tokens, plain and tiled ...")
    cfg = plain.cfg
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, cfg.num_heads, length, cfg.head_dim, generator=g).to(dev, dtype)
    k_, v_ = (torch.randn(1, cfg.num_kv_heads, length, cfg.head_dim, generator=g).to(dev, dtype) for _ in range(2))
    plain_peak = peak_tensor_bytes(lambda: attention(q, k_, v_), dev)
    tiled_peak = peak_tensor_bytes(lambda: tiled_attention(q, k_, v_, block_q=256, block_k=256), dev)
    diff = (attention(q, k_, v_).float() - tiled_attention(q, k_, v_, block_q=256, block_k=256).float()).abs().max()
    result["tiled_attention"] = {"prompt_tokens": length, "plain_peak_bytes": plain_peak, "tiled_peak_bytes": tiled_peak,
                                 "ratio": tiled_peak / plain_peak, "max_abs_difference": float(diff)}
    del q, k_, v_

    # 5. an int8 weight kernel against fp32, at one token, over as many weights as the model's blocks
    log("the int8 weight kernel against fp32 ...")
    timing, why = time_int8_vs_fp32(1, cfg.hidden_size, cfg.intermediate_size, repeats=3 if small else 10,
                                    layers=2 if small else 3 * cfg.num_layers)
    result["int8_kernel"] = {"available": timing is not None, "why_not": why}
    if timing is not None:
        result["int8_kernel"].update(fp32_ms=timing.fp32_seconds * 1e3, int8_bf16_activations_ms=timing.int8_seconds * 1e3,
                                     int8_fp32_activations_ms=timing.int8_fp32_activations_seconds * 1e3,
                                     weight_bytes_fp32=timing.weight_bytes_fp32)

    # 6. the fixed-shape step: compiled (optional) and, on a GPU, replayed from a CUDA graph
    if compile_ or gpu:
        result["static_step"] = _static_step(model, chat, 16 if small else 64, dev, compile_, reps)
    result["targets"] = _targets(result)
    return result


def _static_step(model, prompt, n, dev, compile_: bool, reps: int) -> dict:
    decoder = StaticDecoder(model, 1, prompt.shape[1] + n + 1)
    decoder.prefill(prompt)
    steps = lambda: [decoder.step() for _ in range(n)]  # noqa: E731  (the position runs on; the slots suffice)
    reset = lambda: decoder.pos.fill_(prompt.shape[1])  # noqa: E731
    out = {}
    run = lambda: (reset(), steps())  # noqa: E731
    eager = time_it(run, dev, warmup=1, repeats=reps).median_s
    out["eager_tokens_per_s"] = n / eager
    if compile_:
        with torch.inference_mode():
            compiled, seconds, breaks = compile_step(decoder._step, dev, mode="reduce-overhead" if dev.type == "cuda" else None)
            decoder._step = compiled  # step() now runs the compiled step
            t = time_it(run, dev, warmup=1, repeats=reps).median_s
        out.update(compile_seconds=seconds, graph_breaks=breaks, compiled_tokens_per_s=n / t)
    elif dev.type == "cuda":
        try:
            decoder.capture()
            t = time_it(run, dev, warmup=1, repeats=reps).median_s
            out["cuda_graph_tokens_per_s"] = n / t
        except CourseError as err:
            out["cuda_graph_error"] = str(err)
    return out


def _targets(r: dict) -> dict:
    rows = {"fused_vs_transformers": (r["decode"]["fused_vs_transformers"], ">="),
            "decode_read_bandwidth_fraction": (r["bandwidth"]["fraction_of_read_bandwidth"], ">="),
            "prompt_lookup_speedup": (r["speculative"]["speedup"], ">="),
            "tiled_peak_memory_ratio_4096": (r["tiled_attention"]["ratio"], "<=")}
    return {name: {"value": value, "target": f"{op} {TARGETS[name]}",
                   "met": bool(value >= TARGETS[name] if op == ">=" else value <= TARGETS[name])}
            for name, (value, op) in rows.items()}


def format_table(r: dict) -> str:
    """The figures as readable text."""
    d, b, s, t = r["decode"], r["bandwidth"], r["speculative"], r["tiled_attention"]
    lines = [f"Making decode fast: {r['model']} model, {r['dtype']}, on {r['device_name']}" + (" [quick]" if r["quick"] else ""),
             f"measured read bandwidth (sum)   {r['read_bandwidth_bytes_per_s'] / 1e9:8.1f} GB/s", "",
             f"decode, {d['new_tokens']} new tokens after {d['prompt_tokens']} (greedy; same tokens: {d['same_tokens']}):"]
    for name, label in (("transformers", "transformers generate"), ("plain", "from scratch, plain"),
                        ("fused", "fused projections"), ("fused_in_out", "fused, weights [in, out]")):
        lines.append(f"  {label:<28} {d['tokens_per_s'][name]:8.1f} tokens/s")
    lines += [f"  fastest ({d['fastest']}) / transformers {d['fused_vs_transformers']:6.2f} x   "
              f"(plain / transformers {d['plain_vs_transformers']:.2f} x)",
              f"  {b['bytes_per_token'] / 1e6:.0f} MB per token at {b['tokens_per_s']:.1f} tokens/s = "
              f"{b['fraction_of_read_bandwidth']:.0%} of the read bandwidth", "",
              f"speculative decoding, prompt lookup, k = {s['draft_length']}, {s['new_tokens']} tokens, {s['task']}:"]
    for name, row in s["by_model"].items():
        lines.append(f"  {name:<13} plain {row['plain_tokens_per_s']:6.1f} tokens/s, speculative "
                     f"{row['speculative_tokens_per_s']:6.1f} tokens/s: {row['speedup']:.2f} x; acceptance "
                     f"{row['acceptance_rate']:.2f}, {row['tokens_per_round']:.2f} tokens per pass; same tokens: "
                     f"{row['same_tokens']}")
    lines += ["",
              f"attention at {t['prompt_tokens']} tokens, peak extra memory: plain {t['plain_peak_bytes'] / 1e6:.1f} MB, "
              f"tiled {t['tiled_peak_bytes'] / 1e6:.1f} MB ({t['ratio']:.3f} x); max difference {t['max_abs_difference']:.1e}"]
    k = r["int8_kernel"]
    if k["available"]:
        lines.append(f"int8 weights, one token, {k['weight_bytes_fp32'] / 1e6:.0f} MB of fp32 weights: fp32 {k['fp32_ms']:.1f} ms, "
                     f"int8 with bf16 activations {k['int8_bf16_activations_ms']:.1f} ms, "
                     f"with fp32 activations {k['int8_fp32_activations_ms']:.1f} ms")
    else:
        lines.append(f"int8 kernel: {k['why_not']}")
    for key, value in r.get("static_step", {}).items():
        lines.append(f"fixed-shape step: {key} = {value if isinstance(value, str) else round(value, 2)}")
    lines += ["", "targets:"]
    for name, row in r["targets"].items():
        lines.append(f"  {name:<32} {row['value']:8.3f}  (target {row['target']})  {'met' if row['met'] else 'MISSED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser("fast", __doc__, ["default", "tiny"], "default: SmolLM2-135M; tiny: a random-weight model for tests")
    p.add_argument("--compile", action="store_true", help="also torch.compile the decode step (slow to warm up)")
    args = p.parse_args(argv)
    set_threads(args.threads)
    return report(run(args.device, args.model_size, args.quick, args.compile, progress(args.json)), args.json,
                  format_table)

if __name__ == "__main__":
    sys.exit(main())
