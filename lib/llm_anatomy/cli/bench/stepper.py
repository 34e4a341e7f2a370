"""`python -m llm_anatomy bench stepper`: how fast the stepper widget answers a Step click.

Loads the default model, builds the Stepper widget, presses Prefill once and Step N times by
calling the widget's callbacks directly (model call, sampling and HTML rendering included).
Prints the prefill time and the median step time in milliseconds; the target is a median under
150 ms on a 2-core CPU. On a machine shared with other busy processes, `--threads 1` avoids
oversubscribing the cores (two torch threads then wait on each other) and is often much faster.
"""

from __future__ import annotations

import argparse
import json
import statistics

TARGET_MS = 150.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_anatomy bench stepper")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--steps", type=int, default=30, help="decode steps to time (default 30)")
    parser.add_argument("--device", default="auto", help="auto (default), cpu, cuda or mps")
    parser.add_argument("--prompt", default="Tell me about the history of the bicycle.")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: one per core free now)")
    args = parser.parse_args(argv)

    import torch

    from . import set_threads

    set_threads(args.threads, args.device)

    from ...device import timed
    from ...weights.load import load_model
    from ...widgets.stepper import Stepper

    loaded = load_model(device=args.device, verbose=False)
    # temperature 0 keeps the run deterministic; a large limit so that only EOS could stop it early
    stepper = Stepper(loaded, prompt=args.prompt, max_new_tokens=args.steps + 1, temperature=0.0, top_k=50,
                      top_p=0.9)
    prefill_click_ms = timed(stepper.on_prefill, loaded.device)[0] * 1e3
    if stepper.error.text:
        raise SystemExit(f"prefill failed: {stepper.error.text}")
    click_ms, model_ms = [], []
    for _ in range(args.steps):
        if stepper.session.finished:
            break
        click_ms.append(timed(stepper.on_step, loaded.device)[0] * 1e3)
        model_ms.append(stepper.session.last.ms)
    if not click_ms:
        raise SystemExit("the model ended its turn at once: try another --prompt")
    result = {
        "device": str(loaded.device), "dtype": str(loaded.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(), "prompt_tokens": len(stepper.session.prompt_ids),
        "prefill_ms": stepper.session.prefill_ms, "prefill_click_ms": prefill_click_ms,
        "steps": len(click_ms), "step_click_median_ms": statistics.median(click_ms),
        "step_model_median_ms": statistics.median(model_ms),
        "render_median_ms": statistics.median(c - m for c, m in zip(click_ms, model_ms)),
        "target_step_ms": TARGET_MS,
    }
    result["meets_target"] = result["step_click_median_ms"] < TARGET_MS
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"stepper on {result['device']} ({result['dtype']}, {result['threads']} threads), "
          f"prompt of {result['prompt_tokens']} tokens")
    print(f"{'prefill (model + first token)':<40}{result['prefill_ms']:>10.1f} ms")
    print(f"{'Prefill click (with rendering)':<40}{prefill_click_ms:>10.1f} ms")
    print(f"{'Step click, median of ' + str(len(click_ms)):<40}{result['step_click_median_ms']:>10.1f} ms")
    print(f"{'  of which model + sampling':<40}{result['step_model_median_ms']:>10.1f} ms")
    print(f"{'  of which rendering the widget':<40}{result['render_median_ms']:>10.1f} ms")
    verdict = "meets" if result["meets_target"] else "MISSES"
    print(f"target: median Step click < {TARGET_MS:.0f} ms ({verdict} it)")
    return 0
