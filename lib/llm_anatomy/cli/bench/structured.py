"""`python -m llm_anatomy bench structured`: what constrained decoding costs (notebook 12, claim C26).

    python -m llm_anatomy bench structured            # the default model, a table
    python -m llm_anatomy bench structured --json     # the figures as one JSON object

Figures, on one JSON schema (SCHEMA) and one chat prompt: the mask's cost per step, naive (every token of the
vocabulary walked through the DFA) and precomputed (the state's mask cached, looked up and applied to the logits),
against a decode step (constrained.mask_timing); greedy decoding constrained against unconstrained, same prompt,
same max tokens, in tokens/s after the prompt's prefill (the constrained run warm: its states' masks already cached; and cold, each state's mask
made on its first visit); and the same for xgrammar on the same schema: its GrammarMatcher's fill_next_token_bitmask
and apply_token_bitmask_inplace on our model's logits and accept_token after each step. Without xgrammar its
figures are absent and the output says how to install it. The aim, precomputed masks under 10% of a decode step, is
printed as met or not from the figures. "--model-size tiny" is a tiny random-weight model with the default model's
vocabulary (for tests: its decode step is far shorter, so the mask weighs more beside it).
"""

from __future__ import annotations

import json

import torch

from ...device import pick_device, timed
from ...errors import CourseError
from ...measure.timing import time_interleaved
from . import parser, progress, report, set_threads

AIM = 0.10  # a precomputed mask under 10% of a decode step (issue 50)
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"},
                         "city": {"enum": ["Paris", "London", "Tokyo"]}, "student": {"type": "boolean"}},
          "required": ["name", "age", "city", "student"]}
QUESTION = "Describe a student who lives in Paris, as JSON."
INSTALL = "pip install --no-deps -r requirements-nodeps.txt"


def _model(model_size: str, device, tokenizer):
    """The scratch model: the default model, or the tiny random shape with the tokenizer's vocabulary."""
    from . import load_bench_model

    return load_bench_model(model_size, device, torch.float32, vocab_size=len(tokenizer))[1]


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        return None
    return xgrammar


@torch.inference_mode()
def _xgrammar_generate(model, tokenizer, ids, grammar, xgr, max_new_tokens: int, mask_s: list):
    """Greedy decoding under xgrammar's mask (our model, our decode step), as a constrained.Answer; each step's mask
    time goes to mask_s."""
    from ...constrained import Answer
    from ...generate.decode import decode_step, prefill

    matcher = xgr.GrammarMatcher(grammar)
    bitmask = xgr.allocate_token_bitmask(1, len(tokenizer))
    cache = model.new_cache(1, ids.shape[1] + max_new_tokens + 1)
    logits = prefill(model, ids, cache).logits[:, -1].float()
    out, finished = [], False
    for _ in range(max_new_tokens):
        def mask():
            matcher.fill_next_token_bitmask(bitmask)
            xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device))
        mask_s.append(timed(mask, logits.device)[0])
        chosen = int(logits[0].argmax())
        if chosen == tokenizer.eos_token_id or not matcher.accept_token(chosen):
            finished = chosen == tokenizer.eos_token_id
            break
        out.append(chosen)
        logits = decode_step(model, torch.tensor([[chosen]]), cache).logits[:, -1].float()
    return Answer(out, tokenizer.decode(out), [], finished)


def run(device: str = "auto", model_size: str = "default", quick: bool = False, log=lambda message: None) -> dict:
    """Every figure, as the dict --json prints (seconds unless a name says otherwise)."""
    from transformers import AutoTokenizer

    from ...constrained import TokenMasker, compile_pattern, constrained_generate, mask_timing, schema_pattern
    from ...constrained.minimize import minimized
    from ...generate.chat import chat_prompt_ids
    from ...generate.decode import prefill
    from ...generate.sampling import SamplingParams
    from ...weights.cache import fetch_default_model

    dev = torch.device("cpu") if device == "auto" else pick_device(device)
    if dev.type != "cpu":
        raise CourseError(f"bench structured runs on the CPU (the course's constrained decoding is CPU code), not "
                          f"{dev.type}: use --device cpu.")
    tokenizer = AutoTokenizer.from_pretrained(fetch_default_model())
    log(f"loading the {model_size} model on {dev.type} ...")
    model = _model(model_size, dev, tokenizer)
    ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": QUESTION}])
    new_tokens, rounds, repeats = (24, 1, 1) if quick else (64, 3, 3)
    result = {"device": dev.type, "model": model_size, "threads": torch.get_num_threads(), "quick": quick,
              "schema": SCHEMA, "prompt_tokens": ids.shape[1], "max_new_tokens": new_tokens, "aim": AIM}

    log("compiling the schema: pattern, DFA, the vocabulary's byte trie ...")
    compile_s, dfa = timed(lambda: compile_pattern(schema_pattern(SCHEMA)))
    trie_s, masker = timed(lambda: TokenMasker.for_tokenizer(dfa, tokenizer))
    result["ours_compile"] = {"dfa_s": compile_s, "dfa_states": dfa.num_states, "tokens_and_trie_s": trie_s,
                              "minimal_dfa_states": minimized(dfa).num_states}  # what the API's masks are made on

    log("the mask per step, naive and precomputed, against a decode step ...")
    step = max(1, dfa.num_states // (8 if quick else 24))
    states = list(range(0, dfa.num_states, step))  # a spread: outside and inside strings, numbers, the enum
    per_step = mask_timing(model, masker, states, rounds=rounds)
    result["mask_per_step"] = {**per_step, "states": len(states),
                               "naive_over_decode": per_step["naive_s"] / per_step["decode_step_s"],
                               "cached_over_decode": per_step["cached_s"] / per_step["decode_step_s"]}
    result["aim_met"] = result["mask_per_step"]["cached_over_decode"] < AIM

    log(f"greedy decoding of up to {new_tokens} tokens, constrained and not, in turns ...")
    greedy = SamplingParams(temperature=0.0)
    answers = {}

    def decode(name, mask):
        def go():
            answers[name] = constrained_generate(model, tokenizer, ids, mask, greedy, max_new_tokens=new_tokens)
        return go

    cold = TokenMasker(dfa, masker.tokens, masker.eos_id)  # a masker with nothing cached: every state's first visit
    cold_s = timed(decode("cold", cold), dev)[0]
    candidates = {"unconstrained": decode("unconstrained", None), "constrained": decode("constrained", masker)}
    xgr = _xgrammar()
    xgr_mask_s: list[float] = []
    if xgr is not None:
        log("xgrammar: compiling the same schema ...")
        info_s, compiler = timed(lambda: xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=len(tokenizer))))
        grammar_s, grammar = timed(lambda: compiler.compile_json_schema(
            json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": "), strict_mode=True))

        def xgrammar_run():
            xgr_mask_s.clear()
            answers["xgrammar"] = _xgrammar_generate(model, tokenizer, ids, grammar, xgr, new_tokens, xgr_mask_s)
        candidates["xgrammar"] = xgrammar_run
    candidates["prompt"] = lambda: prefill(model, ids, model.new_cache(1, ids.shape[1]))  # what every run starts by
    timings = time_interleaved(candidates, dev, warmup=1, repeats=repeats)  # the warm-up fills our masks' cache
    prompt_s = timings.pop("prompt").min_s
    tokens = {name: len(a.ids) + a.finished for name, a in answers.items()}  # the end of turn is a step too

    def row(name, seconds):  # tokens/s after the prompt: the runs end at different lengths, the prompt is the same
        return {"tokens": tokens[name], "seconds": seconds, "tokens_per_s": tokens[name] / max(seconds - prompt_s,
                                                                                               1e-9)}
    result["decode"] = {name: row(name, t.min_s) for name, t in timings.items()}
    result["decode"]["constrained_cold"] = row("cold", cold_s)
    result["prompt_s"] = prompt_s
    unconstrained = result["decode"]["unconstrained"]["tokens_per_s"]
    result["constrained_over_unconstrained"] = result["decode"]["constrained"]["tokens_per_s"] / unconstrained
    result["answers"] = {"unconstrained": answers["unconstrained"].text, "constrained": answers["constrained"].text,
                         "constrained_finished": answers["constrained"].finished}
    if xgr is None:
        result["xgrammar"] = None
        result["xgrammar_missing"] = f"xgrammar is not installed: {INSTALL}"
    else:
        mean_mask = sum(xgr_mask_s) / len(xgr_mask_s)
        result["xgrammar"] = {"tokenizer_info_s": info_s, "compile_s": grammar_s, "mask_s": mean_mask,
                              "mask_over_decode": mean_mask / per_step["decode_step_s"],
                              "over_unconstrained": result["decode"]["xgrammar"]["tokens_per_s"] / unconstrained,
                              "same_answer": answers["xgrammar"].ids == answers["constrained"].ids}
    return result


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f} ms"


def format_table(r: dict) -> str:
    m, d, x = r["mask_per_step"], r["decode"], r["xgrammar"]
    lines = [f"structured output on {r['device']} ({r['threads']} threads), model {r['model']}"
             + (" [quick]" if r["quick"] else "") + f"; schema of {r['ours_compile']['dfa_states']} DFA states "
             f"({r['ours_compile']['minimal_dfa_states']} once minimized)",
             f"compile: DFA {r['ours_compile']['dfa_s'] * 1e3:.0f} ms, vocabulary bytes and trie "
             f"{r['ours_compile']['tokens_and_trie_s'] * 1e3:.0f} ms",
             f"mask per step over {m['states']} states (best of rounds):",
             f"  {'naive, every token walked':<34}{_ms(m['naive_s'])}  {m['naive_over_decode']:7.1%} of a decode step",
             f"  {'precomputed (cached per state)':<34}{_ms(m['cached_s'])}  {m['cached_over_decode']:7.1%}",
             f"  {'a state first visited (trie walk)':<34}{_ms(m['trie_first_s'])}",
             f"  {'decode step':<34}{_ms(m['decode_step_s'])}"]
    if x is not None:
        lines.append(f"  {'xgrammar (fill + apply bitmask)':<34}{_ms(x['mask_s'])}  {x['mask_over_decode']:7.1%}")
    lines.append(f"greedy decoding, up to {r['max_new_tokens']} new tokens after {r['prompt_tokens']} prompt tokens "
                 f"(tokens/s after the prompt's {r['prompt_s'] * 1e3:.0f} ms):")
    for name, row in d.items():
        lines.append(f"  {name:<34}{row['tokens']:>5} tokens {row['tokens_per_s']:9.1f} tokens/s")
    lines.append(f"constrained / unconstrained tokens/s: {r['constrained_over_unconstrained']:.2f}"
                 + (f"; xgrammar / unconstrained: {x['over_unconstrained']:.2f}, same answer as ours: "
                    f"{x['same_answer']}" if x is not None else ""))
    lines.append(f"constrained answer: {r['answers']['constrained']!r}")
    if x is None:
        lines.append(r["xgrammar_missing"])
    verdict = "met" if r["aim_met"] else "NOT met"
    lines.append(f"aim: a precomputed mask under {r['aim']:.0%} of a decode step: {verdict} "
                 f"({m['cached_over_decode']:.2%} here)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = parser("structured", __doc__, ["default", "tiny"],
               "default: the course's model; tiny: a random-weight model with its vocabulary (tests)")
    args = p.parse_args(argv)
    set_threads(args.threads, args.device)
    return report(run(args.device, args.model_size, args.quick, progress(args.json)), args.json, format_table)
