"""Pictures of the whole model: the course map with tensor shapes (notebooks 00-04), and where the parameters sit.

`draw_model_map(cfg, here=...)` draws a ScratchConfig (or a transformers Llama config) from text to logits with the
residual stream as its spine: each norm reads the stream, attention and the MLP add into it, the final norm reads it.
Inside the block it names the shapes of the queries, keys and values, the scores and the MLP's width. `here` (a
notebook number, "01" to "04") highlights the parts that notebook covers ("you are here"); without it every part is
labelled with the notebook that teaches it. It returns a ModelMap: the axes, each part's box, and the edges drawn,
so a test can read the drawing's structure. `parameter_groups(model)` counts a model's parameters by role, each
tensor once (a tied LM head is the embedding table, so it is not counted again).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import CourseError
from ..model.config import ScratchConfig
from ..weights.load import transformers_model


def parameter_groups(model) -> dict[str, int]:
    """Parameters by role: {'embedding (= LM head, tied)', 'attention', 'MLP', 'norms'} -> count (each tensor once)."""
    module = transformers_model(model)
    groups = {"embedding (= LM head, tied)": 0, "attention": 0, "MLP": 0, "norms": 0}
    for name, param in module.named_parameters():  # shared tensors are listed once
        if "embed_tokens" in name or "lm_head" in name:
            key = "embedding (= LM head, tied)"
        elif "self_attn" in name:
            key = "attention"
        elif "mlp" in name:
            key = "MLP"
        elif "norm" in name:
            key = "norms"
        else:
            raise CourseError(f"parameter {name!r} has no role in a Llama-family model: is this one?")
        groups[key] += param.numel()
    return groups


def _numbers(cfg) -> dict:
    cfg = cfg if isinstance(cfg, ScratchConfig) else ScratchConfig.from_hf(cfg)  # the one config reader
    return dict(vocab=cfg.vocab_size, hidden=cfg.hidden_size, wide=cfg.intermediate_size, layers=cfg.num_layers,
                heads=cfg.num_heads, kv=cfg.num_kv_heads, head_dim=cfg.head_dim)


STREAM_X, BRANCH_X, BOX_W = 1.6, 5.0, 5.1  # the spine's x; the centre and width of the boxes that branch off it
HERE = {  # which parts each notebook covers; the first is where "you are here" points
    "01": ("tokenizer",),
    "02": ("embed", "rope", "lm_head"),
    "03": ("attention", "rope"),
    "04": ("input_norm", "attention", "post_norm", "mlp", "final_norm", "lm_head"),
}
TAUGHT_IN = {"tokenizer": "01", "embed": "02", "rope": "02", "attention": "03", "input_norm": "04",
             "post_norm": "04", "mlp": "04", "final_norm": "04", "lm_head": "02, 04", "logits": "05"}
COLOURS = {"tokenizer": "#eeeeee", "embed": "#cfe2f3", "lm_head": "#cfe2f3", "logits": "#eeeeee", "rope": "#e6d7f0",
           "attention": "#d9ead3", "mlp": "#f4cccc", "input_norm": "#fff2cc", "post_norm": "#fff2cc",
           "final_norm": "#fff2cc"}
HIGHLIGHT, DIM = "#c0392b", "#777777"


@dataclass
class ModelMap:
    """What draw_model_map drew: the axes, each part's box (name -> patch), and the edges (from, to) it drew.

    "stream" is the residual stream; "add_attention" and "add_mlp" are the two places where it is added to."""

    ax: object
    boxes: dict = field(default_factory=dict)
    edges: list = field(default_factory=list)
    here: set = field(default_factory=set)


def draw_model_map(cfg, here: str | None = None, ax=None) -> ModelMap:
    """Draw the model from text to logits around its residual stream; `here` ("01".."04") highlights a notebook's
    parts. Returns a ModelMap (axes, boxes, edges). Shapes are for one prompt of `seq` tokens."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle, FancyBboxPatch

    if here is not None and here not in HERE:
        raise CourseError(f"here must be one of {', '.join(HERE)} (a notebook that the map covers), not {here!r}.")
    n = _numbers(cfg)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 9.5))
    ax.set_xlim(0, 12)
    ax.set_ylim(0.4, 15.0)
    ax.axis("off")
    drawn = ModelMap(ax, here=set(HERE.get(here, ())))

    def box(name, x, y, width, text, height=0.7):
        lit = name in drawn.here
        patch = FancyBboxPatch((x - width / 2, y - height / 2), width, height, boxstyle="round,pad=0.04",
                               fc=COLOURS[name], ec=HIGHLIGHT if lit else DIM, lw=2.6 if lit else 1.0)
        ax.add_patch(patch)
        label = text if here is not None else f"{TAUGHT_IN[name]} · {text}"  # the notebook that teaches it
        ax.text(x, y, label, ha="center", va="center", fontsize=8, fontweight="bold" if lit else "normal")
        drawn.boxes[name] = patch

    def arrow(a, b, start, end, colour="#333333"):
        ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="->", color=colour, lw=1.3))
        drawn.edges.append((a, b))

    def shape(x, y, text, ha="left"):
        ax.text(x, y, text, fontsize=7.5, color="#1f4e79", va="center", ha=ha, family="monospace")

    blue = "#1f4e79"
    wide, hidden, vocab = n["wide"], n["hidden"], n["vocab"]
    box("tokenizer", STREAM_X + 1.9, 14.0, 5.6, "tokenizer: text -> token ids")
    box("embed", STREAM_X + 1.9, 12.7, 5.6, f"embed_tokens: a row of [{vocab:,}, {hidden}] per id")
    arrow("tokenizer", "embed", (STREAM_X + 1.9, 13.62), (STREAM_X + 1.9, 13.08))
    shape(STREAM_X + 1.05, 13.35, "[1, seq]", ha="right")
    # the residual stream: the spine, from the embedding to the final norm
    top, bottom = 12.3, 3.95
    ax.plot([STREAM_X, STREAM_X], [top, bottom], color=blue, lw=3.2, solid_capstyle="butt")
    drawn.edges.append(("embed", "stream"))
    ax.text(STREAM_X - 0.15, 11.85, f"residual stream\n[1, seq, {hidden}]", fontsize=7.5, color=blue,
            ha="right", va="center")
    # one block: norm -> attention, added in; norm -> MLP, added in
    ax.add_patch(FancyBboxPatch((0.25, 4.55), 11.5, 6.75, boxstyle="round,pad=0.05", fc="none", ec="#888888",
                                ls="--"))
    ax.text(11.7, 4.8, f"one block, {n['layers']} of them (same shape, different weights)", ha="right",
            va="center", fontsize=8.5, style="italic")
    steps = [("input_norm", 10.4, "attention", 9.05, "add_attention", 7.95),
             ("post_norm", 7.15, "mlp", 5.95, "add_mlp", 5.1)]
    for norm, y_norm, sub, y_sub, add, y_add in steps:
        box(norm, BRANCH_X, y_norm, BOX_W, f"RMSNorm ({'input_layernorm' if norm == 'input_norm' else 'post_attention_layernorm'})",
            height=0.55)
        ax.plot([STREAM_X, BRANCH_X - BOX_W / 2 - 0.35], [y_norm, y_norm], color=blue, lw=1.3)
        arrow("stream", norm, (BRANCH_X - BOX_W / 2 - 0.4, y_norm), (BRANCH_X - BOX_W / 2, y_norm), blue)
        height = 1.15 if sub == "attention" else 0.8
        text = (f"attention: {n['heads']} query heads over {n['kv']} K/V heads\nsoftmax(q k^T / sqrt({n['head_dim']}), "
                f"causal) v, then o_proj" if sub == "attention" else
                f"MLP (SwiGLU): down(silu(gate(x)) * up(x))\ngate, up: {hidden} -> {wide:,}; down: -> {hidden}")
        box(sub, BRANCH_X, y_sub, BOX_W, text, height=height)
        arrow(norm, sub, (BRANCH_X, y_norm - 0.3), (BRANCH_X, y_sub + height / 2 + 0.02))
        # the sublayer's output goes back into the stream: down, then left into the "+"
        ax.plot([BRANCH_X, BRANCH_X], [y_sub - height / 2 - 0.02, y_add], color="#333333", lw=1.3)
        arrow(sub, add, (BRANCH_X, y_add), (STREAM_X + 0.2, y_add))
        ax.add_patch(Circle((STREAM_X, y_add), 0.19, fc="white", ec=blue, lw=1.8, zorder=3))
        ax.text(STREAM_X, y_add, "+", ha="center", va="center", fontsize=11, color=blue, zorder=4)
        drawn.edges.append((add, "stream"))
        shape(BRANCH_X + 0.1, (y_sub - height / 2 + y_add) / 2, f"[1, seq, {hidden}]")
    # inside attention: RoPE on q and k, and the shapes of what it computes
    box("rope", 10.0, 9.95, 2.6, "RoPE on q and k", height=0.45)
    arrow("rope", "attention", (8.7, 9.8), (BRANCH_X + BOX_W / 2 + 0.02, 9.35), "#6a3d9a")
    shape(7.8, 9.0, f"q       [1, {n['heads']}, seq, {n['head_dim']}]")
    shape(7.8, 8.68, f"k, v    [1, {n['kv']}, seq, {n['head_dim']}]")
    shape(7.8, 8.36, f"scores  [1, {n['heads']}, seq, seq]")
    group = n["heads"] // n["kv"]
    shape(7.8, 8.04, f"query heads {group}g..{group}g+{group - 1} read K/V head g")
    shape(BRANCH_X + BOX_W / 2 + 0.15, 5.95, f"[1, seq, {wide:,}] inside")
    # after the last block: the final norm reads the stream, the tied LM head gives one score per token
    box("final_norm", STREAM_X + 1.9, 3.6, 5.6, "RMSNorm (norm): the final norm", height=0.55)
    drawn.edges.append(("stream", "final_norm"))
    box("lm_head", STREAM_X + 1.9, 2.45, 5.6, f"lm_head: the same [{vocab:,}, {hidden}] table (tied)")
    arrow("final_norm", "lm_head", (STREAM_X + 1.9, 3.3), (STREAM_X + 1.9, 2.82))
    box("logits", STREAM_X + 1.9, 1.15, 5.6, "logits: a score per token, per position")
    arrow("lm_head", "logits", (STREAM_X + 1.9, 2.08), (STREAM_X + 1.9, 1.52))
    shape(STREAM_X + 4.25, 1.8, f"[1, seq, {vocab:,}]")
    if here is not None:
        anchor = drawn.boxes[HERE[here][0]]  # a tag on the top right corner of the first part this notebook covers
        ax.text(anchor.get_x() + anchor.get_width(), anchor.get_y() + anchor.get_height() + 0.2, "you are here",
                ha="right", va="center", fontsize=9, color=HIGHLIGHT, fontweight="bold")
        title = f"Notebook {here}: the parts it covers, highlighted (shapes for one prompt of seq tokens)"
    else:
        title = "The model, from text to logits (the notebook that teaches each part; shapes for seq tokens)"
    ax.set_title(title, fontsize=10)
    return drawn
