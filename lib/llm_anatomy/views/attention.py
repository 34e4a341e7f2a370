"""The attention explorer's view: one layer, one head, one prompt, drawn as a heatmap.

The numbers come from `llm_anatomy.model.explore.head_attention` (one forward pass of the model, the chosen
layer's weights kept); this module only labels and draws them. `attention_view(result, tokenizer)` labels a
HeadAttention's tokens, `draw_attention` draws a weight matrix as a labelled heatmap, `heatmap_png` a view as a PNG.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.explore import HeadAttention
from .labels import token_labels

MAX_TOKENS = 64  # longer prompts are cut: a 64 x 64 heatmap is still readable


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


def attention_view(result: HeadAttention, tokenizer) -> AttentionView:
    """A HeadAttention with a readable label for each of its tokens, ready to draw."""
    return AttentionView(token_labels(tokenizer, result.ids), result.weights, result.layer, result.head,
                         result.kv_head, result.note)


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


def heatmap_png(view: AttentionView) -> bytes:
    """The view drawn as a PNG. A bare matplotlib Figure (not pyplot): no global state, nothing to close."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(view.tokens)
    size = min(9.0, 3.5 + 0.09 * n)
    fig = Figure(figsize=(size + 1.0, size))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    draw_attention(view.weights, view.tokens, ax=ax, title=view.title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()
