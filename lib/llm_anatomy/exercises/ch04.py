"""Checks for notebook 04 (the forward pass)."""

from __future__ import annotations

import torch

from . import call, exercise, expect


@exercise
def check_rms_norm(rms_norm) -> str:
    """Exercise 4.1: rms_norm(x, weight, eps) = x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""
    from ..scratch import RMSNorm

    expect(callable(rms_norm), "define a function rms_norm(x, weight, eps).")
    g = torch.Generator().manual_seed(0)
    x, weight = 3 * torch.randn(2, 5, 16, generator=g), torch.randn(16, generator=g)
    out = call(rms_norm, x, weight, 1e-5)
    expect(isinstance(out, torch.Tensor) and out.shape == x.shape, "return a tensor of the same shape as x.")
    norm = RMSNorm(16, 1e-5)
    norm.weight.data = weight
    ref = norm(x)
    no_weight = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    expect(not torch.allclose(out, no_weight, atol=1e-4), "multiply by the learned weight at the end.")
    expect(torch.allclose(out, ref, atol=1e-4),
           "not yet. Hint: the mean of x**2 over the last dimension (keepdim=True), then x * torch.rsqrt(... + eps).")
    return "RMSNorm rescales each token's vector to a root-mean-square of 1, then weights each number."


@exercise
def check_swiglu(swiglu) -> str:
    """Exercise 4.2: swiglu(x, gate, up, down) = (silu(x @ gate.T) * (x @ up.T)) @ down.T."""
    expect(callable(swiglu), "define a function swiglu(x, gate, up, down).")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 8, generator=g)
    gate, up, down = torch.randn(20, 8, generator=g), torch.randn(20, 8, generator=g), torch.randn(8, 20, generator=g)
    out = call(swiglu, x, gate, up, down)
    expect(isinstance(out, torch.Tensor) and tuple(out.shape) == (3, 8),
           "return [tokens, hidden] (here [3, 8]): down projects back from the wide layer.")
    silu = torch.nn.functional.silu
    ref = (silu(x @ gate.T) * (x @ up.T)) @ down.T
    swapped = (silu(x @ up.T) * (x @ gate.T)) @ down.T
    expect(not torch.allclose(out, swapped, atol=1e-4), "silu goes on the gate projection, not on the up projection.")
    expect(torch.allclose(out, ref, atol=1e-4),
           "not yet. Hint: a = silu(x @ gate.T); b = x @ up.T; (a * b) @ down.T.")
    return "the gate decides, number by number, how much of the up projection passes."


@exercise
def check_next_token(answer, model, tokenizer, prompt: str = "The capital of France is") -> str:
    """Exercise 4.3: the text of the model's most likely next token after `prompt` (a ScratchLlama)."""
    expect(answer is not None, "assign the token's text (a string) to `answer`.")
    expect(isinstance(answer, str), f"give the token's text as a string, not {type(answer).__name__}.")
    ids = torch.tensor([tokenizer.encode(prompt)], device=model.device)
    top = int(model(ids)[0, -1].argmax())
    right = tokenizer.decode([top])
    expect(answer.strip() != "" or right.strip() == "", "the answer is empty: decode the top token's id.")
    expect(answer == right, f"{answer!r} is not the top token. Hint: logits[0, -1].argmax() is its id; "
                            "tokenizer.decode([id]) its text (mind the leading space).")
    return f"{right!r} (id {top}) has the highest logit at the last position."
