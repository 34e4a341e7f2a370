"""Issue 51, item 1, a first measured answer: what torch.compile (inductor, CPU) buys the packed int4 decode step.

    PYTHONPATH=lib python tools/compile_int4_step.py THREADS [--cpp-wrapper] [--turns 5]

The eager packed model's decode (decode_step, growing cache) against the same model's fixed-shape step
(StaticDecoder: the position in a tensor, attention over every slot with a mask) compiled by inductor, timed in turns;
the compiled step's 128 greedy tokens against the eager path's; the compile's first call (cold with an empty inductor
cache, warm when TORCHINDUCTOR_CACHE_DIR already holds it). An experiment, not a bench option: one JSON line out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from llm_anatomy.fast.packed import pack
from llm_anatomy.generate.chat import chat_prompt_ids
from llm_anatomy.generate.decode import StaticDecoder, generate_greedy
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.weights.load import load_model

p = argparse.ArgumentParser()
p.add_argument("threads", type=int)
p.add_argument("--cpp-wrapper", action="store_true", help="inductor's C++ wrapper: the graph's calls without Python")
p.add_argument("--turns", type=int, default=5)
p.add_argument("--tokens", type=int, default=64)
args = p.parse_args()
torch.set_num_threads(args.threads)
if args.cpp_wrapper:
    import torch._inductor.config as inductor_config

    inductor_config.cpp_wrapper = True

loaded = load_model(device="cpu", dtype=torch.float32, verbose=False)
model = pack(ScratchLlama.from_hf(loaded.model), "int4")
chat = chat_prompt_ids(loaded.tokenizer, [{"role": "user", "content": "Explain what a KV cache is."}])
n_check = 128
with torch.inference_mode():
    eager_tokens = generate_greedy(model, chat, n_check).tokens
    decoder = StaticDecoder(model, 1, chat.shape[1] + n_check + 1)
    static_eager_tokens = decoder.generate(chat, n_check)
    decoder.prefill(chat)
    compiled = torch.compile(decoder._step)
    start = time.perf_counter()
    compiled()
    compile_s = time.perf_counter() - start
    decoder._step = compiled
    compiled_tokens = decoder.generate(chat, n_check)

    def eager_run():  # the eager packed path's decode steps alone (llama.cpp's eval rate)
        return statistics.median(generate_greedy(model, chat, args.tokens, timed=True).step_seconds[1:])

    def compiled_run():
        decoder.prefill(chat)
        times = []
        for _ in range(args.tokens - 1):
            t = time.perf_counter()
            decoder.step()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    eager_run(), compiled_run()  # warm-up
    turns = {"eager": [], "compiled": []}
    for _ in range(args.turns):  # in turns: a busy moment slows both alike
        turns["eager"].append(eager_run())
        turns["compiled"].append(compiled_run())
speed = {name: 1 / statistics.median(seconds) for name, seconds in turns.items()}
print(json.dumps({"threads": args.threads, "cpp_wrapper": args.cpp_wrapper, "first_call_s": compile_s,
                  "eager_step_tokens_per_s": speed["eager"], "compiled_step_tokens_per_s": speed["compiled"],
                  "speedup": speed["compiled"] / speed["eager"],
                  "per_turn_tokens_per_s": {k: [round(1 / s, 1) for s in v] for k, v in turns.items()},
                  "same_128_tokens_as_eager": bool(torch.equal(compiled_tokens, eager_tokens)),
                  "static_eager_same_128": bool(torch.equal(static_eager_tokens, eager_tokens))}))
