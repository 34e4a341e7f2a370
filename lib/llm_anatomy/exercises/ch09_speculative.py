"""The check of notebook 09's exercise 9.5, the speculative rule: keep a drafted token with probability
min(1, p(x) / q(x)), and on rejection draw from max(p - q, 0), normalised, so that the output is distributed as p."""

from __future__ import annotations

import torch

from . import call, exercise, expect, hints, returned


def _pairs():
    g = torch.Generator().manual_seed(5)
    for size, spread in ((6, 1.0), (30, 2.5), (12, 0.3)):
        p = torch.softmax(torch.randn(size, generator=g) * spread, dim=-1).double()
        q = torch.softmax(torch.randn(size, generator=g) * spread, dim=-1).double()
        yield p, q
    p = torch.tensor([0.7, 0.2, 0.1, 0.0], dtype=torch.float64)
    yield p, torch.tensor([0.0, 0.1, 0.2, 0.7], dtype=torch.float64)  # a bad draft, with zeros on both sides


@exercise
@hints("A drafted token x is kept more often when the model likes it at least as much as the draft does.",
       "Keep x with probability min(1, p(x) / q(x)). On rejection, draw from what the kept tokens left missing: "
       "max(p - q, 0), normalised to sum to 1.",
       "acceptance_probability: return min(1.0, float(p[x] / q[x])); residual: r = (p - q).clamp(min=0); "
       "return r / r.sum()")
def check_speculative_rule(acceptance_probability, residual) -> str:
    """Exercise 9.5: acceptance_probability(p, q, x) and residual(p, q): together, the output is distributed as p."""
    expect(callable(acceptance_probability) and callable(residual),
           "define acceptance_probability(p, q, x) and residual(p, q).")
    for p, q in _pairs():
        accept = torch.tensor([returned(call(acceptance_probability, p.clone(), q.clone(), x), "number",
                                        "the probability of keeping the draft")
                               if q[x] > 0 else 0.0 for x in range(p.numel())], dtype=torch.float64)
        expect(bool((accept <= 1 + 1e-9).all()), "a probability cannot exceed 1: min(1, p[x] / q[x]).")
        expect(bool((accept >= 0).all()), "a probability cannot be negative.")
        drafted = q > 0
        right_accept = torch.where(drafted, (p / q.where(drafted, 1.0)).clamp(max=1.0), 0.0)
        if not torch.allclose(accept, right_accept, atol=1e-9):
            upside = torch.where(drafted, (q / p.where(p > 0, 1.0)).clamp(max=1.0), 0.0)
            expect(not torch.allclose(accept, upside, atol=1e-9), "the acceptance is upside down: keep x with "
                                                                  "probability min(1, p[x] / q[x]), the model's "
                                                                  "probability over the draft's.")
            expect(False, f"acceptance_probability should be min(1, p[x] / q[x]): "
                          f"{[round(x, 3) for x in right_accept.tolist()[:5]]}..., yours "
                          f"{[round(x, 3) for x in accept.tolist()[:5]]}...")
        r = returned(call(residual, p.clone(), q.clone()), "tensor", "the residual distribution").double()
        expect(r.shape == p.shape, f"residual(p, q) returns a distribution over the vocabulary, shape {tuple(p.shape)}.")
        kept = q * accept  # P(draft x and keep it)
        rejected = 1 - kept.sum()
        if rejected > 1e-9:
            expect(bool((r >= -1e-12).all()), "the residual has negative entries: clamp p - q at 0 before "
                                              "normalising, max(p - q, 0).")
            expect(abs(float(r.sum()) - 1) < 1e-6, f"the residual sums to {float(r.sum()):.3f}: normalise it.")
            expect(not torch.allclose(r, p), "resampling from p itself counts the tokens the draft already gave "
                                             "twice: sample from max(p - q, 0), normalised.")
            swapped = (q - p).clamp(min=0)
            expect(not torch.allclose(r, swapped / swapped.sum()), "that is max(q - p, 0): the residual is what p has "
                                                                   "MORE of than the draft, max(p - q, 0), normalised.")
        output = kept + rejected * r  # the distribution of the token that comes out
        expect(torch.allclose(output, p, atol=1e-6),
               f"your acceptance is right, but with your residual the tokens would come out as "
               f"{[round(x, 3) for x in output.tolist()[:5]]}..., not as p = {[round(x, 3) for x in p.tolist()[:5]]}"
               "...: on rejection, draw from max(p - q, 0), normalised.")
    return "kept drafts give min(p, q); the residual adds exactly what is missing, max(p - q, 0): together p."
