"""Solutions to the exercises of notebook 05 (generation)."""

from __future__ import annotations

import torch


def next_probs(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """Exercise 5.1: the probabilities [vocab] the next token is drawn from: greedy at temperature 0, else the
    logits divided by the temperature, every token below the k-th highest score dropped (ties with it kept)."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).float()  # greedy: all on the argmax
    scores = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(scores, top_k).values[-1]  # the k-th highest score; every token tied with it stays
        scores = scores.masked_fill(scores < kth, float("-inf"))
    return torch.softmax(scores, dim=-1)


def keep_top_p(logits: torch.Tensor, p: float) -> set[int]:
    """Exercise 5.2: the nucleus: the fewest most likely tokens whose probabilities add up to at least p.

    A token stays when the tokens more likely than it add up to less than p, so the token that crosses p stays.
    """
    probs = torch.softmax(logits.float(), dim=-1)
    ordered, order = probs.sort(descending=True)
    before = ordered.cumsum(dim=0) - ordered  # probability of the tokens ranked above each one
    return set(order[before < p].tolist())


def keep_min_p(logits: torch.Tensor, min_p: float) -> set[int]:
    """Exercise 5.4: the tokens whose probability is at least min_p times the most likely token's."""
    probs = torch.softmax(logits.float(), dim=-1)
    return set(torch.nonzero(probs >= min_p * probs.max()).flatten().tolist())


def generate_until_stop(model, ids: torch.Tensor, max_new_tokens: int, stop_ids) -> tuple[list[int], str]:
    """Exercise 5.3: append and rerun until a stop id or the length limit; the reason is 'stop' or 'length'."""
    new = []
    for _ in range(max_new_tokens):
        next_id = model(ids)[:, -1].argmax(-1, keepdim=True)  # [1, 1]: the last position predicts the next token
        new.append(int(next_id))
        if int(next_id) in stop_ids:
            return new, "stop"
        ids = torch.cat([ids, next_id], dim=1)
    return new, "length"
