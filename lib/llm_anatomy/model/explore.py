"""What the attention explorer reads: one head's attention weights over one prompt (notebook 03's widget).

The weights come from the blocks' own attention (`ScratchLlama.attention_weights`), one forward pass of the model;
`views/attention.py` labels and draws them, `widgets/attention_explorer.py` is the shell around both.
`weight_from_to(traced, query, key)` reads every head's weight from one position onto another out of a trace (how
notebook 04 finds notebook 03's induction head again); `repeated_random_tokens` and `induction_scores` are the
standard test for induction heads (Olsson et al., 2022): random tokens said twice, every head scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import kv_head_of
from ..errors import CourseError
from .scratch import as_scratch


@dataclass
class HeadAttention:
    """One head's attention over one prompt: what the attention explorer draws (views/attention.py)."""

    ids: list[int]  # the prompt's token ids, cut to max_tokens
    weights: torch.Tensor  # [seq, seq] float32 on the CPU: row = query (the token looking), column = key
    layer: int
    head: int
    kv_head: int  # the KV head this query head reads (GQA)
    note: str = ""  # why the prompt was cut, when it was


def head_attention(model, tokenizer, prompt: str, layer: int, head: int, max_tokens: int = 64) -> HeadAttention:
    """The attention weights of `head` in `layer` for `prompt` (its first `max_tokens` tokens), batch of one.

    model: a ScratchLlama, a transformers Llama-family model or a LoadedModel (weights shared).
    """
    scratch = as_scratch(model)
    if not isinstance(prompt, str) or not prompt.strip():
        raise CourseError("Type a prompt first: the explorer needs some text to look at.")
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    note = f"The prompt has {len(ids)} tokens; showing the first {max_tokens}." if len(ids) > max_tokens else ""
    ids = ids[:max_tokens]
    weights = scratch.attention_weights(torch.tensor([ids], device=scratch.device), layer, head)  # [1, seq, seq]
    kv_head = kv_head_of(head, scratch.cfg.num_heads, scratch.cfg.num_kv_heads)
    return HeadAttention(ids, weights[0].float().cpu(), layer, head, kv_head, note)


def weight_from_to(traced, query: int, key: int) -> torch.Tensor:
    """Every head's attention weight from position `query` onto position `key`, read from `traced`, a ScratchOutput
    of one prompt run with `trace(ids, attention_layers=range(layers))`: `[layers, heads]`, float32 on the CPU, each
    a fraction of 1. Layers are those traced, in order from 0."""
    layers = sorted(traced.attentions)
    if not layers or layers != list(range(len(layers))):
        raise CourseError("trace the prompt with attention_layers=range(number of layers) first: weight_from_to "
                          f"reads every layer's weights from layer 0 on, and this trace kept layers {layers}.")
    first = traced.attentions[0]  # [batch, heads, seq, seq]
    if first.shape[0] != 1 or first.shape[2] != first.shape[3]:
        raise CourseError(f"weight_from_to reads one prompt traced without a cache, not weights of shape "
                          f"{list(first.shape)}.")
    seq = first.shape[-1]
    if not 0 <= key <= query < seq:
        raise CourseError(f"need 0 <= key <= query < {seq} (a token sees only itself and earlier ones), "
                          f"not query {query} and key {key}.")
    return torch.stack([traced.attentions[i][0, :, query, key].float().cpu() for i in layers])  # [layers, heads]


def repeated_random_tokens(length: int, seed: int, bos: int | None = None, repeat: bool = True,
                           ids_from: int = 1000, ids_to: int = 20000) -> torch.Tensor:
    """`[1, (bos) + 2 * length]` token ids: `length` random ids (from the ordinary middle of the vocabulary), then the
    same ids again when `repeat`, else other random ids (the control: nothing earlier to copy)."""
    if length < 2:
        raise CourseError(f"the test needs at least 2 random tokens, not {length}.")
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(ids_from, ids_to, (length,), generator=g)
    second = first if repeat else torch.randint(ids_from, ids_to, (length,), generator=g)
    start = torch.tensor([] if bos is None else [bos], dtype=torch.long)
    return torch.cat([start, first, second])[None]


def induction_scores(traced, length: int) -> torch.Tensor:
    """Every head's induction score `[layers, heads]`, from a trace (all layers' weights kept) of ids made by
    repeated_random_tokens: the mean weight, from each position of the second half, on the token that followed the
    same token in the first half (`length` positions back, plus one). A head that copies scores near 1; on the
    control, where nothing repeats, the same positions hold nothing special and every head scores near 0."""
    layers = sorted(traced.attentions)
    if not layers or layers != list(range(len(layers))):
        raise CourseError("trace the ids with attention_layers=range(number of layers) first: induction_scores "
                          f"scores every layer's heads, and this trace kept layers {layers}.")
    seq = traced.attentions[0].shape[-1]
    start = seq - length  # the second half's first position (after an optional BOS and the first half)
    if start < length:
        raise CourseError(f"a trace of {seq} tokens holds no two halves of {length}: pass the length the ids were "
                          "made with.")
    query = torch.arange(start + 1, seq)  # each of these has its earlier occurrence at query - length
    return torch.stack([traced.attentions[layer][0][:, query, query - length + 1].float().mean(-1).cpu()
                        for layer in layers])
