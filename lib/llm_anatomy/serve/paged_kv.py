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

Position p lives in block `table[p // block_size]`, slot `p % block_size`; n positions need
`blocks_for(n, block_size)` = ceil(n / block_size) blocks. The only waste is the unfilled end of each
sequence's last block: fewer than block_size positions per sequence.

Blocks can be shared. fork() gives a new sequence the same block table and raises each block's
reference count, so a common prompt is stored once; a sequence about to write into a block that
another still holds first copies it (copy-on-write). This is the idea of vLLM's PagedAttention.

One reader of the pool, `RaggedPagedView` (made per model call by the model runner, per step by PagedSequenceCache),
gathers each row's blocks into one `[rows, kv_heads, length, head_dim]` tensor for attention: a copy that
paged_attention.py shows how to avoid. The view computes from its rows what the model needs besides the cache: the
rectangle's padding mask (`mask`) and each new token's position (`positions`); whoever builds it passes both to the
model (`positions=view.positions, attention_mask=view.mask`). The caches store and attend; the positions and the mask
are the batch's. `PagedKVPool.allocate` hands out every block, all or none.
"""

from __future__ import annotations

import torch

from ..claims import claim
from ..errors import CourseError
from ..model.kv_cache import KVCacheInterface


def blocks_for(positions: int, block_size: int) -> int:
    """Blocks that hold `positions` positions: ceil(positions / block_size)."""
    return -(-positions // block_size)


def slot_mapping(tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Each position's slot in the pool, flat over the blocks (vLLM's slot_mapping): block tables[r, p // block_size]
    x block_size + p % block_size. tables: [rows, blocks]; positions: [rows, width] >= 0. Returns [rows, width]."""
    return tables.gather(1, positions // block_size) * block_size + positions % block_size


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

    free = decref  # let go of a block: one holder less, so a block shared by others stays in use

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
        shape = (num_blocks, kv_heads, block_size, head_dim)  # [blocks, kv_heads, block_size, head_dim]
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

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

    def allocate(self, count: int) -> list[int]:
        """`count` free blocks, each now held once: all of them, or none (a refusal changes nothing)."""
        free = self.allocator.num_free
        if count > free:
            raise CourseError(f"the KV pool is out of blocks: this step needs {count} more and {free} of "
                              f"{self.num_blocks} are free; free finished sequences or make a bigger pool.")
        return [self.allocator.allocate() for _ in range(count)]

    def missing(self, table: list[int], positions: int) -> int:
        """How many more blocks a block table needs to hold `positions` positions."""
        return max(0, blocks_for(positions, self.block_size) - len(table))

    def extend(self, tables: list[list[int]], positions: list[int]) -> None:
        """Give each block table the blocks for its sequence's `positions`, all or none."""
        needs = [self.missing(t, p) for t, p in zip(tables, positions)]
        fresh = iter(self.allocate(sum(needs)))
        for table, need in zip(tables, needs):
            table.extend(next(fresh) for _ in range(need))

    def new_cache(self, batch_size: int = 1) -> "PagedSequenceCache":
        """An empty cache for `batch_size` sequences, drawing its blocks from this pool."""
        return PagedSequenceCache(self, batch_size)


class RaggedPagedView(KVCacheInterface):
    """One model call over rows of different lengths in a PagedKVPool: the cache interface ScratchLlama expects.

    Row i has `lengths[i]` positions cached in the blocks of `tables[i]` (room for the new ones too) and adds
    `news[i]` (a decode: 1; a prompt chunk: more). Rows are right-aligned in one rectangle, and a row with fewer new
    tokens than the widest is fed pad tokens first (their queries ignored, their keys replaced by the row's cached
    ones). What the model needs besides the cache is computed here from the rows, as data for the caller to pass:
    mask `[rows, width]` (False: a row's front padding; None when there is none) and positions `[rows, new]` (every
    new token at its own position). update() writes the new K and V into the blocks (write) and gathers every row's
    keys and values back (read): the pool's one writer and one reader, which the flattened step (flat_step.py) uses too.
    """

    def __init__(self, pool: PagedKVPool, tables: list[list[int]], lengths: list[int], news: list[int]):
        self.pool, self.batch_size = pool, len(tables)
        device, size = pool.keys[0].device, pool.block_size
        news_t = torch.tensor(news, device=device)  # [rows]
        self.ends = [a + b for a, b in zip(lengths, news)]  # each row's positions after this call
        ends = torch.tensor([a + b for a, b in zip(lengths, news)], device=device)  # [rows]
        width, new = int(ends.max()), max(news)
        past = width - new  # the rectangle's columns before the new ones
        cols = torch.arange(width, device=device)  # [width]
        pos = cols - (width - ends)[:, None]  # [rows, width] each row's position in each column; < 0 = padding
        self.mask = (pos >= 0) if bool((pos < 0).any()) else None  # [rows, width] False = padding
        pos = pos.clamp(min=0)
        self.positions = pos[:, past:]  # [rows, new] each new token's RoPE position (a pad token's: 0)
        table_width = max(len(t) for t in tables)
        table = torch.tensor([t + t[:1] * (table_width - len(t)) for t in tables], device=device)  # [rows, blocks]
        flat = slot_mapping(table, pos, size)  # [rows, width] each position's slot in the pool
        self.block_ids, self.slots = flat // size, flat % size  # [rows, width] each: block, offset in it
        real_new = cols[past:][None] >= (width - news_t)[:, None]  # [rows, new] True: a real new token
        self.write_rows, self.write_cols = real_new.nonzero(as_tuple=True)  # [written] each
        self.write_blocks = self.block_ids[:, past:][real_new]  # [written]
        self.write_slots = self.slots[:, past:][real_new]  # [written]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write `k`, `v` `[rows, kv_heads, new, head_dim]`; return every position `[rows, kv_heads, width, d]`."""
        rows, cols = self.write_rows, self.write_cols
        self.write(layer, k.transpose(1, 2)[rows, cols], v.transpose(1, 2)[rows, cols])
        return self.read(layer)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the real new tokens' `k`, `v` `[written, kv_heads, head_dim]`, row by row in order, in their slots."""
        keys, values = self.pool.keys[layer], self.pool.values[layer]  # [blocks, kv_heads, block_size, d]
        keys[self.write_blocks, :, self.write_slots], values[self.write_blocks, :, self.write_slots] = k, v

    def read(self, layer: int, row: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's keys and values gathered from its blocks, `[rows, kv_heads, width, head_dim]` (padding in front
        of the shorter rows); or one row's own positions only, `[1, kv_heads, its length, head_dim]`."""
        blocks, slots = self.block_ids, self.slots  # [rows, width] each
        if row is not None:
            start = blocks.shape[1] - self.ends[row]  # right-aligned: the row's positions are its last columns
            blocks, slots = blocks[row:row + 1, start:], slots[row:row + 1, start:]
        # contiguous(): the same memory layout as KVCache's tensor, so attention adds in the same order
        return (self.pool.keys[layer][blocks, :, slots].transpose(1, 2).contiguous(),
                self.pool.values[layer][blocks, :, slots].transpose(1, 2).contiguous())

    def advance(self, new: int) -> None:
        """Nothing to do: whoever made the view counts each row's positions."""


class PagedSequenceCache(KVCacheInterface):
    """One batch of sequences in a PagedKVPool: a KVCacheInterface (model/kv_cache.py), as ScratchLlama expects.

    Kept simple: every sequence has the same `length` (one honest count of the positions cached, which the model
    places new tokens after). A left-padded batch is served as by the contiguous KVCache: the caller's attention_mask
    hides the padding, and grows by a column each decode step (generate/decode.py, extend_mask). Each sequence still
    has its own block table, so blocks are shared or copied one at a time.
    """

    def __init__(self, pool: PagedKVPool, batch_size: int = 1):
        if batch_size < 1:
            raise CourseError(f"A paged cache needs batch_size >= 1, not {batch_size}.")
        self.pool = pool
        self.block_tables: list[list[int]] = [[] for _ in range(batch_size)]  # per sequence: pool block ids
        self.length = 0  # positions filled so far, the same for every sequence
        self._view: RaggedPagedView | None = None  # this step's reader of the pool
        self._ready_for: tuple[int, int] | None = None  # (length, new) that the view was made for

    @property
    def batch_size(self) -> int:
        return len(self.block_tables)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write `k`, `v` `[batch, kv_heads, new, head_dim]` at positions length .. length + new - 1 of `layer`;
        returns every position so far, `[batch, kv_heads, length + new, head_dim]`. advance(new) after the last layer.
        """
        if k.shape[0] != self.batch_size:
            raise CourseError(f"This paged cache holds {self.batch_size} sequences, not {k.shape[0]}.")
        new = k.shape[2]
        if self._ready_for != (self.length, new):  # the first layer of a step: find room for `new` positions
            self._prepare(new)
        return self._view.update(layer, k, v)

    def _prepare(self, new: int) -> None:
        """Make each sequence own the blocks of positions length .. length + new - 1 (all taken at once, so a
        refusal changes nothing), then the view that reads them."""
        alloc, tables = self.pool.allocator, self.block_tables
        copies, refs = [], {}
        for seq, table in enumerate(tables):
            if self.length % self.pool.block_size:  # the next position falls inside the last block: ours alone?
                last = table[-1]
                refs[last] = refs.get(last, alloc.refcount(last))
                if refs[last] > 1:  # shared: this sequence copies it, the others keep it
                    copies.append(seq)
                    refs[last] -= 1
        grow = [self.pool.missing(table, self.length + new) for table in tables]
        fresh = iter(self.pool.allocate(len(copies) + sum(grow)))
        for seq in copies:  # copy-on-write
            old, copy = tables[seq][-1], next(fresh)
            for t in self.pool.keys + self.pool.values:
                t[copy] = t[old]
            alloc.decref(old)
            tables[seq][-1] = copy
        for table, count in zip(tables, grow):
            table.extend(next(fresh) for _ in range(count))
        self._view = RaggedPagedView(self.pool, tables, [self.length] * self.batch_size, [new] * self.batch_size)
        self._ready_for = (self.length, new)

    def advance(self, new: int) -> None:
        """Mark `new` more positions as filled (after every layer has written them)."""
        self.length += new

    def fork(self, seq: int = 0) -> int:
        """Add a sequence that shares sequence `seq`'s blocks (nothing is copied); returns its index. The first to
        write into a shared, partly filled last block gets a copy of it (copy-on-write); full blocks stay shared."""
        if not 0 <= seq < self.batch_size:
            raise CourseError(f"seq must be a sequence index from 0 to {self.batch_size - 1}, not {seq}.")
        for block in self.block_tables[seq]:
            self.pool.allocator.incref(block)
        self.block_tables.append(list(self.block_tables[seq]))
        self._ready_for = None  # the batch changed: make a new view next step
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


def claim_paged_equals_contiguous(tokens_paged: torch.Tensor, tokens_flat: torch.Tensor, logits_paged: torch.Tensor,
                                  logits_flat: torch.Tensor, block_tables: list[list[int]]):
    """C14, the paged cache is the same cache: greedy tokens `[rows, n]` identical and every step's logits
    `[n, rows, vocab]` equal to the last bit (0.0 apart) with a paged and with a contiguous cache, in fp32, for two or
    more sequences that shared one pool and took turns, whose `block_tables` (one per sequence, as the run left them)
    hold disjoint blocks and are not all the identity 0, 1, 2, ... A reader that takes a position from the wrong slot
    or block, a pool that stores K and V in another dtype, or a cache that ignores its block table (slot = position:
    the sequences then overwrite each other's slots) fails it; so does evidence that could not show the table being
    used (one sequence, or tables that are all 0, 1, 2, ..., where slot = position gives the same slots). Raises
    ClaimFailed otherwise."""
    same = torch.equal(tokens_paged, tokens_flat)
    diff = (logits_paged - logits_flat).abs().max().item()
    blocks = [b for table in block_tables for b in table]
    shared_pool = len(block_tables) >= 2 and len(blocks) == len(set(blocks))
    scattered = any(list(table) != list(range(len(table))) for table in block_tables)
    return claim("C14", same and diff == 0.0 and shared_pool and scattered,
                 f"paged and contiguous caches: identical tokens {same}, max |logit difference| {diff} over "
                 f"{len(logits_paged)} steps of {len(block_tables)} sequences in one pool, block tables {block_tables} "
                 f"(disjoint: {shared_pool}; not all 0, 1, 2, ...: {scattered})")
