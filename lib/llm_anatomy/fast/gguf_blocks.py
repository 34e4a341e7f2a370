"""The course's model file, read by hand: GGUF tensors and GGML's quantized blocks (claim C17).

The default model ships as a GGUF file in which most matrices are stored in GGML's Q4_1 format:
blocks of 32 weights, each block 20 bytes (an fp16 scale d, an fp16 minimum m, then 32 four-bit
codes), so 5 bits per weight instead of fp32's 32. A weight comes back as

    weight = d * code + m        (Q4_1; Q8_0 has no minimum: weight = d * code, with int8 codes)

`read_gguf_tensor` finds one tensor's bytes in the file (the gguf package parses the header only);
`q4_1_blocks` and `dequantize_gguf` decode them, and the tests check us against the gguf package and
the cached safetensors bit for bit. Sizes are in bytes; weights come back as fp32 `[rows, cols]`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..errors import CourseError

# GGML type -> (weights per block, bytes per block). The course's file holds Q4_1 matrices, one
# Q8_0 matrix (the token embedding, which is also the tied LM head) and F32 norm weights.
GGML_BLOCKS = {"F32": (1, 4), "F16": (1, 2), "Q8_0": (32, 34), "Q4_1": (32, 20)}


def _blocks(raw: np.ndarray, type_name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Check raw bytes against a type (and shape); return them as [n_blocks, bytes per block] uint8."""
    if type_name not in GGML_BLOCKS:
        raise CourseError(f"This lesson dequantizes {', '.join(GGML_BLOCKS)} tensors, not GGML type {type_name}.")
    per_block, block_bytes = GGML_BLOCKS[type_name]
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise CourseError(f"Pass the tensor's raw bytes as a uint8 array, not {raw.dtype}.")
    if shape is not None and (not shape or shape[-1] % per_block):
        raise CourseError(f"A {type_name} row holds whole {per_block}-weight blocks; shape {shape} does not.")
    if shape is not None and raw.size != math.prod(shape) // per_block * block_bytes:
        raise CourseError(f"Shape {shape} in {type_name} takes {math.prod(shape) // per_block * block_bytes:,} "
                          f"bytes, not {raw.size:,}: pass the bytes that read_gguf_tensor() gives.")
    if raw.size % block_bytes:
        raise CourseError(f"{raw.size:,} bytes is not a whole number of {block_bytes}-byte {type_name} blocks.")
    raw = raw.reshape(-1) if raw.flags.writeable else raw.reshape(-1).copy()
    return torch.from_numpy(raw).view(-1, block_bytes)  # GGUF is little-endian, like every common CPU


def q4_1_blocks(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split Q4_1 bytes into each block's scale d, minimum m and 4-bit codes.

    A block is 20 bytes for 32 weights: d (fp16, bytes 0-1), m (fp16, bytes 2-3), then 16 bytes of
    codes. Byte j holds weight j in its low nibble and weight j + 16 in its high nibble.
    Returns d [n_blocks] fp16, m [n_blocks] fp16, codes [n_blocks, 32] uint8 in 0..15.
    """
    blocks = _blocks(raw, "Q4_1")  # [n_blocks, 20]
    d = blocks[:, 0:2].contiguous().view(torch.float16)[:, 0]  # [n_blocks]
    m = blocks[:, 2:4].contiguous().view(torch.float16)[:, 0]  # [n_blocks]
    packed = blocks[:, 4:]  # [n_blocks, 16]
    codes = torch.cat([packed & 0x0F, packed >> 4], dim=1)  # [n_blocks, 32]: weights 0..15, then 16..31
    return d, m, codes


def dequantize_q4_1(raw: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    """Q4_1 bytes -> fp32 weights of `shape` ([rows, cols]): weight = d * code + m, block by block."""
    _blocks(raw, "Q4_1", tuple(shape))
    d, m, codes = q4_1_blocks(raw)
    w = d.float()[:, None] * codes.float() + m.float()[:, None]  # [n_blocks, 32]
    return w.reshape(tuple(shape))


def dequantize_gguf(raw: np.ndarray, shape: tuple[int, ...], type_name: str) -> torch.Tensor:
    """Any tensor of the course's GGUF file -> fp32 [shape]; a CourseError for other GGML types."""
    blocks = _blocks(raw, type_name, tuple(shape))
    if type_name == "Q4_1":
        return dequantize_q4_1(raw, shape)
    if type_name == "Q8_0":  # 34 bytes per block: fp16 scale d, then 32 int8 codes; weight = d * code
        d = blocks[:, 0:2].contiguous().view(torch.float16).float()  # [n_blocks, 1]
        return (d * blocks[:, 2:].view(torch.int8).float()).reshape(tuple(shape))
    dtype = torch.float32 if type_name == "F32" else torch.float16  # plain floats, no blocks
    return blocks.reshape(-1).view(dtype).float().reshape(tuple(shape))


_INDEX: dict[tuple[str, float], dict] = {}  # (path, modification time) -> that file's index


def gguf_index(path: str | Path) -> dict[str, tuple[int, int, tuple[int, ...], str]]:
    """Where each tensor of a GGUF file is: name -> (byte offset, byte count, shape [rows, cols], GGML type)."""
    path = Path(path)
    if not path.is_file():
        raise CourseError(f"No GGUF file at {path}: get the course's with llm_anatomy.weights.ensure_gguf().")
    key = (str(path), path.stat().st_mtime)
    if key not in _INDEX:
        from gguf import GGUFReader  # it parses the header; reading and decoding the blocks is ours

        # GGUF lists dimensions fastest first (columns, then rows); reversed, that is PyTorch's order.
        _INDEX[key] = {t.name: (int(t.data_offset), int(t.n_bytes), tuple(int(n) for n in reversed(t.shape)),
                                t.tensor_type.name) for t in GGUFReader(path).tensors}
    return _INDEX[key]


def read_gguf_tensor(path: str | Path, name: str) -> tuple[np.ndarray, tuple[int, ...], str]:
    """One tensor's raw bytes from a GGUF file: (uint8 [n_bytes], shape [rows, cols], GGML type name)."""
    index = gguf_index(path)
    if name not in index:
        raise CourseError(f"The GGUF file has no tensor {name!r}; names look like 'blk.0.ffn_down.weight'.")
    offset, n_bytes, shape, type_name = index[name]
    return np.fromfile(path, dtype=np.uint8, count=n_bytes, offset=offset), shape, type_name


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's row order of a q or k weight [heads * head_dim, hidden] (num_heads: kv heads for k).

    llama.cpp's RoPE rotates neighbouring pairs (x0, x1), (x2, x3), ...; transformers rotates
    (x_i, x_{i + head_dim/2}). The converter to GGUF reordered each head's rows; this puts them back.
    """
    rows, cols = w.shape
    return w.reshape(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def gguf_summary(path: str | Path) -> dict[str, dict[str, int]]:
    """Per GGML type in the file: {"tensors": how many, "weights": how many numbers, "bytes": on disk}."""
    summary: dict[str, dict[str, int]] = {}
    for _, n_bytes, shape, type_name in gguf_index(path).values():
        row = summary.setdefault(type_name, {"tensors": 0, "weights": 0, "bytes": 0})
        row["tensors"] += 1
        row["weights"] += math.prod(shape)
        row["bytes"] += n_bytes
    return summary
