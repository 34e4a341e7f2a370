"""`python -m llm_anatomy serve`: the course's OpenAI-compatible server (notebook 11) on this machine.

    python -m llm_anatomy serve                          # http://127.0.0.1:8000/v1, the default model, no key
    python -m llm_anatomy serve --port 8001 --max-waiting 16
    python -m llm_anatomy serve --max-waiting auto --ttft-objective-ms 500   # the queue sized from the objective
    LLM_ANATOMY_API_KEY=secret python -m llm_anatomy serve   # every route but /health wants "Bearer secret"

Then any OpenAI client talks to it: openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="secret").
It binds 127.0.0.1 unless told otherwise: --host 0.0.0.0 opens it to the network, so set a key first.
"""

from __future__ import annotations

import argparse
import os
import sys


def _count(text: str):
    return None if text.lower() == "none" else int(text)


def _limit(text: str):
    return "auto" if text.lower() == "auto" else _count(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llm_anatomy serve", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("LLM_ANATOMY_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every route but /health (default: "
                        "$LLM_ANATOMY_API_KEY, else none)")
    p.add_argument("--model", default=None, help="a local folder or hub id (default: the course's model, offline)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoding together at most")
    p.add_argument("--kv-blocks", type=int, default=512, help="blocks in the paged KV pool")
    p.add_argument("--block-size", type=int, default=16, help="positions per KV block")
    p.add_argument("--max-batched-tokens", type=_count, default=256,
                   help="tokens per engine step, decodes first, then prompt chunks ('none': whole prompts)")
    p.add_argument("--max-waiting", type=_limit, default=None,
                   help="requests that may wait for a slot; more get 429 (default: no limit). 'auto': the longest "
                        "queue whose drain at the measured service rate fits the TTFT objective (a request behind q "
                        "others waits (q + 1) / mu)")
    p.add_argument("--ttft-objective-ms", type=float, default=None,
                   help="the TTFT objective of --max-waiting auto (default: 3x the shortest recent prefill)")
    p.add_argument("--no-prefix-cache", action="store_true", help="turn prefix caching off")
    p.add_argument("--mixed-steps", action="store_true",
                   help="run new prompts in the same step as the running decodes (default: a step of their own "
                        "first, so a new request's first token does not wait for the others' decode step)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413")
    p.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens when a request gives none")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)  # for ServerProcess
    args = p.parse_args(argv)
    if args.exit_with_parent:
        from ..server.launch import watch_parent

        watch_parent()
    from ..server.launch import run
    from .bench import set_threads

    set_threads(args.threads, args.device)
    run(args.host, args.port, log=lambda m: print(m, file=sys.stderr, flush=True), model=args.model,
        device=args.device, max_batch=args.max_batch, kv_blocks=args.kv_blocks, block_size=args.block_size,
        max_batched_tokens=args.max_batched_tokens, prefix_cache=not args.no_prefix_cache,
        max_waiting=args.max_waiting, ttft_objective_s=None if args.ttft_objective_ms is None else
        args.ttft_objective_ms / 1e3, api_key=args.api_key, max_body_bytes=args.max_body_bytes,
        default_max_tokens=args.default_max_tokens, prefill_first=not args.mixed_steps)
    return 0
