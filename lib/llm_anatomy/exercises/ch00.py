"""Checks for notebook 00 (set-up and tour): counting a model's parameters, and the token that ends a turn."""

from __future__ import annotations

import torch

from . import call, exercise, expect, hint, hints, returned  # noqa: F401  (hint: for the notebook)


def _tied_toy() -> torch.nn.Module:
    """A toy model whose output layer shares the embedding's table, as SmolLM2's does: 10*4 + 4*4 + 4 numbers."""
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(10, 4)
    model.hidden = torch.nn.Linear(4, 4)
    model.head = torch.nn.Linear(4, 10, bias=False)
    model.head.weight = model.embed.weight
    return model


@exercise
@hints("A model's numbers live in its parameter tensors; every tensor knows how many numbers it holds.",
       "The trap is the shared table: visit each parameter tensor once, not each name it goes by (a state_dict lists "
       "the tied table under two names), and add up the sizes.",
       "return sum(p.numel() for p in model.parameters())")
def check_count_parameters(count_parameters, loaded=None) -> str:
    """Exercise 0.1: count_parameters(model) -> the number of distinct numbers the model learned (shared ones once)."""
    expect(callable(count_parameters), "define a function count_parameters(model) that returns a whole number.")
    toy = _tied_toy()
    got = returned(call(count_parameters, toy), "whole", "the number of parameters")
    expect(got != 40 + 20 + 40, "you counted the shared table twice: the head and the embedding are one tensor here "
                                "(tied), so count each parameter tensor once (model.parameters() does).")
    expect(got == 60, f"a toy with a 10x4 embedding (tied to its head) and a 4x4 layer with 4 biases holds 60 numbers, "
                      f"not {got}.")
    if loaded is None:
        return "60 for the toy: each tensor counted once."
    model = getattr(loaded, "model", loaded)
    real = returned(call(count_parameters, model), "whole", "the number of parameters")
    expect(real == sum(p.numel() for p in model.parameters()), f"{real:,} is not the default model's count.")
    return (f"{real:,} parameters, about {real / 1e6:.0f} million: the '135M' in the name. The embedding table "
            f"alone is {model.get_input_embeddings().weight.numel():,} of them, counted once though used twice.")


@exercise
@hints("Look at the chat string printed above: every turn starts with one special token and ends with another.",
       "The turn opens with <|im_start|> and a role; the same closing token follows every message.",
       "answer = the special token at the end of each turn, as a string; tokenizer.eos_token holds it too")
def check_eos_token(answer, tokenizer) -> str:
    """Exercise 0.2: the text of the token that ends an assistant's turn in the chat template."""
    expect(answer is not None, "assign the token to `eos`, as a string, for example '<|something|>'.")
    answer = returned(answer, "text", "the token (for example '<|something|>')")
    expect(answer != "<|im_start|>", "<|im_start|> opens a turn; which token closes one?")
    expect(answer == tokenizer.eos_token,
           f"{answer!r} is not it: look at the chat string printed above: what closes every turn?")
    return f"{answer} (id {tokenizer.eos_token_id}) ends each turn; generation stops when the model emits it."
