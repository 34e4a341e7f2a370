"""Pictures of the whole model (notebook 04): a block diagram with tensor shapes, and where the parameters sit.

`draw_block_diagram(cfg)` draws a ScratchConfig (or a transformers Llama config) as boxes from token ids to logits,
one block opened up, each arrow labelled with the shape of the tensor it carries. `parameter_groups(model)` counts a
model's parameters by role, each tensor once (a tied LM head is the embedding table, so it is not counted again).
"""

from __future__ import annotations

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


def draw_block_diagram(cfg, ax=None):
    """Draw the model, token ids to logits, with the shape of every tensor between the boxes. Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    n = _numbers(cfg)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 10))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 14)
    ax.axis("off")
    stream = f"[1, seq, {n['hidden']}]"
    boxes = [  # (y, text, colour); the residual stream runs down the left at x = 1.2
        (13.2, "token ids", "#eeeeee"),
        (11.9, f"embed_tokens: a row of the table [{n['vocab']:,}, {n['hidden']}] per id", "#cfe2f3"),
        (10.4, "RMSNorm (input_layernorm)", "#fff2cc"),
        (9.1, f"attention: q {n['heads']} heads, k and v {n['kv']} heads of {n['head_dim']}; RoPE on q, k;\n"
              f"softmax(q k^T / sqrt({n['head_dim']}), causal) v; o_proj back to {n['hidden']}", "#d9ead3"),
        (7.5, "RMSNorm (post_attention_layernorm)", "#fff2cc"),
        (6.2, f"MLP: gate and up to {n['wide']:,}, silu(gate) * up, down to {n['hidden']}", "#f4cccc"),
        (4.2, "RMSNorm (norm)", "#fff2cc"),
        (2.9, f"lm_head: the same table [{n['vocab']:,}, {n['hidden']}] (tied), a score per token", "#cfe2f3"),
        (1.4, "logits: next-token scores at every position", "#eeeeee"),
    ]
    for y, text, colour in boxes:
        ax.add_patch(FancyBboxPatch((2.2, y - 0.45), 7.3, 0.9, boxstyle="round,pad=0.05", fc=colour, ec="#555555"))
        ax.text(5.85, y, text, ha="center", va="center", fontsize=8.5)
    arrow = dict(arrowstyle="->", color="#333333")
    shapes = {13.2: "[1, seq]", 11.9: stream, 9.1: stream, 6.2: stream, 4.2: stream, 2.9: f"[1, seq, {n['vocab']:,}]"}
    for (y0, _, _), (y1, _, _) in zip(boxes, boxes[1:]):
        ax.annotate("", xy=(5.85, y1 + 0.5), xytext=(5.85, y0 - 0.5), arrowprops=arrow)
        if y0 in shapes:
            ax.text(6.0, (y0 + y1) / 2, shapes[y0], fontsize=7.5, color="#1f4e79", va="center")
    # the residual stream: added to after attention and after the MLP
    ax.plot([1.2, 1.2], [11.3, 4.8], color="#1f4e79", lw=2)
    for y_from, y_to in [(9.1, 8.3), (6.2, 5.3)]:
        ax.annotate("", xy=(1.35, y_to), xytext=(2.2, y_from), arrowprops=dict(arrowstyle="->", color="#1f4e79"))
        ax.text(0.55, y_to, "x +", fontsize=9, color="#1f4e79", va="center")
    ax.annotate("", xy=(2.2, 10.4), xytext=(1.2, 10.4), arrowprops=dict(arrowstyle="->", color="#1f4e79"))
    ax.annotate("", xy=(2.2, 7.5), xytext=(1.2, 7.5), arrowprops=dict(arrowstyle="->", color="#1f4e79"))
    ax.text(0.05, 11.5, "residual\nstream", fontsize=8, color="#1f4e79")
    ax.add_patch(FancyBboxPatch((0.3, 4.95), 9.5, 6.05, boxstyle="round,pad=0.05", fc="none", ec="#888888", ls="--"))
    ax.text(9.7, 10.75, f"one block, repeated {n['layers']} times", ha="right", fontsize=9, style="italic")
    ax.set_title("The model, from token ids to logits (shapes for one prompt of seq tokens)", fontsize=10)
    return ax
