"""A store started from a fold snapshot, with no event after it, knows the event its fold
ends with: the snapshot's, read with the chain hash it is checked against. Its first append
names it, so the log takes it at once, and refuses it when the log lost that event in a
failover and went on to the same position with others."""

from __future__ import annotations

from typing import cast

from app.domain.state import ClusterState
from app.store.folded import FoldedEventStore
from app.store.interface import NO_STREAM
from app.store.recorder import LoadedSnapshot, Recorder
from tests.unit.test_fold_after_failover import (
    META,
    FailingOverRecorder,
    a_fold_of_three_replicas,
    declared,
    place,
    standby_of,
)


class SnapshotsOfTheLog:
    """Fold snapshots kept beside the log at ``address``; as in PostgreSQL, one whose
    position no longer holds the event it was taken at is passed over."""

    def __init__(self, address: FailingOverRecorder) -> None:
        self._address = address
        self._kept: list[LoadedSnapshot] = []

    async def save(self, state: ClusterState, versions: dict[str, int]) -> bool:
        head = self._address.current.log[state.position - 1].event_id
        self._kept.append(LoadedSnapshot(state, versions, head))
        return True

    async def load(self) -> LoadedSnapshot | None:
        log = self._address.current.log
        for kept in reversed(self._kept):
            position = kept.state.position
            if len(log) >= position and log[position - 1].event_id == kept.head:
                return LoadedSnapshot(kept.state.copy(), dict(kept.versions), kept.head)
        return None


async def started_from_a_snapshot() -> tuple[FoldedEventStore, FailingOverRecorder]:
    """A store started from a snapshot of the fold of three replicas, no event after it."""
    _, address = await a_fold_of_three_replicas()
    snapshots = SnapshotsOfTheLog(address)
    writer = FoldedEventStore(cast(Recorder, address), snapshots=snapshots)
    await writer.catch_up()
    assert await writer.save_snapshot() == 4
    store = FoldedEventStore(cast(Recorder, address), snapshots=snapshots)
    await store.catch_up()
    assert store.started is not None
    assert (store.started.snapshot, store.started.events_folded) == (4, 0)
    return store, address


async def test_a_fold_started_from_a_snapshot_appends_after_the_snapshot_s_event() -> None:
    store, _ = await started_from_a_snapshot()
    started = store.started

    await place(store, "m", 4)

    assert store.started is started, "appended at once, not folded again"
    assert sorted(store.state.replicas) == ["m-1", "m-2", "m-3", "m-4"]


async def test_a_fold_started_from_a_snapshot_the_log_lost_is_refused_its_first_append() -> None:
    store, address = await started_from_a_snapshot()
    standby = standby_of(address.current, received=3)
    address.current = standby
    await FoldedEventStore(standby).append("model-n", NO_STREAM, [declared("n")], META)

    await place(store, "m", 4)

    assert store.started is not None
    assert store.started.snapshot is None, "the snapshot of the lost events was passed over"
    assert sorted(store.state.models) == ["m", "n"]
    assert sorted(store.state.replicas) == ["m-1", "m-2", "m-4"]
