"""Issue 51, item 1: what each step towards the compiled packed decode bought, measured in turns.

    PYTHONPATH=lib python tools/compile_int4_step.py [--threads 2] [--turns 5] [--tokens 64]

The packed int4 model's decode, five ways, in one process, each way's median step over `--tokens` tokens, the ways
run in turns (a busy moment slows them all alike):
  1. eager decode_step, the KV cache growing (the course's decode loop);
  2. eager fixed-shape step (StaticDecoder: the position in a tensor, attention over every slot under a mask);
  3. that fixed-shape step compiled by inductor (the first compiled path, issue 51's starting point);
  4. decode_step itself compiled (fast/compiled.py: the cache's length symbolic, attention over the filled
     positions only, the argmax in the graph), inductor's Python wrapper;
  5. the same with inductor's C++ wrapper (the calls between kernels without Python).
Each compiled way's 128 greedy tokens against the eager path's; each compile's first call (cold: a fresh inductor
cache for this run). One JSON line out: tokens/s per way, the ratio of each to the way before it and to eager.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from llm_anatomy.fast.compiled import CompiledDecoder, inductor_cache
from llm_anatomy.fast.packed import pack
from llm_anatomy.generate.chat import chat_prompt_ids
from llm_anatomy.generate.decode import StaticDecoder, generate_greedy
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.weights.load import load_model

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=2)
p.add_argument("--turns", type=int, default=5)
p.add_argument("--tokens", type=int, default=64)
args = p.parse_args()
torch.set_num_threads(args.threads)
loaded = load_model(device="cpu", dtype=torch.float32, verbose=False)
model = pack(ScratchLlama.from_hf(loaded.model), "int4")
chat = chat_prompt_ids(loaded.tokenizer, [{"role": "user", "content": "Explain what a KV cache is."}])
n_check, slots = 128, chat.shape[1] + 129
cache_dir = tempfile.mkdtemp(prefix="compile-int4-")


def timed_steps(step, first, n):  # the median of n - 1 steps, each step(token) -> token
    token, times = first(), []
    for _ in range(n - 1):
        start = time.perf_counter()
        token = step(token)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


with torch.inference_mode():
    eager_tokens = generate_greedy(model, chat, n_check).tokens
    static_eager, static_compiled = StaticDecoder(model, 1, slots), StaticDecoder(model, 1, slots)
    first_call, same = {}, {"static, eager": torch.equal(static_eager.generate(chat, n_check), eager_tokens)}
    static_compiled.prefill(chat)
    with inductor_cache(cache_dir):
        compiled_fn = torch.compile(static_compiled._step)
        start = time.perf_counter()
        compiled_fn()
        first_call["static, compiled"] = time.perf_counter() - start
    static_compiled._step = compiled_fn
    same["static, compiled"] = torch.equal(static_compiled.generate(chat, n_check), eager_tokens)
    decoders = {"decode_step compiled": CompiledDecoder(model, slots, cache_dir=cache_dir),
                "+ C++ wrapper": CompiledDecoder(model, slots, cpp_wrapper=True, cache_dir=cache_dir)}
    for name, decoder in decoders.items():
        first_call[name] = decoder.warm_up(chat)
        same[name] = torch.equal(decoder.generate(chat, n_check), eager_tokens)

    def static_run(decoder):
        def step(token):
            decoder.step()
            return decoder.token
        return timed_steps(step, lambda: decoder.prefill(chat), args.tokens)

    ways = {"eager decode_step": lambda: statistics.median(generate_greedy(model, chat, args.tokens,
                                                                           timed=True).step_seconds[1:]),
            "static, eager": lambda: static_run(static_eager),
            "static, compiled": lambda: static_run(static_compiled),
            **{name: (lambda d=d: timed_steps(d.step, lambda: d.prefill(chat), args.tokens))
               for name, d in decoders.items()}}
    for fn in ways.values():  # warm-up
        fn()
    seconds = {name: [] for name in ways}
    for _ in range(args.turns):
        for name, fn in ways.items():
            seconds[name].append(fn())
speed = {name: 1 / statistics.median(s) for name, s in seconds.items()}
names = list(ways)
print(json.dumps({"threads": args.threads, "tokens_per_s": {k: round(v, 1) for k, v in speed.items()},
                  "vs_eager": {k: round(v / speed[names[0]], 2) for k, v in speed.items()},
                  "vs_way_before": {b: round(speed[b] / speed[a], 2) for a, b in zip(names, names[1:])},
                  "first_call_s": {k: round(v, 1) for k, v in first_call.items()},
                  "same_128_tokens_as_eager": same,
                  "per_turn_tokens_per_s": {k: [round(1 / x, 1) for x in v] for k, v in seconds.items()}}))
