"""The measurement model of notebook 07, checked on this machine (issue #11, B1-B5 and B8); run by tools/gpu_check.sh.

    python tools/gpu_checks.py                # every check; on a GPU with random-weight models of the real shapes
    python tools/gpu_checks.py --quick        # tiny shapes (what the test suite runs on a CPU)
    python tools/gpu_checks.py --out DIR      # also write DIR/gpu_checks.json

Each check prints PASS or FAIL with its evidence, and READ for a figure that depends on the hardware (never asserted).
The exit status is 1 when any check fails. GPU-only parts (kernel launches, CUDA graphs, bf16 against fp32, a mask on
the CPU beside ids on the GPU) are skipped on a CPU and say so. Random weights need no download: speed and shapes do
not depend on the weights' values.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

class Report:
    """Collects PASS / FAIL / SKIP lines and READ figures."""

    def __init__(self):
        self.rows: list[dict] = []

    def check(self, name: str, ok: bool, evidence: str) -> bool:
        self.rows.append({"check": name, "status": "PASS" if ok else "FAIL", "evidence": evidence})
        print(f"{'PASS' if ok else 'FAIL'} {name}: {evidence}", flush=True)
        return ok

    def read(self, name: str, text: str) -> None:
        self.rows.append({"check": name, "status": "READ", "evidence": text})
        print(f"READ {name}: {text}", flush=True)

    def skip(self, name: str, why: str) -> None:
        self.rows.append({"check": name, "status": "SKIP", "evidence": why})
        print(f"SKIP {name}: {why}", flush=True)

    @property
    def failed(self) -> list[str]:
        return [r["check"] for r in self.rows if r["status"] == "FAIL"]


def random_model(size: str, device, dtype, seed: int = 0):
    """The from-scratch model on random weights of a named shape (models.random.RANDOM_SHAPES), on `device`."""
    from llm_anatomy.weights.random import random_llama
    from llm_anatomy.model.scratch import ScratchLlama

    return ScratchLlama.from_hf(random_llama(size, device, dtype, seed))


def check_b1_prefill_head(report: Report, model, n: int) -> None:
    """B1: what is timed as prefill computes logits for the last position only, and the FLOP count says the same."""
    from llm_anatomy.generate.decode import prefill
    from llm_anatomy.measure.roofline import forward_work

    cfg, device = model.cfg, model.device
    ids = torch.randint(3, cfg.vocab_size, (1, n), device=device)
    logits = prefill(model, ids, model.new_cache(1, n)).logits
    head = 2 * cfg.vocab_size * cfg.hidden_size
    last, every = forward_work(cfg, n, logits_tokens=1), forward_work(cfg, n, logits_tokens=None)
    report.check("B1 prefill logits", tuple(logits.shape) == (1, 1, cfg.vocab_size)
                 and abs((every.flops - last.flops) - head * (n - 1)) < 1e-6 * every.flops,
                 f"prefill of {n} tokens returns logits {tuple(logits.shape)}; forward_work counts the LM head for "
                 f"1 position: {last.flops / 1e9:.2f} GFLOP (all {n} positions would be {every.flops / 1e9:.2f})")


def check_b2_scores(report: Report, model, n: int, peaks) -> None:
    """B2: the naive attention's score traffic is counted, and where a long prefill lands is read, not assumed."""
    from llm_anatomy.generate.decode import prefill
    from llm_anatomy.measure.roofline import forward_work, naive_score_bytes, roofline_point
    from llm_anatomy.measure.timing import time_it

    cfg, device = model.cfg, model.device
    plain, naive = forward_work(cfg, n, bytes_per_element=2), forward_work(cfg, n, bytes_per_element=2,
                                                                           materialized_scores=True)
    scores = naive_score_bytes(2) * cfg.num_layers * cfg.num_heads * n * n  # the plain attention's passes, 16 bits
    report.check("B2 score bytes", abs((naive.bytes - plain.bytes) - scores) < 1e-6 * naive.bytes,
                 f"{n}-token prefill: scores add {scores / 1e9:.2f} GB to {plain.bytes / 1e9:.2f} GB "
                 f"({scores / naive.bytes:.0%} of the bytes); intensity {naive.intensity:.1f} instead of "
                 f"{plain.intensity:.1f} FLOP/byte")
    size = model.dtype.itemsize
    ids = torch.randint(3, cfg.vocab_size, (1, n), device=device)
    cache = model.new_cache(1, n)

    def run():
        cache.reset()
        prefill(model, ids, cache)

    seconds = time_it(run, device, warmup=1, repeats=3).median_s
    point = roofline_point(f"prefill {n}", forward_work(cfg, n, bytes_per_element=size, materialized_scores=True,
                                                        activations=True), seconds)  # every op's bytes (notebook 07)
    side = "right of the ridge (compute roof)" if point.intensity > peaks.ridge_intensity else "left of the ridge"
    report.read("B2 prefill on the roofline", f"{n} tokens in {seconds * 1e3:.1f} ms: {point.flops_per_s / 1e12:.2f} "
                f"TFLOP/s = {point.flops_per_s / peaks.flops_per_s:.0%} of the measured {peaks.dtype} peak, "
                f"{point.intensity:.1f} FLOP/byte, {side} ({peaks.ridge_intensity:.1f})")


def check_b3_peaks(report: Report, device, quick: bool):
    """B3: the peaks carry their dtype; fp16 where bf16 is not native; the data sheet's dtype is named."""
    from llm_anatomy.device import default_dtype, native_bf16
    from llm_anatomy.measure.peaks import measure_peaks

    dtype = default_dtype(device)
    peaks = measure_peaks(device, dtype, quick=quick)
    name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    want = ("bf16" if native_bf16(device) else "fp16") if device.type == "cuda" else "fp32"
    ok = peaks.dtype == name == want and name in peaks.how
    if device.type == "cuda" and peaks.published is not None:
        ok = ok and peaks.published[2] in ("bf16", "fp16")
    report.check("B3 peaks dtype", ok, f"{peaks.device}: {peaks.flops_per_s / 1e12:.3g} TFLOP/s in {peaks.dtype}, "
                 f"{peaks.bytes_per_s / 1e9:.0f} GB/s ({peaks.how}); data sheet: "
                 + (f"{peaks.published[0] / 1e12:.0f} TFLOP/s {peaks.published[2]}" if peaks.published else "none"))
    return peaks


def check_b4_launches(report: Report, small, big, peaks, steps: int) -> None:
    """B4: the ops (and kernels) of a decode step are counted; a CUDA graph is captured, or the check fails loudly."""
    from llm_anatomy.generate.decode import StaticDecoder, decode_step
    from llm_anatomy.errors import CourseError
    from llm_anatomy.measure.overhead import count_step_ops, dispatch_cost_s
    from llm_anatomy.measure.roofline import forward_work
    from llm_anatomy.measure.timing import time_it

    device = small.device
    cache = small.new_cache(1, 40)
    token = torch.zeros(1, 1, dtype=torch.long, device=device)

    def step():
        cache.length = 32
        decode_step(small, token, cache)

    ops = count_step_ops(step, device)
    cuda = device.type == "cuda"
    report.check("B4 op count", ops.ops > 0 and (not cuda or (ops.launches > 0 and ops.kernels > 0)),
                 f"one decode step of a {small.cfg.num_layers}-layer model: {ops.ops} ops"
                 + (f", {ops.launches} launches, {ops.kernels} kernels busy {ops.kernel_s * 1e3:.2f} ms" if cuda else ""))
    per_op = dispatch_cost_s(device)
    wall = time_it(step, device, warmup=2, repeats=10).median_s
    report.read("B4 launch cost", f"one tiny op costs {per_op * 1e6:.1f} us; {ops.ops} ops x that = "
                f"{ops.ops * per_op * 1e3:.2f} ms against a step of {wall * 1e3:.2f} ms")
    if not cuda:
        report.skip("B4 CUDA graph", "no CUDA GPU here")
        return
    prompt = torch.randint(3, big.cfg.vocab_size, (1, 16), device=device)
    decoder = StaticDecoder(big, batch=1, max_len=16 + steps + 8)
    eager_tokens = decoder.generate(prompt, steps)
    decoder.prefill(prompt)
    try:
        decoder.capture()
    except CourseError as err:
        report.check("B4 CUDA graph", False, f"capture failed, nothing replayed: {err}")
        return
    graph_tokens = decoder.generate(prompt, steps)
    decoder.prefill(prompt)
    eager_s = time_it(decoder._step, device, warmup=2, repeats=steps // 2).median_s
    decoder.prefill(prompt)
    graph_s = time_it(decoder.step, device, warmup=2, repeats=steps // 2).median_s
    report.check("B4 CUDA graph", torch.equal(eager_tokens, graph_tokens),
                 f"captured; the replayed step gives the eager step's {steps} tokens: "
                 f"{torch.equal(eager_tokens, graph_tokens)}")
    moved = forward_work(big.cfg, 1, decoder.cache.max_len, 1, big.dtype.itemsize).bytes
    report.read("B4 graph on the roofline", f"{big.cfg.num_layers}-layer model: eager {eager_s * 1e3:.2f} ms, graph "
                f"{graph_s * 1e3:.2f} ms per token = {moved / graph_s / peaks.bytes_per_s:.0%} of the measured bandwidth")


def check_b5_fp32(report: Report, size: str, device, steps: int) -> None:
    """B5: cached and uncached greedy tokens are identical in fp32; in 16 bits the first divergence is read."""
    from llm_anatomy.generate.decode import generate_greedy

    model = random_model(size, device, torch.float32, seed=1)
    prompt = torch.randint(3, model.cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2)).to(device)
    cached = generate_greedy(model, prompt, steps).tokens
    uncached = generate_greedy(model, prompt, steps, use_cache=False).tokens
    report.check("B5 fp32 identical", torch.equal(cached, uncached),
                 f"{steps} greedy tokens, cached and recomputed, fp32 on {device.type}: {torch.equal(cached, uncached)}")
    if device.type != "cuda":
        report.skip("B5 16-bit divergence", "no CUDA GPU here")
        return
    half = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    model = model.to(half)
    cached = generate_greedy(model, prompt, steps).tokens
    uncached = generate_greedy(model, prompt, steps, use_cache=False).tokens
    same = (cached == uncached)[0]
    with torch.inference_mode():  # the logits of every generated position, one full pass against the cached steps
        full = model(torch.cat([prompt, cached], dim=1))[0, prompt.shape[1] - 1:-1].float()
        cache = model.new_cache(1, prompt.shape[1] + steps)
        stepped = [model(prompt, cache)[0, -1]] + [model(cached[:, i:i + 1], cache)[0, -1] for i in range(steps - 1)]
    gap = float((full - torch.stack(stepped).float()).abs().max())
    first = "none" if same.all() else str(int((~same).nonzero()[0]))
    report.read("B5 16-bit divergence", f"in {str(half).removeprefix('torch.')}: first differing token {first} of "
                f"{steps}; largest logit difference, cached against one full pass: {gap:.3g}")


def check_b8_mask_device(report: Report, model) -> None:
    """B8: an attention mask made on the CPU works beside ids on the model's device."""
    from llm_anatomy.generate.decode import prefill

    device = model.device
    if device.type == "cpu":
        report.skip("B8 mask device", "ids and mask are both on the CPU here (tests/generate/test_decode.py runs it on a GPU)")
        return
    ids = torch.randint(3, model.cfg.vocab_size, (2, 6), device=device)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # left padding, on the CPU
    try:
        got = prefill(model, ids, model.new_cache(2, 6), attention_mask=mask).logits
    except RuntimeError as err:
        report.check("B8 mask device", False, f"a CPU mask beside {device.type} ids raised: {err}")
        return
    want = prefill(model, ids, model.new_cache(2, 6), attention_mask=mask.to(device)).logits
    report.check("B8 mask device", torch.equal(got, want), f"a CPU mask beside {device.type} ids gives the same logits")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes and small sizes (seconds, on a CPU)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--out", default=None, help="a folder for gpu_checks.json")
    args = parser.parse_args(argv)

    from llm_anatomy.device import default_dtype, describe_device, pick_device

    device = pick_device(args.device)
    cuda = device.type == "cuda"
    quick = args.quick or not cuda  # real shapes on a GPU; on a CPU they would take minutes
    dtype = default_dtype(device)
    start = time.perf_counter()
    print(f"checks on {describe_device(device)}, {'tiny' if quick else 'real'} shapes", flush=True)
    report = Report()
    small_size = "tiny" if quick else "135m"
    big_size = "tiny" if quick else "1b"
    n = 64 if quick else 4096
    steps = 8 if quick else 32
    small = random_model(small_size, device, dtype)
    peaks = check_b3_peaks(report, device, quick)
    check_b1_prefill_head(report, small, n)
    check_b2_scores(report, small, n, peaks)
    big = small if quick else random_model(big_size, device, dtype)
    check_b4_launches(report, small, big, peaks, steps)
    del big
    check_b5_fp32(report, small_size, device, steps)
    check_b8_mask_device(report, small)
    seconds = time.perf_counter() - start
    failed = report.failed
    print(f"{len(report.rows)} lines in {seconds:.0f} s: " + (f"FAILED {', '.join(failed)}" if failed else "all checks passed"))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_checks.json").write_text(json.dumps(
            {"device": describe_device(device), "quick": quick, "seconds": seconds, "rows": report.rows}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
