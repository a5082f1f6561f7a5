"""An event store: a recorder that keeps the log, and this process's fold of it.

Both stores are this class around their own recorder (``app.store.memory``,
``app.store.postgres``), so appending, catching up and the fold cache behave alike and the
contract suite in ``tests/contracts`` holds for both.

An append is optimistic: the batch is planned and folded against the fold and handed to the
recorder with where the fold ends: its position and the id of the event at it (``_head``).
If the log does not end there, because another process appended meanwhile or because the
log lost the fold's last events in a failover and others took their positions, the
recorder refuses the batch (nothing written), and the store takes the recorder's exclusive
lock for the whole catch-up and second attempt, so a busy log cannot starve this writer.
A caller's ``still_holds`` is asked on the fold with the batch in it, at each attempt: the
state the batch is appended on once the recorder takes it.

Start-up does not replay the whole log when a fold snapshot can be trusted: the state is
loaded from the newest snapshot and only the events after it are folded (``catch_up``).
The leader writes snapshots in the background, after its own appends (those that carry a
leader epoch) have moved the fold ``every_events`` positions past the last one, or
``every_s`` seconds after it; a start-up that had to fold as many events writes one too.

A catch-up first checks that the log still holds the event the fold ended with (same
position, same id). It does not when the database failed over to a standby that had not
received the last events (asynchronous replication): the log then ends before the fold, or
goes on from there with other events at the same positions. The fold is thrown away and
built again from the database (its newest snapshot, then the log), as at start-up; what
the fold believed and the log lost is settled by the agents' reports, as after any
restart (adoption). The check costs nothing extra: the page read from one position before
the fold's end starts with that event.

An append makes the same check, in the recorder, atomically with the write: a log that
went on to exactly the fold's position with other events passes a check of the position
alone, and would take a batch decided on events it no longer holds. The fold therefore
always knows the id of the event it ends with: from the events it folded, or, when it
started from a snapshot and no event came after it, from the snapshot (read with the chain
hash the snapshot is checked against). Only an empty fold has none, and the recorder then
requires an empty log. The check costs nothing extra either: the recorder reads the log's
last event for the position check anyway.

An append whose connection breaks after it was sent (``AppendOutcomeUnknown``) may be in
the log or not. The fold is left without it, as after a refusal; if it was committed, the
log is then ahead of the fold, and the next catch-up (every operator's change starts with
one) or append (refused by the recorder: the log moved on) folds it from the log. A retry
decides again on that fold: a change already made is then nothing to record. The second
attempt, in a transaction, is folded before its ``COMMIT``; when the answer to that is
lost, the fold may hold what the log does not, and the next catch-up's check of the
fold's last event finds it out, as after a failover.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from time import monotonic
from uuid import UUID

import msgspec
import structlog

from app.clock import utc_now
from app.domain.envelope import Meta, Recorded
from app.domain.replica_listing import WHOLE_LIST, ReplicaPage
from app.domain.state import ClusterState, Replica, ReplicaFilter
from app.store.codec import storable_meta
from app.store.errors import (
    AlreadyRecorded,
    AppendOutcomeUnknown,
    ConcurrencyError,
    LogMovedOn,
    StoreError,
)
from app.store.fold_view import FoldView
from app.store.interface import AppendRequest, NewEvent, StillHolds
from app.store.recorder import FoldSnapshots, Recorder, RecorderSession

log = structlog.get_logger(__name__)

CATCH_UP_PAGE = 10_000


class SnapshotPolicy(msgspec.Struct, frozen=True, kw_only=True):
    every_events: int = 50_000
    """Positions past the last snapshot: at ~70,000 events a second, a start-up folds at
    most about a second of tail."""
    every_s: float = 3600.0
    """Seconds after the last snapshot (with any event since), for a quiet log."""


class FoldStart(msgspec.Struct, frozen=True, kw_only=True):
    """How the fold got current the first time."""

    position: int
    snapshot: int | None
    """The position of the snapshot it started from; None when it replayed the whole log."""
    events_folded: int
    """Events folded after the snapshot (or from the first, without one)."""
    seconds: float


class FoldedEventStore:
    def __init__(
        self,
        recorder: Recorder,
        *,
        clock: Callable[[], datetime] = utc_now,
        snapshots: FoldSnapshots | None = None,
        policy: SnapshotPolicy | None = None,
    ) -> None:
        self._recorder = recorder
        self._clock = clock
        self._view = FoldView()
        self._head: UUID | None = None
        """The id of the event at ``state.position``; None only at position 0."""
        # One fold at a time in this process: an append and a catch-up must not both
        # evolve the same events into the shared state.
        self._lock = asyncio.Lock()
        self._snapshots = snapshots
        self._policy = policy if snapshots is not None else None
        self._snapshot_position = 0
        self._snapshot_at = monotonic()
        self._snapshot_task: asyncio.Task[None] | None = None
        self.started: FoldStart | None = None
        """Set once the first catch-up is done."""

    @property
    def state(self) -> ClusterState:
        return self._view.state

    @property
    def newest_epoch(self) -> int:
        return self._view.newest_epoch

    def known_version(self, stream: str) -> int:
        return self._view.known_version(stream)

    async def read_stream(self, stream: str, after_version: int = 0) -> list[Recorded]:
        return await self._recorder.read_stream(stream, after_version)

    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[Recorded]:
        return await self._recorder.read_all(after_position, limit)

    async def read_correlated(
        self, correlation_id: str, limit: int = 1000, *, newest: bool = False
    ) -> list[Recorded]:
        return await self._recorder.read_correlated(correlation_id, limit, newest=newest)

    async def read_about_replica(self, replica_id: str) -> list[Recorded]:
        return await self._recorder.read_about_replica(replica_id)

    async def forgotten_replicas(
        self, known: Collection[str], among: ReplicaFilter, page: ReplicaPage = WHOLE_LIST
    ) -> list[Replica]:
        return await self._recorder.forgotten_replicas(known, among, page)

    async def any_ended_replica(self, among: ReplicaFilter) -> bool:
        return await self._recorder.any_ended_replica(among)

    async def ended_replicas_by_model(self, before: datetime) -> dict[str, int]:
        return await self._recorder.ended_replicas_by_model(before)

    async def stream_version(self, stream: str) -> int:
        return await self._recorder.stream_version(stream)

    async def last_position(self) -> int:
        return await self._recorder.last_position()

    async def read_events(self, event_ids: Sequence[UUID]) -> list[Recorded]:
        async with self._recorder.session() as session:
            found = await session.events_with_ids(event_ids)
        return sorted(found, key=lambda r: r.position)

    # -- appending -----------------------------------------------------------------------------

    async def append(
        self, stream: str, expected_version: int | None, events: Sequence[NewEvent], meta: Meta
    ) -> list[Recorded]:
        return await self.append_many([AppendRequest(stream, expected_version, events)], meta)

    async def append_many(
        self,
        requests: Sequence[AppendRequest],
        meta: Meta,
        *,
        still_holds: StillHolds | None = None,
    ) -> list[Recorded]:
        meta = storable_meta(meta)
        async with self._lock, self._recorder.session() as session:
            if self.started is None:
                await self._catch_up(session)
            try:
                # Optimistic: one round trip when the fold is current (the usual case for
                # the control plane, the only steady writer).
                recorded = await self._attempt(session, requests, meta, still_holds)
            except LogMovedOn:
                try:
                    async with session.exclusive():
                        await self._catch_up(session)
                        recorded = await self._attempt(session, requests, meta, still_holds)
                except AppendOutcomeUnknown as exc:
                    _outcome_unknown(exc, meta, self._view.state.position, folded=True)
                    raise
        if meta.epoch is not None and recorded:
            self._snapshot_if_due()
        return recorded

    async def _attempt(
        self,
        session: RecorderSession,
        requests: Sequence[AppendRequest],
        meta: Meta,
        still_holds: StillHolds | None,
    ) -> list[Recorded]:
        try:
            plan = await self._plan(session, requests, meta)
        except ConcurrencyError:
            if await self._catch_up(session) > 0:
                raise LogMovedOn() from None  # another writer moved the stream: check again
            if await session.events_with_ids(_ids(requests)):
                return await self._append_rest(session, requests, meta, still_holds)
            raise  # the fold is current and the events are new: a real conflict
        if not plan:
            return []
        try:
            return await self._record(session, plan, meta, still_holds)
        except AlreadyRecorded:
            return await self._append_rest(session, requests, meta, still_holds)

    async def _record(
        self,
        session: RecorderSession,
        plan: list[Recorded],
        meta: Meta,
        still_holds: StillHolds | None,
    ) -> list[Recorded]:
        changes, undo = self._view.fold(plan)
        try:
            # Judged on the fold with the batch in it: the recorder takes the batch only if
            # the log ends where the fold does, so this is the state it is appended on.
            moved = still_holds(self._view.state) if still_holds is not None else None
            if moved is not None:
                raise ConcurrencyError(moved, None, self._view.known_version(moved))
            positions = await session.record(plan, changes, meta, undo.position, self._head)
        except BaseException as exc:
            # Overtaken, refused, or lost on the way (the write may have committed: then the
            # next append finds the log ahead of the fold and catches up).
            self._view.undo(undo)
            if isinstance(exc, AppendOutcomeUnknown):
                _outcome_unknown(exc, meta, undo.position, folded=False)
            raise
        recorded = self._view.confirm(plan, positions)
        self._head = max(recorded, key=lambda r: r.position).event_id
        return recorded

    async def _append_rest(
        self,
        session: RecorderSession,
        requests: Sequence[AppendRequest],
        meta: Meta,
        still_holds: StillHolds | None,
    ) -> list[Recorded]:
        """Some events were stored before (a retried request): return those as stored and
        append the others, if any."""
        await self._catch_up(session)
        ids = _ids(requests)
        known = {r.event_id: r for r in await session.events_with_ids(ids)}
        rest = [
            AppendRequest(
                r.stream, r.expected_version, [e for e in r.events if e.event_id not in known]
            )
            for r in requests
        ]
        stored = [known[i] for i in ids if i in known]
        if not any(r.events for r in rest):
            return stored
        plan = await self._plan(session, rest, meta)
        return stored + await self._record(session, plan, meta, still_holds)

    async def _plan(
        self, session: RecorderSession, requests: Sequence[AppendRequest], meta: Meta
    ) -> list[Recorded]:
        unknown = self._view.unknown_streams(requests)
        # Usually none: a new stream is appended to with expected version 0. An unchecked
        # append to a stream the fold has no version of asks the recorder for it (a stale
        # answer is refused like a stale fold: the log moved on).
        recorded_versions = await session.stream_versions(unknown) if unknown else None
        return self._view.plan(requests, meta, self._clock(), recorded_versions)

    # -- catching up -----------------------------------------------------------------------------

    async def catch_up(self) -> ClusterState:
        """Bring ``state`` up to the end of the log."""
        async with self._lock, self._recorder.session() as session:
            await self._catch_up(session)
        return self._view.state

    async def _catch_up(self, session: RecorderSession) -> int:
        """Fold what other writers appended since the fold was last current; the first time,
        from the newest usable snapshot. Returns how many events were folded."""
        starting = self.started is None
        started_at = monotonic()
        batch: list[Recorded] = []
        if not starting:
            tail = await self._tail_after_fold(session)
            if tail is None:
                self.started = None
                starting = True
            else:
                batch = tail
        if starting:
            await self._start()
            batch = await session.events_after(self._view.state.position, CATCH_UP_PAGE)
        count = 0
        while batch:
            self._view.absorb(batch)
            self._head = batch[-1].event_id
            count += len(batch)
            batch = await session.events_after(self._view.state.position, CATCH_UP_PAGE)
        if not starting:
            return count
        self.started = FoldStart(
            position=self._view.state.position,
            snapshot=self._snapshot_position or None,
            events_folded=count,
            seconds=round(monotonic() - started_at, 3),
        )
        log.info("fold_loaded", **msgspec.structs.asdict(self.started))
        if self._policy is not None and count >= self._policy.every_events:
            self._snapshot_soon()
        return count

    async def _tail_after_fold(self, session: RecorderSession) -> list[Recorded] | None:
        """The first page of events after the fold's end, or None when the log no longer
        holds the event the fold ended with (it was lost in a failover): the fold must be
        built again."""
        position = self._view.state.position
        if position == 0:
            return await session.events_after(0, CATCH_UP_PAGE)
        page = await session.events_after(position - 1, CATCH_UP_PAGE + 1)
        found = page[0] if page and page[0].position == position else None
        if found is not None and found.event_id == self._head:
            return page[1:]
        log.warning(
            "fold_ahead_of_log",
            fold_position=position,
            log_event_there=None if found is None else str(found.event_id),
            fold_event_there=None if self._head is None else str(self._head),
            detail="the log lost events this process had folded (a failover to a standby "
            "that had not received them?): building the fold again from the database",
        )
        return None

    async def _start(self) -> None:
        loaded = await self._snapshots.load() if self._snapshots is not None else None
        if loaded is None:
            self._view.reset(ClusterState(), {})
            self._head = None
        else:
            self._view.reset(loaded.state, loaded.versions)
            self._head = loaded.head
        self._snapshot_position = self._view.state.position
        self._snapshot_at = monotonic()

    # -- fold snapshots --------------------------------------------------------------------------

    async def save_snapshot(self) -> int | None:
        """Write a snapshot of the fold as it is now; its position, or None when the log is
        empty or a snapshot at that position exists."""
        if self._snapshots is None:
            return None
        async with self._lock:
            state, versions = self._view.state.copy(), dict(self._view.versions)
        if state.position == 0:
            return None
        try:
            saved = await self._snapshots.save(state, versions)
        finally:
            # Also after a failure: the next attempt waits for the policy's interval
            # again instead of re-encoding the whole state after every append.
            self._snapshot_position = max(self._snapshot_position, state.position)
            self._snapshot_at = monotonic()
        return state.position if saved else None

    def _snapshot_if_due(self) -> None:
        policy = self._policy
        if policy is None:
            return
        behind = self._view.state.position - self._snapshot_position
        if behind >= policy.every_events or (
            behind > 0 and monotonic() - self._snapshot_at >= policy.every_s
        ):
            self._snapshot_soon()

    def _snapshot_soon(self) -> None:
        if self._snapshot_task is None or self._snapshot_task.done():
            self._snapshot_task = asyncio.create_task(
                self._snapshot_in_background(), name="fold-snapshot"
            )

    async def _snapshot_in_background(self) -> None:
        try:
            position = await self.save_snapshot()
        except StoreError as exc:
            log.warning("fold_snapshot_not_written", error=str(exc))
        except Exception:  # a bug here must not go unseen, nor cost the appends anything
            log.exception("fold_snapshot_not_written")
        else:
            if position is not None:
                log.info("fold_snapshot_written", position=position)


def _outcome_unknown(
    exc: AppendOutcomeUnknown, meta: Meta, fold_position: int, *, folded: bool
) -> None:
    """Log the one line an append of unknown outcome gets; ``folded``: the fold holds it."""
    log.warning(
        "append_outcome_unknown",
        correlation_id=meta.correlation_id,
        fold_position=fold_position,
        error=str(exc.__cause__ or exc),
        detail=(
            "the fold holds the batch; the next read of the log checks that the log holds "
            "the fold's last event, and builds the fold again if not"
            if folded
            else "the fold goes on without the batch; the next read of the log folds it "
            "if it was committed"
        ),
    )


def _ids(requests: Sequence[AppendRequest]) -> list[UUID]:
    return [new.event_id for request in requests for new in request.events]
