"""Rotary position embeddings (RoPE), from scratch.

Each query and key vector is cut into pairs of numbers, and each pair is rotated by an angle
proportional to the token's position: pair i turns at frequency theta^(-2i/d). A dot product of
two rotated vectors then depends on the positions only through their difference (claim C3).
We use the same pairing as transformers' Llama code: number j is paired with number j + d/2.
"""

from __future__ import annotations

import torch

from ..errors import CourseError


def rope_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """The rotation speed of each pair, in radians per position: `[head_dim // 2]`, float32."""
    if head_dim % 2:
        raise CourseError(f"RoPE rotates pairs of numbers, so head_dim must be even, not {head_dim}.")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (theta ** exponents)


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float,
                dtype: torch.dtype = torch.float32, inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """The angle, in radians, by which each pair is turned at each position: `[..., seq, head_dim // 2]`.

    Computed in float32 like transformers (so both agree exactly), or in float64 when asked.
    inv_freq: the frequencies already made (and moved to the positions' device), to skip remaking them.
    """
    if inv_freq is None:
        inv_freq = rope_frequencies(head_dim, theta)  # also refuses an odd head_dim
    if dtype == torch.float64:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    return positions.to(inv_freq.dtype)[..., None] * inv_freq.to(positions.device)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype = torch.float32,
                 inv_freq: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every angle: `[..., seq, head_dim]` for positions `[..., seq]`."""
    precision = torch.float64 if dtype == torch.float64 else torch.float32
    angles = rope_angles(positions, head_dim, theta, precision, inv_freq)  # [..., seq, head_dim/2]
    angles = torch.cat([angles, angles], dim=-1)  # the same angle for j and j + d/2
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    if x.shape[-1] % 2:
        raise CourseError(f"rotate_half needs an even last dimension, not {x.shape[-1]}.")
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[batch, heads, seq, head_dim]` by angles given as cos/sin `[batch, seq, head_dim]`."""
    if x.shape[-1] != cos.shape[-1] or x.shape[-2] != cos.shape[-2]:
        raise CourseError(f"x {tuple(x.shape)} and cos {tuple(cos.shape)} must agree on seq and head_dim: "
                          "make cos/sin for the same positions and head size.")
    if cos.dim() == 2:  # [seq, head_dim], the same positions for the whole batch
        cos, sin = cos[None], sin[None]
    cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
    return x * cos + rotate_half(x) * sin


def rotate_2d(pair: torch.Tensor, angle: float | torch.Tensor) -> torch.Tensor:
    """Turn 2-D points `[..., 2]` counter-clockwise by `angle` radians: what RoPE does to each pair."""
    angle = torch.as_tensor(angle, dtype=pair.dtype)
    c, s = torch.cos(angle), torch.sin(angle)
    x, y = pair[..., 0], pair[..., 1]
    return torch.stack([x * c - y * s, x * s + y * c], dim=-1)
