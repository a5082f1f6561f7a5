"""What an event store is built from: a recorder that keeps the log, and somewhere to keep
snapshots of the fold.

A ``Recorder`` stores and reads events and nothing else: it knows no state and folds
nothing. It checks, atomically with the write, what the log itself can decide: that the
caller's view of the log is current (the log ends at the position and with the event the
caller's fold ends with), that no event id is stored twice, that every stream is
at the version the batch continues and (PostgreSQL) that the writer's leader epoch is
current. It is the only place where a driver's errors become the store's. The view of the
log (the fold, the stream versions, the projection rows handed to ``record``) is
``app.store.fold_view``, and ``app.store.folded`` puts the two together; the in-memory and
the PostgreSQL store differ only in their recorder.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import NamedTuple, Protocol
from uuid import UUID

from app.domain.envelope import Meta, Recorded
from app.domain.state import ClusterState
from app.store.interface import LogQueries
from app.store.projection import RowChanges


class RecorderSession(Protocol):
    """The recorder on one connection. Reads and writes made in ``exclusive()`` are not
    interleaved with any other writer's appends."""

    def exclusive(self) -> AbstractAsyncContextManager[None]: ...

    async def events_after(self, position: int, limit: int) -> list[Recorded]:
        """Up to ``limit`` events after ``position``, in order."""
        ...

    async def events_with_ids(self, event_ids: Sequence[UUID]) -> list[Recorded]:
        """Those of ``event_ids`` already stored (in no particular order)."""
        ...

    async def stream_versions(self, streams: Sequence[str]) -> dict[str, int]:
        """The versions of those of ``streams`` that have events."""
        ...

    async def record(
        self,
        batch: Sequence[Recorded],
        rows: RowChanges,
        meta: Meta,
        after_position: int,
        after_event_id: UUID | None,
    ) -> dict[UUID, int]:
        """Store ``batch`` (its positions provisional) and the projection ``rows`` it
        leads to, after the event ``after_event_id`` at ``after_position`` (None and 0: an
        empty log); returns each event's position.

        Raises ``LogMovedOn`` when the log does not end there: it is past
        ``after_position``, or its event at that position is another one (it lost the
        caller's after a failover and other events took its position), so the batch and
        the rows were decided on a history the log does not hold. Raises
        ``AlreadyRecorded`` when one of the event ids is stored, ``ConcurrencyError`` when
        a stream is not at the version before the batch's first, ``FencedError`` when
        ``meta.epoch`` was superseded. Nothing is stored then.
        """
        ...


class Recorder(LogQueries, Protocol):
    def session(self) -> AbstractAsyncContextManager[RecorderSession]: ...


class LoadedSnapshot(NamedTuple):
    state: ClusterState
    versions: dict[str, int]
    """The stream versions at the snapshot's position."""
    head: UUID
    """The id of the event at the snapshot's position, read with the chain hash the
    snapshot is checked against: a fold started from the snapshot ends with that event,
    and its first append names it to the recorder."""


class FoldSnapshots(Protocol):
    """Snapshots of the fold at some positions of the log, to start from instead of the
    first event."""

    async def load(self) -> LoadedSnapshot | None:
        """The newest snapshot this version of the fold can trust, or None (a warning says
        why each one it found was passed over)."""
        ...

    async def save(self, state: ClusterState, versions: dict[str, int]) -> bool:
        """Keep a snapshot of ``state`` (and the stream versions at its position); False
        when one at that position exists already."""
        ...
