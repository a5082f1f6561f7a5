"""KV-cache block accounting: shared prompt blocks, reuse, eviction and reset."""

from __future__ import annotations

import pytest

from agent.simulator.kv_cache import KvCache, prompt_block_hashes


def test_only_full_blocks_are_named_and_each_name_depends_on_everything_before_it() -> None:
    repeated = ("x", "y") * 4

    hashes = prompt_block_hashes((*repeated, "tail"), block_size=2)

    assert len(hashes) == 4
    assert len(set(hashes)) == 4
    assert prompt_block_hashes(("X", *repeated[1:]), block_size=2)[-1] != hashes[-1]


def test_requests_with_the_same_prompt_share_its_blocks() -> None:
    cache = KvCache(num_blocks=10)
    hashes = prompt_block_hashes(tuple("abcdefgh"), block_size=4)

    first = cache.try_allocate(hashes, total_blocks=3)
    second = cache.try_allocate(hashes, total_blocks=3)

    assert first is not None
    assert second is not None
    assert (first.hit_blocks, second.hit_blocks) == (0, 2)
    assert cache.blocks_in_use == 4  # two shared prompt blocks and one private block each


def test_blocks_released_by_their_last_holder_stay_cached_but_count_as_free() -> None:
    cache = KvCache(num_blocks=4)
    hashes = prompt_block_hashes(tuple("abcdefgh"), block_size=4)
    allocation = cache.try_allocate(hashes, total_blocks=3)
    assert allocation is not None

    cache.release(allocation)

    assert (cache.blocks_in_use, cache.free_blocks, cache.cached_blocks) == (0, 4, 2)
    assert cache.cached_prefix_blocks(hashes) == 2


def test_an_allocation_that_does_not_fit_takes_nothing() -> None:
    cache = KvCache(num_blocks=4)
    held = cache.try_allocate((), total_blocks=3)

    refused = cache.try_allocate((), total_blocks=2)

    assert held is not None
    assert refused is None
    assert cache.blocks_in_use == 3


def test_reset_forgets_cached_blocks_and_frees_shared_ones_once() -> None:
    cache = KvCache(num_blocks=10)
    hashes = prompt_block_hashes(tuple("abcdefgh"), block_size=4)
    first = cache.try_allocate(hashes, total_blocks=3)
    second = cache.try_allocate(hashes, total_blocks=3)
    assert first is not None
    assert second is not None

    cache.reset()

    assert cache.cached_prefix_blocks(hashes) == 0
    assert cache.blocks_in_use == 4
    cache.release(first)
    assert cache.blocks_in_use == 3  # the shared blocks are still held by the second
    cache.release(second)
    assert cache.usage == pytest.approx(0.0)
