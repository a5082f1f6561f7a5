"""The log as this process has folded it: the state, every stream's version, and the plan of
an append checked and folded against them.

An append is planned here (versions checked against the fold, so a writer that lost a race
is refused before anything reaches the recorder), folded into the state at once (the
projection rows the recorder writes with the events come from that fold), then confirmed
with the positions the recorder gave, or undone if the recorder refused. Events other
writers appended are absorbed as they are read. Both stores keep their fold here.

A replica's stream has a version here only while the fold holds the replica: once the fold
forgets an ended replica (``ENDED_KEPT_PER_MODEL``), its stream's version goes too, so the
versions stay the size of the cluster like the state. Nothing decided on the fold appends to
a forgotten replica's stream; an append that does so unchecked (``expected_version=None``)
gets the stream's version from the recorder (``unknown_streams``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from uuid import UUID

from msgspec.structs import replace

from app.domain.envelope import Meta, Recorded
from app.domain.events import EndedReplicasForgotten, replica_stream
from app.domain.evolve import evolve
from app.domain.state import ClusterState, Replica
from app.store.codec import storable
from app.store.collector import paused_gc
from app.store.errors import ConcurrencyError
from app.store.interface import AppendRequest
from app.store.projection import RowChanges, Undo, fold

_REPLICA_STREAM = replica_stream("")


def absorb(state: ClusterState, versions: dict[str, int], events: Sequence[Recorded]) -> None:
    """Fold ``events`` (in order, after ``state.position``) into ``state`` and ``versions``."""
    kept = state.forgotten
    forgotten = state.forgotten = kept if kept is not None else []
    start = len(forgotten)
    try:
        for recorded in events:
            evolve(state, recorded)
            versions[recorded.stream] = recorded.version
        settle_versions(state, versions, events, forgotten[start:])
    finally:
        state.forgotten = kept if kept is not None else None


def settle_versions(
    state: ClusterState,
    versions: dict[str, int],
    events: Iterable[Recorded],
    forgotten: Iterable[Replica],
) -> None:
    """Drop the versions of replica streams whose replica the fold does not hold, among the
    streams ``events`` wrote and those of the replicas it ``forgot`` meanwhile (every
    replica stream after an ``ended_replicas_forgotten``). Whether the
    fold holds a replica once a batch is folded does not depend on how the log was cut into
    batches, so a replay, a catch-up and the appends keep the same versions."""
    replicas = state.replicas
    cut = len(_REPLICA_STREAM)
    swept = False
    for recorded in events:
        stream = recorded.stream
        if stream.startswith(_REPLICA_STREAM) and stream[cut:] not in replicas:
            versions.pop(stream, None)
        swept = swept or type(recorded.event) is EndedReplicasForgotten
    if swept:
        # An operator forgot ended replicas the fold held, which no event of the batch wrote
        # to: every replica stream's version is looked at, once for such a request.
        for stream in [s for s in versions if s.startswith(_REPLICA_STREAM)]:
            if stream[cut:] not in replicas:
                del versions[stream]
        return
    for replica in forgotten:
        if replica.id not in replicas:
            versions.pop(replica_stream(replica.id), None)


class FoldView:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.versions: dict[str, int] = {}
        """Each stream's version as of ``state.position`` (see the module docstring)."""
        self._forgotten: list[Replica] = []
        """Replicas the fold of the append being recorded forgot."""
        self.newest_epoch = 0
        """The newest leader epoch among the events this process folded since it started
        (its own appends and those it read): one newer than a leader's own says another
        leader has appended since."""

    def reset(self, state: ClusterState, versions: dict[str, int]) -> None:
        self.state = state
        self.versions = versions

    def known_version(self, stream: str) -> int:
        return self.versions.get(stream, 0)

    def unknown_streams(self, requests: Sequence[AppendRequest]) -> list[str]:
        """Streams appended to unchecked whose version the fold does not know: new ones, or
        those of replicas it forgot. ``plan`` needs their versions from the recorder."""
        return sorted(
            {
                r.stream
                for r in requests
                if r.expected_version is None and r.events and r.stream not in self.versions
            }
        )

    def plan(
        self,
        requests: Sequence[AppendRequest],
        meta: Meta,
        now: datetime,
        recorded_versions: Mapping[str, int] | None = None,
    ) -> list[Recorded]:
        """The events as they will be recorded (positions provisional), checking versions.
        ``recorded_versions``: the recorder's versions of the ``unknown_streams``."""
        versions: dict[str, int] = dict(recorded_versions or {})
        plan: list[Recorded] = []
        position = self.state.position
        for request in requests:
            actual = versions.get(request.stream, self.versions.get(request.stream, 0))
            expected = request.expected_version
            if expected is not None and expected != actual and request.events:
                raise ConcurrencyError(request.stream, expected, actual)
            for new in request.events:
                actual += 1
                position += 1
                plan.append(
                    Recorded(
                        position=position,
                        stream=request.stream,
                        version=actual,
                        event_id=new.event_id,
                        recorded_at=now,
                        meta=meta,
                        event=storable(new.event),
                    )
                )
            versions[request.stream] = actual
        return plan

    def fold(self, plan: Sequence[Recorded]) -> tuple[RowChanges, Undo]:
        """Fold ``plan`` into the state; the rows it changes, and how to undo it."""
        self.state.forgotten = self._forgotten = []
        try:
            return fold(self.state, plan)
        finally:
            self.state.forgotten = None

    def undo(self, undo: Undo) -> None:
        undo.restore(self.state)
        self._forgotten = []

    def confirm(self, plan: Sequence[Recorded], positions: Mapping[UUID, int]) -> list[Recorded]:
        """The planned events as recorded, at the positions the recorder gave them."""
        recorded = [replace(r, position=positions[r.event_id]) for r in plan]
        self.state.position = max(positions.values())
        for one in recorded:
            self.versions[one.stream] = one.version
        self._note_epochs(recorded)
        settle_versions(self.state, self.versions, recorded, self._forgotten)
        self._forgotten = []
        return recorded

    def absorb(self, events: Sequence[Recorded]) -> None:
        """Fold events read from the log (in order, after ``state.position``)."""
        with paused_gc():
            absorb(self.state, self.versions, events)
        self._note_epochs(events)

    def _note_epochs(self, events: Iterable[Recorded]) -> None:
        epochs = (r.meta.epoch for r in events if r.meta.epoch is not None)
        self.newest_epoch = max(self.newest_epoch, max(epochs, default=0))
