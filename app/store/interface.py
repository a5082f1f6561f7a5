"""The event store's interface, shared by the PostgreSQL and the in-memory store."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Protocol
from uuid import UUID, uuid4

import msgspec

from app.domain.envelope import Meta, Recorded
from app.domain.events import AnyEvent
from app.domain.replica_listing import WHOLE_LIST, ReplicaPage
from app.domain.state import ClusterState, Replica, ReplicaFilter

NO_STREAM = 0
"""Expected version of a stream that must not exist yet (versions start at 1)."""


class NewEvent(msgspec.Struct, frozen=True):
    """An event to append. ``event_id`` is the idempotency key: appending the same id twice
    stores one event."""

    event: AnyEvent
    event_id: UUID = msgspec.field(default_factory=uuid4)


StillHolds = Callable[[ClusterState], str | None]
"""A check of a batch on the state it would leave: None, or the stream whose change since the
batch was decided makes it wrong (see ``EventStore.append_many``)."""


class AppendRequest(msgspec.Struct, frozen=True):
    """Events for one stream; ``expected_version=None`` skips the concurrency check."""

    stream: str
    expected_version: int | None
    events: Sequence[NewEvent]


class LogQueries(Protocol):
    """What the log (and the projection tables beside it) answer, beyond the fold: the
    reads an event store passes on to its recorder."""

    async def read_stream(self, stream: str, after_version: int = 0) -> list[Recorded]: ...

    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[Recorded]: ...

    async def read_correlated(
        self, correlation_id: str, limit: int = 1000, *, newest: bool = False
    ) -> list[Recorded]:
        """The events of one operation (a drain, say: its steps share its id), in order:
        its first ``limit``, or with ``newest`` its last ``limit``."""
        ...

    async def read_about_replica(self, replica_id: str) -> list[Recorded]:
        """Every event about the replica (``subjects(event).replica``), in order."""
        ...

    async def forgotten_replicas(
        self, known: Collection[str], among: ReplicaFilter, page: ReplicaPage = WHOLE_LIST
    ) -> list[Replica]:
        """Ended replicas ``among`` those asked for that ``known`` lacks: those the fold
        forgot, as the projection keeps them (enough for a summary), that ``page`` holds, in
        listing order. The fold's own replicas may come before them in a page, so this
        page of the forgotten ones may be cut further once merged with those."""
        ...

    async def any_ended_replica(self, among: ReplicaFilter) -> bool:
        """Whether a replica ``among`` those asked for (whatever ``among.ended``) has ended,
        one the fold holds or one it forgot: what a list of the replicas not ended leaves
        out. Asked of the projection, it stops at the first it finds."""
        ...

    async def ended_replicas_by_model(self, before: datetime) -> dict[str, int]:
        """How many replicas that ended at or before ``before`` the projection holds (those
        the fold holds and those it forgot), by model; models with none are left out."""
        ...

    async def stream_version(self, stream: str) -> int: ...

    async def last_position(self) -> int: ...


class EventStore(LogQueries, Protocol):
    """Append-only log of events with optimistic concurrency, read in global order.

    ``state`` is the cluster folded from every event up to ``state.position``: each store
    keeps it current on append and catches up with writers in other processes.
    """

    @property
    def state(self) -> ClusterState: ...

    @property
    def newest_epoch(self) -> int:
        """The newest leader epoch among the events folded into ``state`` by this process
        (0: none carried one)."""
        ...

    async def read_events(self, event_ids: Sequence[UUID]) -> list[Recorded]:
        """Those of ``event_ids`` the log holds, in the log's order."""
        ...

    async def append(
        self, stream: str, expected_version: int | None, events: Sequence[NewEvent], meta: Meta
    ) -> list[Recorded]: ...

    async def append_many(
        self,
        requests: Sequence[AppendRequest],
        meta: Meta,
        *,
        still_holds: StillHolds | None = None,
    ) -> list[Recorded]:
        """``still_holds``: asked of the state with the batch folded in, as it would be
        appended; a stream it names makes the append a ``ConcurrencyError`` (nothing is
        written), for a decision that a change of that stream since it was made no longer
        lets stand, where the stream's version cannot say so (others write it too)."""
        ...

    def known_version(self, stream: str) -> int:
        """The stream's version in ``state`` (no I/O): what a decision made on ``state``
        expects. An append with it is refused if the stream has moved on meanwhile."""
        ...

    async def catch_up(self) -> ClusterState: ...
