"""Solutions to the exercises of notebook 08 (serving many users)."""

from __future__ import annotations

import hashlib


class MyAllocator:
    """Exercise 8.1: a free list and a count of holders per block."""

    def __init__(self, num_blocks):
        self.free = list(range(num_blocks))  # block ids nobody holds
        self.refs = [0] * num_blocks  # how many requests hold each block

    def allocate(self):
        if not self.free:
            raise RuntimeError("no free block")
        block = self.free.pop()
        self.refs[block] = 1
        return block

    def share(self, block):
        if self.refs[block] == 0:
            raise RuntimeError(f"block {block} is free")
        self.refs[block] += 1

    def release(self, block):
        if self.refs[block] == 0:
            raise RuntimeError(f"block {block} is free already")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)


def admit(arrivals, blocks_needed, running, free_blocks, max_batch, now):
    """Exercise 8.2: how many requests at the head of the queue join the batch now."""
    joined = 0
    for arrival, need in zip(arrivals, blocks_needed):
        if arrival > now or running + joined >= max_batch or need > free_blocks:
            break
        free_blocks -= need
        joined += 1
    return joined


def block_keys(tokens, block_size):
    """Exercise 8.3: one key per full block, each hashing the key before it and the block's tokens."""
    keys, parent = [], ""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hashlib.sha256((parent + str(tokens[start:start + block_size])).encode()).hexdigest()
        keys.append(parent)
    return keys


def slot_mapping(block_tables, positions, block_size):
    """Exercise 8.4: the pool slot of each new position, request by request (vLLM's slot_mapping)."""
    slots = []
    for table, request_positions in zip(block_tables, positions):
        for p in request_positions:
            slots.append(table[p // block_size] * block_size + p % block_size)
    return slots


def plan_iteration(rows, budget, free_blocks, block_size):
    """Exercise 8.5: one scheduler iteration: decodes first, prompt chunks under the budget, the youngest preempted
    while the rows need more blocks than are free."""
    import math

    live, preempted = list(range(len(rows))), []
    while True:
        decoders = [i for i in live if rows[i][1] == 1 and rows[i][0] > 0]  # all cached but the newest token
        left = math.inf if budget is None else budget - len(decoders)
        chunks = []
        for i in live:
            if i not in decoders and left > 0:
                chunks.append((i, min(rows[i][1], left)))
                left -= chunks[-1][1]
        need = sum(max(0, math.ceil((rows[i][0] + n) / block_size) - rows[i][2])
                   for i, n in [(i, 1) for i in decoders] + chunks)
        if need <= free_blocks or len(live) <= 1:
            return decoders, chunks, preempted
        victim = live.pop()  # the youngest
        preempted.append(victim)
        free_blocks += rows[victim][2]
