"""Checks for notebook 00 (set-up and tour)."""

from __future__ import annotations

from . import exercise, expect


@exercise
def check_parameter_count(answer, loaded=None) -> str:
    """The default model's parameter count, in millions, rounded to a whole number."""
    expect(answer is not None, "assign your answer, a number of millions such as 42, to `answer`.")
    expect(isinstance(answer, (int, float)) and not isinstance(answer, bool),
           f"give a number (millions of parameters), not {type(answer).__name__}.")
    true_millions = 134.5 if loaded is None else loaded.num_parameters / 1e6
    expect(answer < 1e5, "give the count in millions: 135, not 135000000.")
    expect(abs(answer - true_millions) <= 1.0,
           f"{answer} is off. Hint: sum(p.numel() for p in model.parameters()) / 1e6, "
           "and remember the input and output embeddings are one shared (tied) table.")
    return f"the model has {true_millions:.1f} million parameters."


@exercise
def check_eos_token(answer, tokenizer) -> str:
    """The text of the token that ends an assistant's turn in the chat template."""
    expect(isinstance(answer, str), "give the token as a string, for example '<|something|>'.")
    expect(answer == tokenizer.eos_token,
           f"{answer!r} is not it. Hint: look at the chat string printed above: what closes every turn?")
    return f"{answer} (id {tokenizer.eos_token_id}) ends each turn; generation stops when the model emits it."
