"""KV-cache blocks with a prefix cache, as a paged-attention engine keeps them.

The cache has ``num_blocks`` blocks. A request holds the blocks it was admitted with
until it finishes or is aborted. Every *full* block of a prompt is named by a chained
hash (the block's tokens and the hash of the block before it), so a block can only be
shared by prompts that agree on everything up to and including it: identical prompts
share all their full blocks, prompts that differ in their first token share none.

A cached block nobody holds stays in the cache, reusable, until its space is needed;
then the least recently released one is evicted first. A request releases its blocks
last-to-first so that the tail of a prompt is evicted before its head.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def prompt_block_hashes(tokens: Sequence[str], block_size: int) -> tuple[int, ...]:
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, *tokens[start : start + block_size]))
        hashes.append(parent)
    return tuple(hashes)


class BlockAllocation:
    """The blocks one request holds: shared cached blocks and blocks of its own."""

    __slots__ = ("cached", "generation", "hit_blocks", "private")

    def __init__(self, *, cached: list[int], private: int, hit_blocks: int, generation: int):
        self.cached = cached
        self.private = private
        self.hit_blocks = hit_blocks
        self.generation = generation


class KvCache:
    def __init__(self, num_blocks: int) -> None:
        self._num_blocks = num_blocks
        self._refcounts: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._private_in_use = 0
        # A reset bumps the generation. Blocks held across it are no longer cached: they
        # count as private, and are freed when their last holder releases them.
        self._generation = 0
        self._detached: dict[tuple[int, int], int] = {}

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def blocks_in_use(self) -> int:
        return self._private_in_use + len(self._refcounts) - len(self._evictable)

    @property
    def free_blocks(self) -> int:
        """Blocks a new request could take: empty ones and cached ones nobody holds."""
        return self._num_blocks - self.blocks_in_use

    @property
    def cached_blocks(self) -> int:
        return len(self._refcounts)

    @property
    def usage(self) -> float:
        return self.blocks_in_use / self._num_blocks

    def cached_prefix_blocks(self, hashes: Sequence[int]) -> int:
        hits = 0
        for block_hash in hashes:
            if block_hash not in self._refcounts:
                break
            hits += 1
        return hits

    def try_allocate(self, hashes: Sequence[int], total_blocks: int) -> BlockAllocation | None:
        """Take ``total_blocks`` blocks for a prompt whose full blocks are ``hashes``,
        reusing its cached prefix; ``None`` when they do not fit now."""
        hits = self.cached_prefix_blocks(hashes)
        reviving = sum(1 for block_hash in hashes[:hits] if block_hash in self._evictable)
        new_blocks = total_blocks - hits
        if new_blocks + reviving > self.free_blocks:
            return None
        for block_hash in hashes[:hits]:
            self._refcounts[block_hash] += 1
            self._evictable.pop(block_hash, None)
        self._evict(new_blocks - self._empty_blocks())
        cached = list(hashes[:hits])
        for block_hash in hashes[hits:]:
            # A block whose parent was evicted can outlive it; it cannot be reached any
            # more, so this request computes its own copy privately.
            if block_hash not in self._refcounts:
                self._refcounts[block_hash] = 1
                cached.append(block_hash)
        private = total_blocks - len(cached)
        self._private_in_use += private
        return BlockAllocation(
            cached=cached, private=private, hit_blocks=hits, generation=self._generation
        )

    def release(self, allocation: BlockAllocation) -> None:
        if allocation.generation != self._generation:
            self._release_detached(allocation)
            return
        for block_hash in reversed(allocation.cached):
            remaining = self._refcounts[block_hash] - 1
            self._refcounts[block_hash] = remaining
            if remaining == 0:
                self._evictable[block_hash] = None
        self._private_in_use -= allocation.private

    def reset(self) -> None:
        """Forget every cached block; blocks still held stay in use, uncached."""
        self._private_in_use = self.blocks_in_use
        for block_hash, holders in self._refcounts.items():
            if holders:
                self._detached[(self._generation, block_hash)] = holders
        self._refcounts.clear()
        self._evictable.clear()
        self._generation += 1

    def _release_detached(self, allocation: BlockAllocation) -> None:
        freed = allocation.private
        for block_hash in allocation.cached:
            key = (allocation.generation, block_hash)
            remaining = self._detached[key] - 1
            if remaining:
                self._detached[key] = remaining
            else:
                del self._detached[key]
                freed += 1
        self._private_in_use -= freed

    def _empty_blocks(self) -> int:
        return self._num_blocks - self._private_in_use - len(self._refcounts)

    def _evict(self, count: int) -> None:
        for _ in range(max(count, 0)):
            block_hash, _ = self._evictable.popitem(last=False)
            del self._refcounts[block_hash]
