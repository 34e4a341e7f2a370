"""Checks for notebook 05 (generation): greedy, temperature and top-k in one function, top-p, min-p, the decoding
loop with a stop.

The top-p check compares the learner's nucleus with llm_anatomy.generate.sampling (which matches transformers' warper) on
logits the notebook never showed; the loop check runs the learner's loop on a tiny random model.
"""

from __future__ import annotations

import math
import sys

import torch

from ..generate import sampling, stops
from . import call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: for the notebook)
from ._tiny import Recorder, stop_as_the_last_token, stop_cases, stopped_on_the_prompt, tiny_model

def _no_sampler(*names: str, why: str) -> forbidden_all:
    """The library's samplers refused: next_token_probs and the ones named (sample_next calls it)."""
    return forbidden_all([(sampling, name) for name in ("next_token_probs", "sample_next") + names],
                         why)


def _choice_cases() -> list[tuple[torch.Tensor, float, int | None]]:
    """(logits, temperature, top_k) the notebook never showed: random logits, greedy, and ties at the k-th place."""
    g = torch.Generator().manual_seed(55)
    cases = [(torch.randn(60, generator=g) * 2, 1.0, None), (torch.randn(60, generator=g) * 2, 0.5, 5),
             (torch.randn(60, generator=g), 2.0, None), (torch.randn(60, generator=g) * 3, 0.0, None),
             (torch.tensor([7.0, 1.0, 7.5, 0.0, 6.0]), 0.0, 2), (torch.tensor([0.5, 2.0, -1.0, 1.9]), 1.0, 2)]
    # ties: the 2nd highest logit is shared by ids 2 and 3, the highest by ids 0, 1 and 4
    cases += [(torch.tensor([1.0, 3.0, 2.0, 2.0, 0.5]), 1.0, 2), (torch.tensor([2.0, 2.0, 0.0, 1.0, 2.0]), 0.7, 1)]
    return cases


def _no_choice() -> forbidden_all:
    """The library's samplers and transformers' temperature and top-k warpers refused."""
    warpers = sys.modules.get("transformers.generation.logits_process")
    return forbidden_all([(sampling, name) for name in ("next_token_probs", "sample_next", "greedy",
                                                        "_divide_by_temperature", "top_k_mask")]
                         + [(warpers, "TemperatureLogitsWarper"), (warpers, "TopKLogitsWarper")],
                         "divide, cut and normalise yourself (torch.topk and torch.softmax are fine)")


def _masked_softmax(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)


def _kept(values: torch.Tensor) -> list[int]:
    return torch.nonzero(values > 0).flatten().tolist()


@exercise
@hints("Three steps in order: the temperature acts on the logits, top-k drops tokens, a softmax makes "
       "probabilities of what is left. Temperature 0 is the special case: no division at all.",
       "Divide the logits by the temperature (never multiply). For top-k, find the k-th highest score and keep "
       "every token scoring at least that much (ties with it stay); give the others -inf, so the softmax gives them 0.",
       "if temperature == 0: one-hot at logits.argmax(); scores = logits / temperature; "
       "if top_k: kth = torch.topk(scores, top_k).values[-1]; scores[scores < kth] = -inf; return softmax(scores)")
def check_next_probs(next_probs) -> str:
    """next_probs(logits [vocab], temperature, top_k) -> the probabilities [vocab] the next token is drawn from:
    temperature 0 = greedy (all the probability on the highest logit), top_k None = no top-k, ties with the k-th kept."""
    expect(callable(next_probs), "define next_probs(logits, temperature, top_k) returning probabilities [vocab].")
    for logits, t, k in _choice_cases():
        with _no_choice():
            got = returned(call(next_probs, logits.clone(), t, k), "tensor", "the probabilities")
        where = f"at temperature {t:g}, top_k {k} on {logits.numel()} logits"
        expect(got.shape == logits.shape, f"{where}: return one probability per token, a tensor of shape "
                                          f"{list(logits.shape)}, not {list(got.shape)}.")
        got = got.float()
        want = sampling.next_token_probs(logits, t, k)
        best = int(logits.argmax())
        if t == 0:
            expect(bool(torch.isfinite(got).all()), f"{where} your probabilities hold NaN or inf: temperature 0 "
                                                    "means greedy, so do not divide by it; put all the probability "
                                                    "on the highest logit.")
            expect(int(got.argmax()) != int(logits.argmin()), f"{where} you favoured the LEAST likely token: greedy "
                                                               "takes the highest logit.")
            expect(torch.allclose(got, want, atol=1e-5), f"{where} greedy gives probability 1 to token {best} (the "
                                                         "highest logit) and 0 to every other, whatever top_k says.")
            continue
        expect(bool(torch.isfinite(got).all()) and abs(float(got.sum()) - 1) < 1e-4,
               f"{where} your probabilities sum to {float(got.sum()):.4f}, not 1: apply a softmax to the kept scores "
               "(give dropped tokens -inf before it, or divide by what is left after it).")
        if torch.allclose(got, want, atol=1e-5) and _kept(got) == _kept(want):
            continue
        every = torch.ones_like(logits, dtype=torch.bool)
        top = torch.zeros_like(every).scatter(0, torch.topk(logits, k).indices, True) if k else every
        bottom = torch.zeros_like(every).scatter(0, torch.topk(-logits, k).indices, True) if k else every
        mistakes = [(_masked_softmax(logits / t, top), f"you kept exactly {k} tokens, but {len(_kept(want))} tie for "
                     f"the top {k} places: keep EVERY token scoring at least the {k}-th highest score (transformers "
                     "and the library keep ties), not only the k indices torch.topk returns."),
                    (_masked_softmax(logits / t, every), f"you kept every token: top_k = {k} keeps only the {k} highest."),
                    (_masked_softmax(logits / t, bottom), f"you kept the {k} LEAST likely tokens: keep the highest.")]
        if t != 1:
            mistakes += [(_masked_softmax(logits * t, top if k else every), "you multiplied the logits by the "
                          "temperature: divide them by it (a temperature below 1 sharpens)."),
                         (_masked_softmax(logits, top if k else every), f"your probabilities ignore the temperature "
                          f"{t:g}: divide the logits by it before the softmax.")]
        for wrong, message in mistakes[0 if k else 3:]:
            expect(not (torch.allclose(got, wrong, atol=1e-5) and _kept(got) == _kept(wrong)), f"{where} {message}")
        expect(False, f"{where} the library keeps tokens {_kept(want)} with probabilities "
                      f"{[round(x, 3) for x in want[want > 0].tolist()][:8]}; you kept {_kept(got)[:12]}.")
    return ("greedy is the argmax, temperature divides the logits, top-k keeps the k highest (and their ties): "
            "the first three knobs of every sampler.")


# ---------------------------------------------------------------------------------------------- top-p

def _top_p_cases() -> list[tuple[torch.Tensor, float]]:
    """Logits the notebook never showed: random ones at several sharpnesses, and hand-made boundary cases."""
    g = torch.Generator().manual_seed(2024)
    cases = [(torch.randn(300, generator=g) * scale, p) for scale, p in
             [(0.5, 0.9), (2.0, 0.9), (2.0, 0.5), (4.0, 0.95), (1.0, 0.3)]]
    # boundary cases: 0.5 + 0.3 crosses p = 0.6, so the token with 0.3 must stay (it brings the sum past p)
    probs = torch.tensor([0.05, 0.5, 0.1, 0.3, 0.05])
    cases += [(probs.log(), 0.6), (probs.log(), 0.85), (probs.log(), 0.2)]
    return cases


def _no_top_p() -> forbidden_all:
    warpers = sys.modules.get("transformers.generation.logits_process")
    return forbidden_all([(sampling, name) for name in ("next_token_probs", "sample_next", "top_p_mask")]
                         + [(warpers, "TopPLogitsWarper")],
                         "sort, add up and cut yourself: the nucleus is the exercise")


@exercise
@hints("Sort the probabilities from the most likely down, and add them up one by one.",
       "Keep a token if the tokens MORE likely than it add up to less than p: the token that crosses p stays.",
       "probs = softmax(logits); sorted, order = probs.sort(descending=True); before = sorted.cumsum(0) - sorted; "
       "return set(order[before < p].tolist())")
def check_top_p(keep_top_p) -> str:
    """keep_top_p(logits [vocab], p) -> the set of token ids top-p keeps (the nucleus)."""
    expect(callable(keep_top_p), "define keep_top_p(logits, p) returning the set of kept token ids.")
    for logits, p in _top_p_cases():
        with _no_top_p():
            got = returned(call(keep_top_p, logits.clone(), p), "id set", "the kept ids")
        want = set(sampling.top_p_mask(logits, p).nonzero().flatten().tolist())
        probs = torch.softmax(logits, dim=-1)
        best = int(probs.argmax())
        where = f"for p = {p} on {logits.numel()} logits"
        expect(got, f"{where} you kept no token: the most likely token always stays.")
        dropped = set(range(logits.numel())) - want
        expect(got != dropped, f"{where} you returned the tokens top-p DROPS: return the ones it keeps.")
        expect(best in got, f"{where} you dropped the most likely token ({best}): sort from the most likely down "
                            "(descending=True).")
        ordered = probs.sort(descending=True).indices.tolist()
        without_edge = set(ordered[:len(want) - 1])
        expect(not (got == without_edge and len(want) > 1),
               f"{where} you stopped one token short: you kept {len(got)} tokens, adding up to "
               f"{float(probs[list(got)].sum()):.3f} < p. Top-p keeps the token that brings the sum to p or beyond.")
        expect(not (got == set(ordered[:len(want) + 1]) and len(want) < len(ordered)),
               f"{where} you kept one token too many: the {len(want)} most likely tokens already reach "
               f"{float(probs[list(want)].sum()):.3f} >= p, and the next one goes past. Keep a token when the tokens "
               "MORE likely than it add up to less than p: the token that crosses p is the last one kept.")
        naive = set(torch.nonzero(probs.cumsum(0) - probs < p).flatten().tolist())
        expect(got != naive or got == want, f"{where} you added the probabilities in vocabulary order: sort them "
                                            "from the most likely down first.")
        mass = float(probs[list(got)].sum())
        expect(got == want, f"{where} top-p keeps {len(want)} tokens (probability {float(probs[list(want)].sum()):.3f}), "
                            f"you kept {len(got)} (probability {mass:.3f}). Did you apply a softmax to the logits first?")
    return "top-p keeps the fewest most likely tokens whose probabilities reach p: few when the model is sure, many when not."


# ---------------------------------------------------------------------------------------------- min-p

def _min_p_cases() -> list[tuple[torch.Tensor, float]]:
    """Logits the notebook never showed: random ones at several sharpnesses, and a token exactly on the threshold."""
    g = torch.Generator().manual_seed(505)
    cases = [(torch.randn(400, generator=g) * scale, m) for scale, m in [(0.5, 0.1), (2.0, 0.05), (3.0, 0.2), (1.0, 0.5)]]
    probs = torch.tensor([0.4, 0.2, 0.1, 0.25, 0.05])
    cases += [(probs.log(), 0.5), (probs.log() + 3.0, 0.3)]  # a shift of every logit changes no probability
    cases += [(torch.tensor([1.5, 3.0, -1.0, 3.0, 0.0]), 1.0)]  # two tied best tokens sit exactly on the threshold
    return cases


@exercise
@hints("min-p compares each token's probability with the most likely token's, not with a fixed number.",
       "Turn the logits into probabilities first (a softmax), find the largest one, and keep the tokens at or above "
       "min_p times it.",
       "probs = softmax(logits); return the ids where probs >= min_p * probs.max()")
def check_min_p(keep_min_p) -> str:
    """keep_min_p(logits [vocab], min_p) -> the set of token ids min-p keeps."""
    expect(callable(keep_min_p), "define keep_min_p(logits, min_p) returning the set of kept token ids.")
    from transformers.generation.logits_process import MinPLogitsWarper  # transformers' own min-p: refused too

    for logits, m in _min_p_cases():
        with _no_sampler("min_p_mask", why="compare the probabilities with the top one yourself"), \
                forbidden_all([MinPLogitsWarper], "compare the probabilities with the top one yourself"):
            got = returned(call(keep_min_p, logits.clone(), m), "id set", "the kept ids")
        margin = logits.double().log_softmax(-1)
        margin = margin - margin.max() - math.log(m)  # log(p / p_max) - log(min_p): kept where >= 0
        unsure = set(torch.nonzero((margin != 0) & (margin.abs() < 1e-6)).flatten().tolist())  # float's own call

        def same(a: set, b: set) -> bool:  # equal, but for tokens that only float rounding puts on either side
            return not (a ^ b) - unsure

        want = set(torch.nonzero(margin >= 0).flatten().tolist())
        if same(got, want):
            continue
        probs = torch.softmax(logits.double(), dim=-1)
        where = f"for min_p = {m} on {logits.numel()} logits"
        strict = set(torch.nonzero(margin > 0).flatten().tolist())
        expect(not same(got, strict), f"{where} you dropped a token exactly on the threshold: keep the tokens AT or "
                                      "above min_p x the top probability (>=).")
        absolute = set(torch.nonzero(probs >= m).flatten().tolist())
        expect(not same(got, absolute), f"{where} you kept the tokens with probability >= min_p: min-p scales the "
                                        "threshold by the most likely token's probability.")
        on_logits = set(torch.nonzero(logits >= m * logits.max()).flatten().tolist())
        expect(not same(got, on_logits), f"{where} you compared the logits, not the probabilities: apply a softmax "
                                         "first (a logit can be negative; a probability cannot), or compare logits "
                                         "with the top logit + log(min_p).")
        expect(False, f"{where} min-p keeps {len(want)} tokens, you kept {len(got)}.")
    return "min-p keeps the tokens within a factor of the best one: few when the model is sure, many when it is not."


# ---------------------------------------------------------------------------------------------- the decoding loop

def _no_stop_rule() -> forbidden_all:
    """The library's stop rule refused: deciding when and why to stop is the exercise (5.3 here, 6.1 cached)."""
    return forbidden_all([(stops, "finish_reason")], "compare each new token with stop_ids and count the tokens "
                                                     "yourself: saying why the loop stopped is the exercise.")


@exercise
@hints("Start from the append-and-rerun loop of section 2; what changes is when it ends, and what it says about it.",
       "After picking each token, check it against stop_ids: if it is one, keep it, and stop with the reason 'stop'. "
       "If the loop runs out of max_new_tokens, the reason is 'length'.",
       "for _ in range(max_new_tokens): next_id = int(model(ids)[0, -1].argmax()); new.append(next_id); "
       "if next_id in stop_ids: return new, 'stop'; ids = torch.cat([ids, torch.tensor([[next_id]])], dim=1) "
       "... and after the loop: return new, 'length'")
def check_generate_until_stop(generate_until_stop) -> str:
    """generate_until_stop(model, ids [1, seq], max_new_tokens, stop_ids) -> (new ids, the stop id included; reason),
    reason 'stop' when a stop id ended it, 'length' when max_new_tokens did."""
    expect(callable(generate_until_stop),
           "define generate_until_stop(model, ids, max_new_tokens, stop_ids) returning (new ids, reason).")
    model = tiny_model()
    for ids, n, stop_ids, want, why in stop_cases(model, 11, ((5, 12), (9, 8))):
        prompt_len, stop = ids.shape[1], want[-1]
        rec = Recorder(model)
        with _no_stop_rule():
            out = returned(call(generate_until_stop, rec, ids.clone(), n, set(stop_ids)), "pair",
                           "(the new ids, the reason)")
        got, reason = returned(out[0], "ids", "the new token ids"), out[1]
        on_prompt = stopped_on_the_prompt(ids, got, reason, want, stop_ids)
        expect(on_prompt is None, on_prompt or "")
        expect(len(rec.fed) > 0, "your loop never called the model: logits = model(ids).")
        prompt = ids[0].tolist()
        expect(got[:prompt_len] != prompt or want[:prompt_len] == prompt,
               f"you returned the prompt too: return only the new tokens, the ones made after the prompt's "
               f"{prompt_len}.")
        if got[:1] != want[:1]:
            with torch.no_grad():
                picks = model(ids)[0].argmax(-1).tolist()  # the greedy pick at every prompt position
            expect(not got or got[0] not in picks[:-1], f"your first token is {got[:1]}, expected {want[:1]}: take "
                                                        "the LAST position's logits, logits[0, -1] (position 0 "
                                                        "predicts the second prompt token).")
            expect(False, f"your first token is {got[:1]}, but the highest of the last position's logits is {want[0]}: "
                          "this loop is greedy, so take the argmax (logits[0, -1].argmax()), do not sample.")
        if len(got) > 1 and len(set(got)) == 1 and len(set(want)) > 1:
            expect(False, f"every token you made is {got[0]}: append each new token to the ids before the next "
                          "call, or the model sees the same text again.")
        if why == "stop":
            expect(len(got) <= len(want) or got[:len(want)] != want,
                   f"you went on after the stop token {stop}: stop as soon as you have made one of stop_ids.")
            expect(got != want[:-1], f"keep the stop token {stop} itself as the last token: it is what the model "
                                     "produced, and what tells the caller why it stopped.")
        else:
            expect(len(got) == n, f"without a stop token, make exactly max_new_tokens = {n} tokens, not {len(got)}.")
        expect(got == want, f"expected {want}, got {got} (prompt of {prompt_len}, max {n}, stop_ids {sorted(stop_ids)}).")
        last = stop_as_the_last_token(got, reason, want, why, n)
        expect(last is None, last or "")
        expect(reason == why, f"the tokens are right, but the reason should be {why!r}, not {reason!r}: 'stop' when "
                              "a stop id ended the loop, 'length' when max_new_tokens did.")
    return "run, pick, append, until a stop or the limit, and say which: what GenerationSession does at every step."
