"""The attention explorer's view: one layer, one head, one prompt, drawn as a heatmap.

The numbers come from `llm_anatomy.model.explore.head_attention` (one forward pass of the model, the chosen
layer's weights kept); this module only labels and draws them. `attention_view(result, tokenizer)` labels a
HeadAttention's tokens, `draw_attention` draws a weight matrix as a labelled heatmap, `heatmap_png` a view as a PNG.
`draw_gqa_shapes(q_shape, kv_shape)` draws one layer's queries, keys/values and scores with their shapes, and which
query heads read which key/value head (grouped-query attention, from `model.attention.kv_head_of`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import CourseError
from ..model.attention import kv_head_of
from ..model.explore import HeadAttention
from .labels import glyph_legend, token_labels

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
    legend = glyph_legend(tokens)  # how to read the marks in the token labels, when there are any
    ax.set_xlabel("key (token looked at)" + (f"\n{legend}" if legend else ""))
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


@dataclass
class GqaPicture:
    """What draw_gqa_shapes drew: the axes, each slab's box ("q", h) / ("kv", g) / ("scores", h) -> patch, and the
    lines (("q", h), ("kv", g)) and (("kv", g), ("scores", h)) it drew, so a test can read the grouping."""

    ax: object
    boxes: dict = field(default_factory=dict)
    edges: list = field(default_factory=list)


def draw_gqa_shapes(q_shape, kv_shape, ax=None) -> GqaPicture:
    """Draw one attention layer under GQA: the queries `[batch, heads, seq, head_dim]`, the keys and values
    `[batch, kv_heads, seq, head_dim]` and the scores `[batch, heads, seq, seq]`, one slab per head, with a line
    from each query head to the K/V head it reads and on to its scores. Returns a GqaPicture."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    q_shape, kv_shape = tuple(q_shape), tuple(kv_shape)
    if len(q_shape) != 4 or len(kv_shape) != 4 or q_shape[0] != kv_shape[0] or q_shape[2:] != kv_shape[2:]:
        raise CourseError(f"queries and keys must be [batch, heads, seq, head_dim] with the same batch, seq and "
                          f"head_dim, not {list(q_shape)} and {list(kv_shape)}.")
    batch, heads, seq, dim = q_shape
    kv_heads = kv_shape[1]
    group = [kv_head_of(h, heads, kv_heads) for h in range(heads)]  # refuses a count that does not divide
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.5 * heads + 1.6))
    ax.set_xlim(0, 10.4)
    ax.set_ylim(-0.9, heads + 1.1)
    ax.axis("off")
    drawn = GqaPicture(ax)
    colours = plt.get_cmap("tab10")
    slab = {"q": (0.2, 2.4), "kv": (4.0, 2.4), "scores": (7.8, 2.4)}  # column -> (left x, width)

    def box(kind, index, top, height, text, colour):
        left, width = slab[kind]
        patch = FancyBboxPatch((left, top - height + 0.08), width, height - 0.16, boxstyle="round,pad=0.02",
                               fc=colour, ec="#333333", lw=0.8, alpha=0.9)
        ax.add_patch(patch)
        ax.text(left + width / 2, top - height / 2, text, ha="center", va="center", fontsize=8)
        drawn.boxes[(kind, index)] = patch
        return top - height / 2  # the slab's middle

    per_kv = heads / kv_heads  # each K/V slab is as tall as the query heads that share it
    kv_middle = {g: box("kv", g, heads - g * per_kv, per_kv, f"K/V head {g}", colours(g % 10)) for g in range(kv_heads)}
    for h in range(heads):
        g = group[h]
        q_middle = box("q", h, heads - h, 1.0, f"q head {h}", colours(g % 10))
        box("scores", h, heads - h, 1.0, f"q{h} · k{g} / sqrt({dim})", colours(g % 10))
        for start, end, edge in [((slab["q"][0] + slab["q"][1], q_middle), (slab["kv"][0], kv_middle[g]), (("q", h), ("kv", g))),
                                 ((slab["kv"][0] + slab["kv"][1], kv_middle[g]), (slab["scores"][0], q_middle),
                                  (("kv", g), ("scores", h)))]:
            ax.plot([start[0], end[0]], [start[1], end[1]], color=colours(g % 10), lw=1.2)
            drawn.edges.append(edge)
    for kind, text in [("q", f"queries Q  [{batch}, {heads}, seq, {dim}]"),
                       ("kv", f"keys K, values V  [{batch}, {kv_heads}, seq, {dim}]"),
                       ("scores", f"scores  [{batch}, {heads}, seq, seq]")]:
        left, width = slab[kind]
        ax.text(left + width / 2, heads + 0.55, text, ha="center", va="center", fontsize=8.5, family="monospace")
    share = heads // kv_heads
    ax.text(5.2, -0.45, f"query head h reads K/V head g = h // {share} (seq = {seq} here): its scores q_h k_g^T / "
            f"sqrt({dim}) are masked and softmaxed, then mix V_g", ha="center", va="center", fontsize=8.5)
    ax.set_title(f"Grouped-query attention: {heads} query heads over {kv_heads} key/value "
                 f"head{'s' if kv_heads > 1 else ''}, {share} query head{'s' if share > 1 else ''} per K/V head",
                 fontsize=10)
    return drawn
