"""`python -m llm_anatomy bench fast`: the four levers of notebook 09, measured here.

    python -m llm_anatomy bench fast            # the default model, on the best device
    python -m llm_anatomy bench fast --json     # one JSON object instead of the table
    python -m llm_anatomy bench fast --compile  # also torch.compile the decode step (minutes on a small CPU)
    python -m llm_anatomy bench fast --llama-bench PATH  # also llama.cpp's decode of the same file (or LLAMA_BENCH=PATH)

Figures: from-scratch decoding (plain, fused projections, fused with weights stored [in, out]) against
transformers' `generate`, with the same greedy tokens, and with every matmul packed in int8 and int4 (packed.py: the
kernels take bf16 inputs, the LM head at int8), their greedy tokens set against fp32's; tokens/s over the whole
generation and, for our decoders, of the decode steps alone (1 / the median step, llama.cpp's eval rate); each
variant's bytes per token and the fraction of the measured read bandwidth it reaches; prompt-lookup speculative
decoding against plain decoding on an editing task (the answer copies its input), identical tokens; the peak memory
of tiled against plain attention at 4,096 tokens; on a GPU, the decode step replayed from a CUDA graph. Timings of
the variants are interleaved, run by run, so that a busy machine slows them all alike; ratios come from one run.
The packed int4 step's time split (matmuls, casts, attention, the rest, and its aten ops per step: issue 51); on a
CPU with a C++ compiler, the same step compiled as one graph (fast/compiled.py), with inductor's Python wrapper and
its C++ one: each compile's seconds cold and warm, its decode steps timed in turns with the eager packed step's,
the same greedy tokens (--no-compiled leaves it out); and llama.cpp's decode of the course's own Q4_1 file with the
same threads, when a llama-bench binary is named (tools/build_llama_bench.sh builds one), with our fastest decode's
ratio to it (steps alone, the compiled ones included).
"""

from __future__ import annotations

import copy
import functools
import statistics
import sys

import torch

from ...model.attention import attention
from ...generate.decode import generate_greedy
from ...device import default_dtype, pick_device
from ...errors import CourseError
from ...fast.fused import fuse
from ...measure.memory import peak_tensor_bytes
from ...measure.peaks import measure_peaks
from ...measure.roofline import forward_work
from ...measure.step_parts import format_split, step_split
from ...measure.timing import time_interleaved
from ...fast.llama_bench import course_gguf, llama_cpp_line, llama_cpp_row
from ...fast.packed import decode_bytes_per_token, difference_sources, kernel_status, one_step, pack, token_agreement
from ...fast.speculative import PromptLookupDraft, speculative_generate
from ...texts import editing_task
from ...fast.tiled_attention import tiled_attention
from . import load_bench_model, parser, progress, report, set_threads
from .fast_compile import compiled_lines, compiled_step, static_step

TARGETS = {"fused_vs_transformers": 1.3, "decode_read_bandwidth_fraction": 0.7, "prompt_lookup_speedup": 1.5,
           "tiled_peak_memory_ratio_4096": 0.1,  # a ceiling: at most a tenth
           "fastest_decode_tokens_per_s": 60.0,  # 0.4x llama.cpp's 150 on 2 cores, its eval rate: decode steps alone
           "fastest_vs_fused_fp32": 2.0, "int8_first_32_tokens_equal": 1.0,
           "fastest_vs_llama_cpp": 0.5}  # our fastest decode steps (compiled included) over llama-bench's, when run
EXACT = ("plain", "fused", "fused_in_out")  # the variants whose greedy tokens must equal transformers' exactly


def _load(dev, dtype, model_size: str):
    """The bench model (load_bench_model) and two prompts: a chat question, and an editing task that repeats itself."""
    hf, plain, tokenizer = load_bench_model(model_size, dev, dtype)
    if tokenizer is not None:
        from ...generate.chat import chat_prompt_ids

        chat = chat_prompt_ids(tokenizer, [{"role": "user", "content": "Explain what a KV cache is."}]).to(dev)
        editing = chat_prompt_ids(tokenizer, editing_task()).to(dev)
    else:
        g = torch.Generator().manual_seed(0)
        chat = torch.randint(3, hf.config.vocab_size, (1, 24), generator=g).to(dev)
        editing = torch.cat([chat, chat[:, :12]], dim=1)  # a prompt that repeats itself
    return hf, plain, chat, editing


def run(device: str = "auto", model_size: str = "default", quick: bool = False, compile_: bool = False,
        log=lambda message: None, llama_bench: str | None = None, no_compiled: bool = False) -> dict:
    """Every measurement, as a dict (what --json prints). llama_bench: the llama-bench binary (else LLAMA_BENCH);
    no_compiled: leave out the compiled packed step (its compiles take minutes on a small CPU)."""
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
    n = 8 if small else (128 if gpu else 32)  # new tokens
    settings = copy.deepcopy(hf.generation_config)
    settings.eos_token_id, settings.do_sample, settings.max_new_tokens, settings.pad_token_id = None, False, n, 0
    settings.temperature = settings.top_p = settings.top_k = None

    def generate():
        with torch.inference_mode():
            return hf.generate(chat, attention_mask=torch.ones_like(chat), generation_config=settings)[:, chat.shape[1]:]

    models = {"plain": plain, "fused": fused, "fused_in_out": fused_in_out}
    packed_rows = {}
    for fmt in ("int8", "int4"):  # every matmul packed (bf16 into the kernels), the LM head at int8
        ok, kernel = kernel_status(fmt, dev)
        packed_rows[fmt] = {"kernel": kernel if ok else None, "why_not": "" if ok else kernel}
        if ok:
            try:
                models[fmt] = pack(plain, fmt)
            except CourseError as err:  # e.g. a tiny model whose rows the group size does not divide
                packed_rows[fmt].update(kernel=None, why_not=str(err))
    steps: dict[str, list[float]] = {name: [] for name in models}  # each run's median decode step, seconds

    def ours(name, m):  # one generation; its median decode step (the prefill left out) kept in steps
        run = generate_greedy(m, chat, n, timed=True)
        steps[name].append(statistics.median(run.step_seconds[1:]))
        return run.tokens

    log(f"decoding {n} tokens {len(models) + 1} ways ...")
    ways = {"transformers": generate, **{name: functools.partial(ours, name, m) for name, m in models.items()}}
    tokens = {name: fn().cpu() for name, fn in ways.items()}
    timings = time_interleaved(ways, dev, warmup=1, repeats=reps)  # in turns: a busy moment slows all alike
    speed = {name: n / t.median_s for name, t in timings.items()}
    step_speed = {name: 1 / statistics.median(seconds) for name, seconds in steps.items()}
    best = max(EXACT, key=speed.get)
    fastest = max(models, key=speed.get)
    result["decode"] = {"new_tokens": n, "prompt_tokens": chat.shape[1],
                        "tokens_per_s": speed, "same_tokens": all(torch.equal(tokens[name], tokens["transformers"])
                                                                  for name in EXACT),
                        "fastest": best, "fused_vs_transformers": speed[best] / speed["transformers"],
                        "plain_vs_transformers": speed["plain"] / speed["transformers"],
                        "fastest_of_all": fastest, "fastest_tokens_per_s": speed[fastest],
                        # llama.cpp's eval rate: decode steps only (its prompt is timed apart, as "prompt eval")
                        "step_tokens_per_s": step_speed, "fastest_step_tokens_per_s": max(step_speed.values()),
                        "fastest_vs_fused_fp32": speed[fastest] / speed["fused"],
                        "spread": {name: t.spread for name, t in timings.items()}}

    # 1a. where the packed step's time goes (issue 51): the int4 model's step, else the fastest model's; then llama.cpp
    #     on the course's own Q4_1 file, decode steps alone, the same threads: its eval rate against ours
    split_model = "int4" if "int4" in models else fastest
    log(f"profiling the {split_model} decode step, then llama.cpp's llama-bench ...")
    with torch.inference_mode():
        result["step_split"] = {"model": split_model,
                                **step_split(one_step(models[split_model], chat), steps=3 if small else 10, device=dev)}
    # 1b. the packed int4 step compiled as one graph (issue 51): its compile, cold and warm, with each wrapper; its
    #     steps timed in turns with the eager packed step's; the same greedy tokens. A CPU only (on a GPU, section 5)
    if "int4" in models and not gpu and not no_compiled:
        log("compiling the packed int4 decode step (cold and warm, Python and C++ wrappers: minutes on 2 cores) ...")
        result["compiled"] = compiled_step(models["int4"], chat, 16 if small else 128, dev, 1 if small else 5)
    ours = max([result["decode"]["fastest_step_tokens_per_s"],
                *[row.get("step_tokens_per_s", 0) for row in result.get("compiled", {}).get("by_wrapper", {}).values()]])
    result["llama_cpp"] = llama_cpp_row(llama_bench, course_gguf(model_size), result["threads"], ours)

    # 1c. the packed models' greedy tokens against the fp32 model's: equal for how many tokens, over 128
    n_agree = 16 if small else 128
    log(f"packed greedy tokens against fp32, {n_agree} tokens ...")
    reference = generate_greedy(plain, chat, n_agree).tokens[0].cpu()
    for fmt, row in packed_rows.items():
        if fmt in models:
            row.update(token_agreement(models[fmt], chat, reference))
    result["packed_sources"] = difference_sources(plain, chat, reference) if {"int8", "int4"} <= set(models) else {}
    result["packed"] = packed_rows

    # 2. how close each decode comes to the read bandwidth (matmul weights as held + KV cache, read per token)
    context = chat.shape[1] + n // 2
    per_token = {name: (decode_bytes_per_token(m, context) if name in ("int8", "int4")
                        else forward_work(plain.cfg, 1, context, 1, elem).bytes) for name, m in models.items()}
    result["bandwidth"] = {"bytes_per_token": per_token[best], "tokens_per_s": speed[best],
                           "fraction_of_read_bandwidth": per_token[best] * speed[best] / read_bw,
                           "by_variant": {name: {"bytes_per_token": b, "fraction_of_read_bandwidth": b * speed[name] / read_bw}
                                          for name, b in per_token.items()}}

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
    model = models[best]

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

    # 5. the fixed-shape step of the fastest model: compiled (optional) and, on a GPU, replayed from a CUDA graph
    if compile_ or gpu:
        try:
            result["static_step"] = static_step(models[fastest], chat, 16 if small else 64, dev, compile_, reps)
            result["static_step"]["model"] = fastest
            if "compiled_tokens_per_s" in result["static_step"]:
                speed["compiled"] = result["static_step"]["compiled_tokens_per_s"]
        except Exception as err:  # noqa: BLE001  a compiler that fails here: say so, keep the other figures
            result["static_step"] = {"model": fastest, "error": f"{type(err).__name__}: {str(err)[:300]}"}
    result["targets"] = _targets(result)
    return result


def _targets(r: dict) -> dict:
    rows = {"fused_vs_transformers": (r["decode"]["fused_vs_transformers"], ">="),
            "decode_read_bandwidth_fraction": (r["bandwidth"]["fraction_of_read_bandwidth"], ">="),
            "prompt_lookup_speedup": (r["speculative"]["speedup"], ">="),
            "tiled_peak_memory_ratio_4096": (r["tiled_attention"]["ratio"], "<="),
            "fastest_decode_tokens_per_s": (r["decode"]["fastest_step_tokens_per_s"], ">="),  # as llama.cpp counts
            "fastest_vs_fused_fp32": (r["decode"]["fastest_vs_fused_fp32"], ">="),
            "int8_first_32_tokens_equal": (float(r["packed"]["int8"].get("first_32_equal", False)), ">=")}
    if r.get("llama_cpp", {}).get("tokens_per_s"):  # issue 51: at least half of llama.cpp's decode, same file, threads
        rows["fastest_vs_llama_cpp"] = (r["llama_cpp"]["ratio"], ">=")
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
                        ("fused", "fused projections"), ("fused_in_out", "fused, weights [in, out]"),
                        ("int8", "packed int8 (head int8)"), ("int4", "packed int4 g32 (head int8)"),
                        ("compiled", f"compiled step ({r.get('static_step', {}).get('model')})")):
        if name in d["tokens_per_s"]:
            step = d.get("step_tokens_per_s", {}).get(name)  # transformers' steps are not timed one by one
            lines.append(f"  {label:<30} {d['tokens_per_s'][name]:8.1f} tokens/s  "
                         + (f"(steps alone {step:6.1f})  " if step else " " * 21)
                         + f"{b['by_variant'].get(name, {}).get('bytes_per_token', float('nan')) / 1e6:6.1f} MB/token")
    lines += [f"  tokens/s: {d['new_tokens']} over the whole generation, prefill included; steps alone: llama.cpp's eval rate",
              f"  fastest of all: {d['fastest_of_all']}, {d['fastest_tokens_per_s']:.1f} tokens/s = "
              f"{d['fastest_vs_fused_fp32']:.2f} x the fused {r['dtype']} path"]
    lines += [f"  fastest exact ({d['fastest']}) / transformers {d['fused_vs_transformers']:6.2f} x   "
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
    for fmt, row in r["packed"].items():
        lines.append(f"packed {fmt}: {row['kernel']}; greedy tokens equal to fp32's for the first {row['equal_prefix']} "
                     f"of {row['tokens_compared']} ({row['agreement']:.0%} agree)" if row["kernel"] and "equal_prefix" in row
                     else f"packed {fmt}: not run ({row['why_not']})")
    lines += [f"  {name:<26} equal for {row['equal_prefix']:>3} of {row['tokens_compared']}; fp32's margin there "
              f"{row.get('fp32_margin_at_first_difference', float('nan')):.3f}" for name, row in r.get("packed_sources", {}).items()]
    lines += format_split(r["step_split"]) if "step_split" in r else []
    lines += compiled_lines(r["compiled"]) if "compiled" in r else []
    lines += [llama_cpp_line(r["llama_cpp"])] if "llama_cpp" in r else []
    for key, value in r.get("static_step", {}).items():
        lines.append(f"fixed-shape step: {key} = {value if isinstance(value, str) else round(value, 2)}")
    lines += ["", "targets:"]
    for name, row in r["targets"].items():
        lines.append(f"  {name:<32} {row['value']:8.3f}  (target {row['target']})  {'met' if row['met'] else 'MISSED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser("fast", __doc__, ["default", "tiny"], "default: SmolLM2-135M; tiny: a random-weight model for tests")
    p.add_argument("--compile", action="store_true", help="also torch.compile the decode step (slow to warm up)")
    p.add_argument("--no-compiled", action="store_true",
                   help="leave out the compiled packed int4 step (its four compiles take minutes on a small CPU)")
    p.add_argument("--llama-bench", default=None, metavar="PATH",
                   help="llama.cpp's llama-bench, run on the same Q4_1 file and threads (default: $LLAMA_BENCH; "
                        "tools/build_llama_bench.sh builds one)")
    args = p.parse_args(argv)
    set_threads(args.threads, args.device)
    return report(run(args.device, args.model_size, args.quick, args.compile, progress(args.json), args.llama_bench,
                      args.no_compiled), args.json, format_table)

if __name__ == "__main__":
    sys.exit(main())
