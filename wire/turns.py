"""One holder at a time per key, and no memory of a key no one holds or waits for.

The agent takes one command per shard at a time (``agent.runtime``, the supervisor): a
start that arrives while a stop of the same shard waits out its grace takes its turn after
it. The control plane's report recorder takes one node's reports in turn
(``app.services.agent_reports``). Both key their locks by what a fleet never stops making
(shards of every replica ever placed, node ids a connection claims, proven or not), so a
lock lives only while someone holds or waits for it: months of a busy fleet leave none.
It lives here because ``wire`` is the one package both programs may import
(``tests/unit/test_layers.py``).
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
        """Keys held or waited for now."""
        return len(self._locks)

    def keys(self) -> frozenset[Key]:
        """The keys held or waited for now."""
        return frozenset(self._locks)

    @contextlib.asynccontextmanager
    async def of(self, key: Key) -> AsyncIterator[None]:
        """Wait for ``key``'s turn, in the order asked, and hold it for the block."""
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
