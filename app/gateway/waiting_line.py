"""The requests waiting for a replica (``Waiter``): a line per model, fair across API keys
(``app.gateway.fairqueue``), bounded in all by ``limit``.

A full line is shared evenly among the keys that want it (``make_room_for``): one key's
flood cannot lock the others out of it. The line only keeps the waiters and their counts;
the router (``app.gateway.router``) decides who is granted a replica, refused or held, and
settles their futures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from app.gateway.admission import ReplicaState
from app.gateway.fairqueue import FairQueue
from app.gateway.replica_pools import Choice, RouteReason
from app.gateway.waiter import Waiter, waits_for_its_own


class WaitingLine:
    """Waiters per model, at most ``limit`` of them in all."""

    __slots__ = ("_by_key", "_queues", "limit", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._queues: dict[str, FairQueue[Waiter]] = {}
        self.size = 0
        """How many requests wait, in all: read it, never set it. An attribute, not a
        method: the router reads it at every lease's first byte and release."""
        self._by_key: Counter[str] = Counter()

    def waits_for(self, model: str) -> bool:
        """Whether a request for ``model`` waits."""
        return model in self._queues

    def full(self) -> bool:
        return self.size >= self.limit

    def models(self) -> list[str]:
        """The models with requests waiting, as a list taken now."""
        return list(self._queues)

    def waiters(self, model: str) -> Iterable[Waiter]:
        """The waiters of ``model`` (none if it has none)."""
        return self._queues.get(model, ())

    def counts(self) -> dict[str, int]:
        """Waiters per model."""
        return {model: len(queue) for model, queue in self._queues.items()}

    def push(self, waiter: Waiter) -> None:
        self._queues.setdefault(waiter.model, FairQueue()).push(waiter.key_id, waiter)
        self.size += 1
        self._by_key[waiter.key_id] += 1

    def pop_grantable(
        self, model: str, choose: Callable[[Waiter], Choice]
    ) -> tuple[Waiter, tuple[ReplicaState, RouteReason]] | None:
        """Take the first waiter of ``model``, in fair order, that ``choose`` finds a
        replica for, with that choice; ``None`` when there is none."""
        queue = self._queues.get(model)
        if queue is None:
            return None
        granted = queue.pop_first(choose, waits_for_its_own)
        if granted is not None:
            self._taken(queue, granted[0])
        return granted

    def make_room_for(self, key_id: str) -> Waiter | None:
        """The line is full: the key with the most requests waiting gives up its newest to
        ``key_id`` when that leaves it with no fewer than ``key_id`` then has. A full line
        so ends up shared evenly among the keys that want it. The waiter taken out to make
        room, or ``None`` when none was."""
        heaviest, most = max(self._by_key.items(), key=lambda item: item[1])
        if most < self._by_key[key_id] + 2:
            return None
        newest = [
            waiter
            for queue in self._queues.values()
            if (waiter := queue.newest(heaviest)) is not None
        ]
        victim = max(newest, key=lambda waiter: waiter.enqueued_at)
        queue = self._queues[victim.model]
        queue.remove(heaviest, victim)
        self._taken(queue, victim)
        return victim

    def remove(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out (it gave up); whether it was still waiting."""
        queue = self._queues.get(waiter.model)
        if queue is None or not queue.remove(waiter.key_id, waiter):
            return False
        self._taken(queue, waiter)
        return True

    def take_out(self, model: str, which: Callable[[Waiter], bool]) -> list[Waiter]:
        """Take out the waiters of ``model`` that ``which`` picks, and return them."""
        queue = self._queues.get(model)
        if queue is None:
            return []
        taken = [waiter for waiter in queue if which(waiter)]
        for waiter in taken:
            queue.remove(waiter.key_id, waiter)
            self._taken(queue, waiter)
        return taken

    def take_all(self) -> list[Waiter]:
        """Empty the line, and return who waited."""
        taken: list[Waiter] = []
        for queue in self._queues.values():
            while queue:
                taken.append(queue.pop())
        self._queues.clear()
        self.size = 0
        self._by_key.clear()
        return taken

    def _taken(self, queue: FairQueue[Waiter], waiter: Waiter) -> None:
        """``waiter`` left ``queue``: counted out, and an emptied queue forgotten."""
        self.size -= 1
        left = self._by_key[waiter.key_id] - 1
        if left > 0:
            self._by_key[waiter.key_id] = left
        else:
            del self._by_key[waiter.key_id]
        if not queue:
            del self._queues[waiter.model]
