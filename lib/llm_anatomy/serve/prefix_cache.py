"""Prefix caching: reuse the KV blocks of a prompt prefix that an earlier request already computed (claim C16).

Chat requests start alike: the chat template and the system prompt are the same for every user. The same tokens at
the same positions have the same keys and values, so a server can compute them once and keep their blocks. A full
block is found by a key that hashes its tokens AND the key of the block before it:

    key(block 0) = sha256(tokens of block 0)
    key(block i) = sha256(key(block i - 1) + tokens of block i)

so a key names the whole prefix up to the end of its block: two prompts share block i's key only when they agree
on every token before it. A system prompt that comes first is shared; the same words after a user's question are not.

Only full blocks are shared; the last, partly filled block of a request is its own, since it will be written to.
The cache holds one reference on each block it keeps (BlockAllocator's reference counts), so a block outlives the
request that filled it. When the pool runs short, blocks that only the cache holds are evicted, least recently
used first. (vLLM: `enable_prefix_caching`; SGLang keeps a radix tree of prefixes, RadixAttention.)
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from ..claims import claim
from ..errors import CourseError
from .paged_kv import BlockAllocator


def block_keys(tokens, block_size: int, salt: str = "") -> list[str]:
    """One hex key per FULL block of `tokens` (a trailing partial block gets none), each chained to the one before:
    SHA-256 of the parent key and the block's tokens, the whole digest. A `salt` (one per tenant, as vLLM's
    per-request `cache_salt`) goes into the first block's hash, so only requests with the same salt share blocks:
    another tenant can neither reuse them nor time its own hits to learn what was cached."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise CourseError(f"block_size must be a whole number of positions, at least 1, not {block_size!r}.")
    if not isinstance(salt, str):
        raise CourseError(f"salt must be a string (a tenant's secret), not {type(salt).__name__}.")
    keys, parent = [], (hashlib.sha256(b"salt:" + salt.encode()).digest() if salt else b"")
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = b"".join(int(t).to_bytes(8, "little", signed=True) for t in tokens[start:start + block_size])
        parent = hashlib.sha256(parent + block).digest()
        keys.append(parent.hex())
    return keys


class PrefixCache:
    """Full KV blocks kept after their request, found again by block_keys(); holds one reference on each."""

    def __init__(self, allocator: BlockAllocator, block_size: int):
        self.allocator, self.block_size = allocator, block_size
        self._blocks: OrderedDict[str, int] = OrderedDict()  # key -> block id, least recently used first
        self.query_tokens = 0  # prompt tokens looked up by acquire()
        self.hit_tokens = 0  # of which found in the cache (no prefill needed)

    def __len__(self) -> int:
        return len(self._blocks)

    def blocks(self) -> set[int]:
        """The block ids the cache keeps."""
        return set(self._blocks.values())

    @property
    def hit_rate(self) -> float:
        """Fraction of looked-up prompt tokens found in the cache (0 before any lookup)."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def match(self, tokens) -> list[int]:
        """Block ids holding the longest cached prefix of `tokens`, in order; changes nothing.

        At most len(tokens) - 1 positions are matched: the last token must still run through the model, since its
        logits give the next token.
        """
        found = []
        for key in block_keys(list(tokens)[:max(0, len(tokens) - 1)], self.block_size):
            if key not in self._blocks:
                break
            found.append(self._blocks[key])
        return found

    def acquire(self, tokens) -> list[int]:
        """match(tokens), with one more reference on each block for the request that now holds them."""
        found = self.match(tokens)
        for key in block_keys(list(tokens)[:len(found) * self.block_size], self.block_size):
            self._blocks.move_to_end(key)  # recently used: evicted last
        for block in found:
            self.allocator.incref(block)
        self.query_tokens += len(tokens)
        self.hit_tokens += len(found) * self.block_size
        return found

    def insert(self, tokens, blocks: list[int]) -> int:
        """Keep the full blocks of `tokens`, whose K and V sit in `blocks` (a block table); returns how many are new.

        A key already cached (by another request that computed the same prefix) keeps its block.
        """
        keys = block_keys(list(tokens), self.block_size)
        if len(blocks) < len(keys):
            raise CourseError(f"{len(keys)} full blocks of tokens need a block table of at least {len(keys)} blocks, "
                              f"not {len(blocks)}.")
        added = 0
        for key, block in zip(keys, blocks):
            if key not in self._blocks:
                self.allocator.incref(block)
                self._blocks[key] = block
                added += 1
        return added

    def evictable(self, keep=()) -> int:
        """How many cached blocks only the cache holds (so evict() could free them), not counting those in `keep`."""
        keep = set(keep)
        return sum(1 for b in self._blocks.values() if b not in keep and self.allocator.refcount(b) == 1)

    def evict(self, count: int) -> int:
        """Free up to `count` blocks that only the cache holds, least recently used first; returns how many."""
        freed = 0
        for key, block in list(self._blocks.items()):
            if freed >= count:
                break
            if self.allocator.refcount(block) == 1:
                del self._blocks[key]
                self.allocator.decref(block)
                freed += 1
        return freed

    def clear(self) -> None:
        """Let go of every block (blocks that requests still hold stay in use)."""
        for block in self._blocks.values():
            self.allocator.decref(block)
        self._blocks.clear()


def claim_same_tokens_less_prefill(plain, reused, prefilled_plain: int, prefilled_reused: int):
    """C16 on the same requests served without and with prefix caching: identical outputs, and fewer prompt tokens
    prefilled with it (the engine's own prefill calls, summed). Raises ClaimFailed otherwise: a cache that hands out
    blocks of another prefix (keys not chained to the block before) changes tokens; one that never hits, or that
    reports hits but prefills the prompt all the same, prefills as much as no cache."""
    same = [r.output for r in plain] == [r.output for r in reused]
    hit = sum(r.cached for r in reused)
    return claim("C16", same and prefilled_reused < prefilled_plain,
                 f"identical outputs with and without prefix caching: {same}; prompt tokens prefilled "
                 f"{prefilled_plain} without, {prefilled_reused} with it ({hit} found in the cache)")


def claim_hits_skip_work(hit_rates, ttfts_s, prefilled, cached, prompt_lengths):
    """C16 on a hit-rate sweep (at least two different hit rates): TTFT falls at every step up in hit rate, and each
    request prefilled exactly the tokens the cache did not hold (prefilled = prompt length - cached). Raises
    ClaimFailed otherwise."""
    order = sorted(range(len(hit_rates)), key=lambda i: hit_rates[i])
    falls = all(ttfts_s[j] < ttfts_s[i] for i, j in zip(order, order[1:]) if hit_rates[j] > hit_rates[i])
    skipped = [p - c == f for p, c, f in zip(prompt_lengths, cached, prefilled)]
    return claim("C16", len(set(hit_rates)) > 1 and falls and all(skipped),
                 "TTFT " + ", ".join(f"{1e3 * ttfts_s[i]:.0f} ms at {hit_rates[i]:.0%}" for i in order)
                 + f": falls with every hit rate step {falls}; tokens prefilled = prompt - cached for every request "
                   f"{all(skipped)} (" + ", ".join(f"{prefilled[i]} = {prompt_lengths[i]} - {cached[i]}" for i in order)
                 + ")")
