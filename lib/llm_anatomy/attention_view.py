"""The data behind the attention explorer: one layer, one head, one prompt.

`attention_view(model, tokenizer, prompt, layer, head)` runs the blocks before `layer`, then
computes the weights of the chosen head only (its query rows and the key rows of the KV head it
shares under GQA), never the other layers' weights. Long prompts are cut to `max_tokens`.
`draw_attention` draws a weight matrix as a labelled heatmap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import CourseError
from .scratch import ScratchLlama

MAX_TOKENS = 64  # longer prompts are cut: a 64 x 64 heatmap is still readable


def as_scratch(model) -> ScratchLlama:
    """A ScratchLlama for a ScratchLlama, a transformers Llama model or a LoadedModel (weights shared)."""
    if isinstance(model, ScratchLlama):
        return model
    return ScratchLlama.from_hf(model)


def token_labels(tokenizer, ids) -> list[str]:
    """One short readable label per token: spaces as '␣', new lines as '↵'."""
    labels = []
    for i in ids:
        text = tokenizer.decode([int(i)])
        text = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
        labels.append(text if len(text) <= 12 else text[:11] + "…")
    return labels


@dataclass
class AttentionView:
    tokens: list[str]  # one label per query/key position
    weights: torch.Tensor  # [seq, seq]: row = query (the token looking), column = key (looked at)
    layer: int
    head: int
    kv_head: int  # the KV head this query head shares (GQA)
    note: str = ""  # e.g. why the prompt was cut

    @property
    def title(self) -> str:
        return f"layer {self.layer}, head {self.head} (reads KV head {self.kv_head})"


def attention_view(model, tokenizer, prompt: str, layer: int, head: int,
                   max_tokens: int = MAX_TOKENS) -> AttentionView:
    """The attention weights of `head` in `layer` for `prompt` (batch of one), as an AttentionView."""
    scratch = as_scratch(model)
    cfg = scratch.cfg
    if not isinstance(prompt, str) or not prompt.strip():
        raise CourseError("Type a prompt first: the explorer needs some text to look at.")
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < cfg.num_layers:
        raise CourseError(f"layer must be from 0 to {cfg.num_layers - 1}, not {layer!r}.")
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < cfg.num_heads:
        raise CourseError(f"head must be from 0 to {cfg.num_heads - 1}, not {head!r}.")
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    note = ""
    if len(ids) > max_tokens:
        note = f"The prompt has {len(ids)} tokens; showing the first {max_tokens}."
        ids = ids[:max_tokens]
    input_ids = torch.tensor([ids], device=scratch.device)
    weights = scratch.attention_weights(input_ids, layer, head)[0].float().cpu()  # [seq, seq]
    return AttentionView(token_labels(tokenizer, ids), weights, layer, head,
                         head // (cfg.num_heads // cfg.num_kv_heads), note)


def draw_attention(weights: torch.Tensor, tokens: list[str], ax=None, title: str = ""):
    """Draw `[seq, seq]` weights as a heatmap: rows are queries, columns are keys. Returns the image."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 4.5))
    n = len(tokens)
    image = ax.imshow(weights.detach().float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
    ticks = range(n)
    small = max(5, 10 - n // 8)
    ax.set_xticks(ticks, tokens, rotation=90, fontsize=small)
    ax.set_yticks(ticks, tokens, fontsize=small)
    ax.set_xlabel("key (token looked at)")
    ax.set_ylabel("query (token looking)")
    if title:
        ax.set_title(title, fontsize=10)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight (0-1)")
    return image
