"""A paged KV cache: each sequence's keys and values live in fixed-size blocks, found through a block table.

The contiguous KVCache (notebook 06) reserves `max_len` positions for every sequence up front; most
sequences stop far earlier, so most of that memory never holds a token. A paged cache cuts one pool
into blocks of `block_size` positions and hands a sequence a new block only when its last one is full
(claim C14). A block table per sequence lists which pool block holds which stretch of it:

    7 tokens "The cat sat on the mat ."   block_size = 4      pool, per layer, for K and for V:
                                                             [blocks, kv_heads, block_size, head_dim]
    block table [3, 1]  --- positions 0-3 -> block 3:  The cat sat on
                        '-- positions 4-6 -> block 1:  the mat .  _     <- one empty slot
                                             block 0, 2: free, for any sequence

Position p lives in block `table[p // block_size]`, slot `p % block_size`. The only waste is the
unfilled end of each sequence's last block: fewer than block_size positions per sequence.

Blocks can be shared. fork() gives a new sequence the same block table and raises each block's
reference count, so a common prompt is stored once; a sequence about to write into a block that
another still holds first copies it (copy-on-write). This is the idea of vLLM's PagedAttention.
Here attention itself is unchanged: update() gathers the blocks back into one
`[batch, kv_heads, length, head_dim]` tensor, a copy that a real paged attention kernel avoids.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import CourseError

SHARED = -2  # block_table_grid: a block held by more than one owner
FREE = -1  # block_table_grid: a block nobody holds


class BlockAllocator:
    """Hands out block ids 0 .. num_blocks - 1 from a free list and counts who holds each block."""

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise CourseError(f"A KV pool needs at least 1 block, not {num_blocks}.")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() hands out 0, 1, 2, ... first
        self._refs = [0] * num_blocks  # how many block tables hold each block; 0 = free

    @property
    def num_free(self) -> int:
        return len(self._free)

    def refcount(self, block: int) -> int:
        self._check(block)
        return self._refs[block]

    def allocate(self) -> int:
        """A free block, now held once (reference count 1)."""
        if not self._free:
            raise CourseError(f"the KV pool is out of blocks: all {self.num_blocks} are in use; "
                              "free finished sequences or make a pool with more blocks.")
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def incref(self, block: int) -> None:
        """One more block table holds `block` (it must be in use already)."""
        self._check(block, in_use=True)
        self._refs[block] += 1

    def decref(self, block: int) -> None:
        """One block table lets go of `block`; when nobody holds it, it goes back on the free list."""
        self._check(block, in_use=True)
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free.append(block)

    def free(self, block: int) -> None:
        """Let go of `block`: the same as decref, so a block shared by others stays in use."""
        self.decref(block)

    def _check(self, block: int, in_use: bool = False) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise CourseError(f"block must be a block id from 0 to {self.num_blocks - 1}, not {block!r}.")
        if in_use and self._refs[block] == 0:
            raise CourseError(f"block {block} is free already: only a block that was allocated can be released "
                              "or shared.")


class PagedKVPool:
    """The memory of a paged cache: per layer one K and one V tensor of blocks, allocated once, plus the allocator."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if block_size < 1:
            raise CourseError(f"block_size must be at least 1 position, not {block_size}.")
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks)
        shape = (num_blocks, kv_heads, block_size, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]  # [blocks, kv_heads, block_size, head_dim]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]  # same shape

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int) -> "PagedKVPool":
        """A pool shaped for a ScratchLlama (its layers, KV heads, head size, dtype and device)."""
        cfg = model.cfg
        return cls(cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device)

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    def bytes_per_block(self) -> int:
        """Bytes of K and V that one block holds across all layers."""
        return sum(t[0].numel() * t.element_size() for t in self.keys + self.values)

    def allocated_bytes(self) -> int:
        """Bytes of the blocks in use, each counted once however many sequences share it."""
        return (self.num_blocks - self.allocator.num_free) * self.bytes_per_block()

    def new_cache(self, batch_size: int = 1) -> "PagedSequenceCache":
        """An empty cache for `batch_size` sequences, drawing its blocks from this pool."""
        return PagedSequenceCache(self, batch_size)


class PagedSequenceCache:
    """One batch of sequences in a PagedKVPool: a KVCacheInterface (model/kv_cache.py), as ScratchLlama expects.

    Kept simple: every sequence of the batch has the same `length` (ScratchLlama has one position
    counter for the batch), and padding is not supported (`padded` is False, `pad_mask` is None,
    key_mask() refuses an attention_mask with padding).
    Each sequence still has its own block table, so blocks are shared or copied one sequence at a time.
    """

    padded = False
    pad_mask = None

    def __init__(self, pool: PagedKVPool, batch_size: int = 1):
        if batch_size < 1:
            raise CourseError(f"A paged cache needs batch_size >= 1, not {batch_size}.")
        self.pool = pool
        self.block_tables: list[list[int]] = [[] for _ in range(batch_size)]  # per sequence: pool block ids
        self.length = 0  # positions filled so far, the same for every sequence
        self._ready_for: tuple[int, int] | None = None  # (length, new) whose blocks and slots are prepared
        self._table: torch.Tensor | None = None  # [batch, blocks per sequence] the block tables as one tensor
        self._slots: tuple[torch.Tensor, torch.Tensor] | None = None  # [batch, new] block id and slot to write

    @property
    def batch_size(self) -> int:
        return len(self.block_tables)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write `k`, `v` `[batch, kv_heads, new, head_dim]` at positions length .. length + new - 1 of `layer`.

        Returns the keys and values of all positions so far, `[batch, kv_heads, length + new, head_dim]`,
        gathered from the blocks through the block tables. Call advance(new) once after the last layer.
        """
        if k.shape[0] != self.batch_size:
            raise CourseError(f"This paged cache holds {self.batch_size} sequences, not {k.shape[0]}.")
        new = k.shape[2]
        if self._ready_for != (self.length, new):  # the first layer of a step: find room for `new` positions
            self._prepare(new)
        blocks, slots = self._slots  # [batch, new] each
        # advanced indices on dims 0 and 2 put their shape first: the target is [batch, new, kv_heads, head_dim]
        self.pool.keys[layer][blocks, :, slots] = k.transpose(1, 2)
        self.pool.values[layer][blocks, :, slots] = v.transpose(1, 2)
        end = self.length + new
        return self._gather(self.pool.keys[layer], end), self._gather(self.pool.values[layer], end)

    def _gather(self, pool: torch.Tensor, end: int) -> torch.Tensor:
        b, n = self._table.shape
        _, kv_heads, block_size, head_dim = pool.shape
        picked = pool[self._table]  # [batch, n, kv_heads, block_size, head_dim] each sequence's blocks, in order
        # blocks laid end to end. contiguous(): with block_size 1 the reshape alone would be a view with other
        # strides, and matmul on other strides may add in another order (1e-7 off); laid out like KVCache's
        # tensor, attention runs the same kernels and gives the same bits.
        picked = picked.transpose(1, 2).contiguous().view(b, kv_heads, n * block_size, head_dim)
        return picked[:, :, :end]  # [batch, kv_heads, end, head_dim] the filled positions only

    def _prepare(self, new: int) -> None:
        """Make each sequence own the blocks that positions length .. length + new - 1 fall in.

        Plans first and checks the pool has enough free blocks, so a refusal changes nothing.
        """
        size, alloc = self.pool.block_size, self.pool.allocator
        end = self.length + new
        copies, grow, refs = [], [], {}
        for seq, table in enumerate(self.block_tables):
            if self.length % size:  # the next position falls inside the last block: is it ours alone?
                last = table[-1]
                refs[last] = refs.get(last, alloc.refcount(last))
                if refs[last] > 1:  # shared: this sequence copies it, the others keep it
                    copies.append(seq)
                    refs[last] -= 1
            grow.append(max(0, math.ceil(end / size) - len(table)))
        needed = len(copies) + sum(grow)
        if needed > alloc.num_free:
            raise CourseError(f"the KV pool is out of blocks: this step needs {needed} more and {alloc.num_free} "
                              f"of {alloc.num_blocks} are free; free finished sequences or make a bigger pool.")
        for seq in copies:  # copy-on-write
            old, fresh = self.block_tables[seq][-1], alloc.allocate()
            for t in self.pool.keys + self.pool.values:
                t[fresh] = t[old]
            alloc.decref(old)
            self.block_tables[seq][-1] = fresh
        for seq, count in enumerate(grow):
            self.block_tables[seq].extend(alloc.allocate() for _ in range(count))
        device = self.pool.keys[0].device
        self._table = torch.tensor(self.block_tables, dtype=torch.long, device=device)
        positions = torch.arange(self.length, end, device=device)  # [new]
        self._slots = (self._table[:, positions // size], (positions % size).expand(self.batch_size, new))
        self._ready_for = (self.length, new)

    def key_mask(self, new: int, attention_mask: torch.Tensor | None = None) -> None:
        """The key mask for a call adding `new` positions: always None, as no position is padding.

        An attention_mask that marks padding is refused before anything is written.
        """
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise CourseError("This paged cache does not hold padding: give sequences of equal length without "
                              "padding, or use the contiguous KVCache from model.new_cache().")
        return None

    def advance(self, new: int) -> None:
        """Mark `new` more positions as filled (after every layer has written them)."""
        self.length += new

    def fork(self, seq: int = 0) -> int:
        """Add a sequence that shares sequence `seq`'s blocks (nothing is copied); returns its index.

        Both go on from the same prefix; the first to write into a shared, partly filled last block
        gets a copy of it (copy-on-write), full blocks stay shared for good.
        """
        if not 0 <= seq < self.batch_size:
            raise CourseError(f"seq must be a sequence index from 0 to {self.batch_size - 1}, not {seq}.")
        for block in self.block_tables[seq]:
            self.pool.allocator.incref(block)
        self.block_tables.append(list(self.block_tables[seq]))
        self._ready_for = None  # the batch changed: rebuild the tensor of block tables next step
        return self.batch_size - 1

    def free(self) -> None:
        """Release every block of every sequence (shared blocks stay in use by their other holders)."""
        for table in self.block_tables:
            for block in table:
                self.pool.allocator.decref(block)
            table.clear()
        self.length, self._ready_for = 0, None

    def _blocks_and_fill(self) -> dict[int, int]:
        """block id -> filled slots, each block once however many sequences hold it."""
        size, fill = self.pool.block_size, {}
        for table in self.block_tables:
            for i, block in enumerate(table):
                fill[block] = max(fill.get(block, 0), min(size, max(0, self.length - i * size)))
        return fill

    def used_bytes(self) -> int:
        """Bytes of K and V holding real positions, all layers; a shared block counts once."""
        per_slot = self.pool.bytes_per_block() // self.pool.block_size
        return sum(self._blocks_and_fill().values()) * per_slot

    def allocated_bytes(self) -> int:
        """Bytes of the blocks these sequences hold, filled or not; a shared block counts once."""
        return len(self._blocks_and_fill()) * self.pool.bytes_per_block()


# --------------------------------------------------------------------------- for the plots


def simulate_utilisation(lengths_final: list[int], max_len: int, block_size: int) -> dict:
    """KV memory utilisation (positions holding a token / positions reserved) of two ways to hold requests.

    lengths_final: each request's length (prompt + output tokens) when it finishes.
    reserve_max: every request reserves max_len positions up front (a contiguous cache per request).
    paged: every request holds ceil(length / block_size) blocks of block_size positions.
    Returns tokens, reserve_max_slots, paged_slots, paged_blocks, and the two utilisations (0 to 1).
    """
    if not lengths_final:
        raise CourseError("lengths_final is empty: give the final length of at least one request.")
    if max_len < 1 or block_size < 1:
        raise CourseError(f"max_len and block_size must be at least 1, not {max_len} and {block_size}.")
    if min(lengths_final) < 0 or max(lengths_final) > max_len:
        raise CourseError(f"Every length must be from 0 to max_len = {max_len}; got {min(lengths_final)} "
                          f"to {max(lengths_final)}.")
    tokens = sum(lengths_final)
    blocks = sum(math.ceil(n / block_size) for n in lengths_final)
    reserved, paged = len(lengths_final) * max_len, blocks * block_size
    return {"tokens": tokens, "reserve_max_slots": reserved, "paged_slots": paged, "paged_blocks": blocks,
            "reserve_max_utilisation": tokens / reserved, "paged_utilisation": tokens / paged if paged else 1.0}


def block_table_grid(history, num_blocks: int | None = None) -> np.ndarray:
    """Snapshots of block tables -> `[steps, num_blocks]` int array of who holds each block, for a coloured grid.

    history: a list of (step, block_tables), block_tables being a list of block-id lists (the owner is
    the list's index, e.g. a copy of cache.block_tables) or a dict owner id -> block ids.
    Each cell is the owner id, FREE (-1) for a block nobody holds, SHARED (-2) for one held by several.
    num_blocks defaults to the highest block id seen + 1.
    """
    snapshots = [dict(enumerate(tables)) if isinstance(tables, (list, tuple)) else dict(tables)
                 for _, tables in history]
    seen = [b for snap in snapshots for blocks in snap.values() for b in blocks]
    if num_blocks is None:
        num_blocks = max(seen, default=-1) + 1
    if seen and (min(seen) < 0 or max(seen) >= num_blocks):
        raise CourseError(f"Block ids must be from 0 to num_blocks - 1 = {num_blocks - 1}; "
                          f"got {min(seen)} to {max(seen)}.")
    grid = np.full((len(snapshots), num_blocks), FREE, dtype=np.int64)  # [steps, num_blocks]
    for row, snap in zip(grid, snapshots):
        for owner, blocks in snap.items():
            for b in blocks:
                row[b] = owner if row[b] in (FREE, owner) else SHARED
    return grid
