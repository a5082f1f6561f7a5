"""One command per shard at a time: a start that arrives while a stop of the same shard
waits out its grace takes its turn after it, so that each names itself the cause of what
the shard does next only while it is the one acting on it.

A shard's lock lives only while a command holds or waits for it: an agent that has run
every replica of a busy fleet for months keeps none of theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)


class Turns(Generic[Key]):
    """Locks by key, each dropped once no one holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[Key, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        """Keys with a command holding or waiting for their turn."""
        return len(self._locks)

    def keys(self) -> frozenset[Key]:
        """The keys with a command holding or waiting for their turn."""
        return frozenset(self._locks)

    @contextlib.asynccontextmanager
    async def of(self, key: Key) -> AsyncIterator[None]:
        """Wait for ``key``'s turn, and hold it for the block."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            _, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
