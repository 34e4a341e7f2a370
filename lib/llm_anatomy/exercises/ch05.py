"""Checks for notebook 05 (generation): greedy choice, temperature, top-k."""

from __future__ import annotations

import torch

from . import call, exercise, expect

_CASES = [torch.tensor([0.5, 2.0, -1.0, 1.9]), torch.tensor([-3.0, -2.0, -2.5]),
          torch.tensor([7.0, 1.0, 7.5, 0.0, 6.0]), torch.linspace(-2, 2, 50).flip(0)]


def _as_int(value) -> int:
    if isinstance(value, torch.Tensor):
        expect(value.numel() == 1, f"return one token id, not a tensor of shape {tuple(value.shape)}.")
        return int(value)
    expect(isinstance(value, int) and not isinstance(value, bool), f"return a token id (an int), not {value!r}.")
    return value


@exercise
def check_greedy_choice(greedy_choice) -> str:
    """greedy_choice(logits [vocab]) -> the id of the most likely token."""
    expect(callable(greedy_choice), "define a function greedy_choice(logits) that returns a token id.")
    for logits in _CASES:
        got = _as_int(call(greedy_choice, logits.clone()))
        want = int(logits.argmax())
        expect(got != int(logits.argmin()) or got == want,
               f"for logits {logits.tolist()} you chose {got}, the LEAST likely token: use the maximum.")
        expect(got == want, f"for logits {logits.tolist()} the most likely token is {want}, you chose {got}. "
                            "Hint: logits.argmax().")
    return "greedy decoding is just the argmax of the logits, at every step."


@exercise
def check_temperature(apply_temperature) -> str:
    """apply_temperature(logits, temperature) -> probabilities softmax(logits / temperature)."""
    expect(callable(apply_temperature), "define apply_temperature(logits, temperature) returning probabilities.")
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    for t in (1.0, 0.5, 2.0, 0.1):
        got = call(apply_temperature, logits.clone(), t)
        expect(isinstance(got, torch.Tensor) and got.shape == logits.shape,
               f"return a tensor of probabilities, shape {tuple(logits.shape)}.")
        got = got.float()
        expect(torch.isfinite(got).all() and abs(float(got.sum()) - 1) < 1e-4,
               f"at temperature {t} your probabilities sum to {float(got.sum()):.4f}, not 1: apply a softmax.")
        want = torch.softmax(logits / t, dim=-1)
        if t != 1.0:
            wrong = torch.softmax(logits * t, dim=-1)
            expect(not torch.allclose(got, wrong, atol=1e-4),
                   f"at temperature {t} you multiplied by the temperature: divide the logits by it instead.")
        expect(torch.allclose(got, want, atol=1e-4),
               f"at temperature {t} expected {[round(x, 3) for x in want.tolist()]}, got "
               f"{[round(x, 3) for x in got.tolist()]}. Hint: torch.softmax(logits / temperature, dim=-1).")
    return "a low temperature sharpens the distribution, a high one flattens it."


@exercise
def check_top_k(keep_top_k) -> str:
    """keep_top_k(logits, k) -> a set of the token ids that top-k keeps."""
    expect(callable(keep_top_k), "define keep_top_k(logits, k) returning the set of kept token ids.")
    logits = torch.tensor([0.1, 3.0, -2.0, 2.5, 0.7, 2.9])
    for k in (1, 2, 3, 6):
        got = call(keep_top_k, logits.clone(), k)
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        expect(isinstance(got, (set, list, tuple)), f"return the kept ids as a set, not {type(got).__name__}.")
        got = {int(i) for i in got}
        want = set(torch.topk(logits, k).indices.tolist())
        smallest = set(torch.topk(-logits, k).indices.tolist())
        expect(got != smallest or got == want, f"for k={k} you kept the k LEAST likely tokens: keep the largest.")
        expect(len(got) == k, f"for k={k} keep exactly {k} ids, you kept {len(got)}.")
        expect(got == want, f"for k={k} top-k keeps {sorted(want)}, you kept {sorted(got)}. "
                            "Hint: torch.topk(logits, k).indices.")
    return "top-k keeps the k highest logits; every other token gets probability 0."
