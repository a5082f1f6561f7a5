"""One holder at a time per key, and no memory of a key no one holds or waits for.

The report recorder takes one node's reports in turn (``app.services.agent_reports``).
Node ids come from connections, a claimed one from a connection that could not prove it:
a lock kept per id for ever would grow with every node that ever connected and every name
a refused certificate claimed. A key's lock lives only while someone holds or waits for
it. (The agent keeps its shards' turns the same way, ``agent.turns``; the programs share
no code but the wire's.)
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
