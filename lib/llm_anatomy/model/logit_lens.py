"""The logit lens: what the residual stream would predict if the model stopped after layer i.

Every block adds its output to the residual stream; the final norm and the LM head turn the last
stream into next-token logits. Applying that same norm and head to the stream after each earlier
block shows how the prediction forms, layer by layer. (The lens is an approximation for early
layers: the model was never trained to be read there.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import CourseError


def lens_logits(hidden_states, final_norm, lm_head, position: int = -1) -> torch.Tensor:
    """Logits `[n_states, batch, vocab]` from each residual stream `[batch, seq, hidden]` at `position`.

    hidden_states: the list from ScratchLlama.trace (embeddings, then after each block), or a
    transformers output's hidden_states with its last entry replaced by the pre-norm stream.
    """
    if not len(hidden_states):
        raise CourseError("No hidden states: run model.trace(ids) (keep_hidden=True) first.")
    seq = hidden_states[0].shape[1]
    if not -seq <= position < seq:
        raise CourseError(f"position must be from {-seq} to {seq - 1} for a {seq}-token prompt, not {position}.")
    with torch.no_grad():
        stream = torch.stack([h[:, position] for h in hidden_states])  # [n_states, batch, hidden]
        return lm_head(final_norm(stream))


@dataclass
class LensRow:
    layer: int  # 0 = the embeddings, i = after block i
    top_token: str
    top_probability: float
    target_probability: float  # probability of the model's final answer at this layer
    target_rank: int  # 0 = top


@torch.no_grad()
def logit_lens(model, input_ids: torch.Tensor, tokenizer=None, position: int = -1, traced=None) -> list[LensRow]:
    """Read every layer of a ScratchLlama with the lens at `position` (batch 0).

    The 'target' is the model's final top prediction, so the last row always has rank 0.
    traced: the ScratchOutput of `model.trace(input_ids)` (with its hidden states), when already computed.
    """
    out = traced if traced is not None else model.trace(input_ids, keep_hidden=True)
    if len(out.hidden_states) != model.cfg.num_layers + 1 or out.logits.shape[:2] != input_ids.shape:
        raise CourseError("traced must be model.trace(input_ids) of these ids, with keep_hidden=True: the stream "
                          "before the first block and after each one, and the logits at every position.")
    logits = lens_logits(out.hidden_states, model.norm, model.lm_head, position)[:, 0]  # [layers + 1, vocab]
    probs = torch.softmax(logits.float(), dim=-1)
    target = int(out.logits[0, position].argmax())
    rows = []
    for layer, p in enumerate(probs):
        top = int(p.argmax())
        rank = int((p > p[target]).sum())
        text = tokenizer.decode([top]) if tokenizer is not None else str(top)
        rows.append(LensRow(layer, text, float(p[top]), float(p[target]), rank))
    return rows


@dataclass
class LensGrid:
    top_tokens: list[list[str]]  # [layers + 1][seq]: the lens's most likely next token after each block, per position
    top_probabilities: torch.Tensor  # [layers + 1, seq]: its probability, 0-1 (on the CPU)


@torch.no_grad()
def lens_grid(model, input_ids: torch.Tensor, tokenizer=None, hidden_states=None, max_tokens: int = 64) -> LensGrid:
    """The logit lens at every layer and every position of batch 0 of a ScratchLlama.

    hidden_states: the residual streams of `model.trace(input_ids)`, when already computed.
    Computes `[layers + 1, seq, vocab]` probabilities at once, so the prompt is limited to `max_tokens`.
    """
    if input_ids.shape[-1] > max_tokens:
        raise CourseError(f"The lens grid reads at most {max_tokens} positions, not {input_ids.shape[-1]}: "
                          "use a shorter prompt (or logit_lens for one position).")
    if hidden_states is None:
        hidden_states = model.trace(input_ids, keep_hidden=True).hidden_states
    stream = torch.stack([h[0] for h in hidden_states])  # [layers + 1, seq, hidden]
    probs = torch.softmax(model.lm_head(model.norm(stream)).float(), dim=-1)  # [layers + 1, seq, vocab]
    top_p, top_id = probs.max(dim=-1)
    decode = (lambda i: tokenizer.decode([i])) if tokenizer is not None else str
    return LensGrid([[decode(int(i)) for i in row] for row in top_id.tolist()], top_p.cpu())
