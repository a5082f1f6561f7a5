"""Start-up of the control plane's store, from a fold snapshot and by replaying the whole log,
at several sizes of log (``python benchmarks/eventstore.py --startup``).

One fresh migrated database. For each size (100,000, 1,000,000 and 5,000,000 events
unless told), in increasing order, the same seeded history (``benchmarks/history.py``)
grows to that size:

1. **bulk load** up to ``tail`` events before the size: ``llmgw_append`` itself, through
   the store's recorder, 5,000 events a call and no projection rows (a start-up reads
   none), so five million events load in minutes rather than the hours the store's own
   appends of a busy history would take (the chain is computed as always: ``log verify``
   holds);
2. **write a fold snapshot** there, in a child process, as a leader would: a store starts
   (from the previous size's snapshot, if any) and saves one;
3. load the last ``tail`` events, then ``VACUUM ANALYZE`` and ``CHECKPOINT``;
4. **start up by replaying the whole log**, in a child: a store without snapshots, which
   is how the store started before snapshots;
5. **start up from the snapshot**, ``rounds`` times, in a child each time: a
   ``PostgresEventStore`` as ``serve`` makes one, until its first catch-up returns. Each
   start-up's fold is checked against the replay's (a digest of the state).

The snapshot is ``tail`` events behind the end, half the default snapshot interval: on
average, the tail a start-up finds.
"""

from __future__ import annotations

import hashlib
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

import asyncpg
import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Meta, Recorded
from app.domain.state import ClusterState
from app.store import snapshot_format
from app.store.database import connection, create_engine
from app.store.folded import FoldedEventStore
from app.store.postgres import PostgresEventStore, PostgresRecorder
from app.store.projection import RowChanges
from benchmarks.children import ChildOperation, ChildRun
from benchmarks.common import (
    BenchServer,
    Machine,
    describe_machine,
    format_table,
    fresh_database,
    load_average,
    median,
    per_second,
    settle,
)
from benchmarks.history import ClusterHistory, Step

SIZES = (100_000, 1_000_000, 5_000_000)
TAIL = 25_000
ROUNDS = 3
BULK_BATCH = 5_000
TARGET_RATIO = 2.0
"""Start-up at the largest size over start-up at the smallest."""
META = Meta(actor="reconciler")
_NO_ROWS = RowChanges(touched={"models": [], "nodes": [], "replicas": [], "api_keys": []}, rows={})

Measure = Callable[[str, str], Awaitable[ChildRun]]


class Size(msgspec.Struct, frozen=True, kw_only=True):
    events: int
    load_seconds: float
    """Bulk-loading this size's events after the previous size's, settling included."""
    load_events_per_s: float
    snapshot: ChildRun
    """Writing the snapshot ``tail`` events before the end (a start-up, then the save)."""
    replay: ChildRun
    startups: list[ChildRun]
    startup_median_s: float
    replay_over_startup: float
    """How many times faster the start-up from the snapshot is."""


class StartupResults(msgspec.Struct, frozen=True, kw_only=True):
    benchmark: str
    started_at: str
    server: str
    machine: Machine
    tail: int
    rounds: int
    sizes: list[Size]
    largest_over_smallest: float
    """Median start-up from a snapshot at the largest size over that at the smallest."""
    target: float
    met: bool
    load_average: dict[str, tuple[float, float, float]]


class BulkLoad:
    """The history, appended through the recorder in large batches without projection rows."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._recorder = PostgresRecorder(engine)
        self._steps = ClusterHistory().steps()
        self._versions: dict[str, int] = {}
        self.position = 0
        self._last_event_id: uuid.UUID | None = None

    async def up_to(self, events: int) -> None:
        async with self._recorder.session() as session:
            while self.position < events:
                steps = list(itertools.islice(self._steps, min(BULK_BATCH, events - self.position)))
                batch = self._batch(steps)
                positions = await session.record(
                    batch, _NO_ROWS, META, self.position, self._last_event_id
                )
                self._last_event_id, self.position = max(
                    positions.items(), key=lambda item: item[1]
                )

    def _batch(self, steps: Sequence[Step]) -> list[Recorded]:
        now = datetime.now(UTC)
        batch = []
        for offset, (stream, event) in enumerate(steps, start=1):
            version = self._versions.get(stream, 0) + 1
            self._versions[stream] = version
            batch.append(
                Recorded(
                    position=self.position + offset,
                    stream=stream,
                    version=version,
                    event_id=uuid.uuid4(),
                    recorded_at=now,
                    meta=META,
                    event=event,
                )
            )
        return batch


async def run(
    server: BenchServer, measure: Measure, sizes: Sequence[int], tail: int, rounds: int
) -> StartupResults:
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    loads: dict[str, tuple[float, float, float]] = {}

    def phase(name: str) -> None:
        loads[name] = load_average()
        print(f"{name} (load average {' '.join(map(str, loads[name]))})", flush=True)

    results: list[Size] = []
    async with fresh_database(server) as url:
        machine = await describe_machine(url)
        engine = create_engine(url, pool_size=2)
        db = await asyncpg.connect(url)
        try:
            bulk = BulkLoad(engine)
            for size in sorted(sizes):
                loaded_from = bulk.position
                phase(f"loading up to {size:,} events")
                before = time.perf_counter()
                await bulk.up_to(max(size - tail, bulk.position))
                loading = time.perf_counter() - before
                phase(f"a fold snapshot at {bulk.position:,}")
                snapshot = await measure("snapshot", url)
                before = time.perf_counter()
                await bulk.up_to(size)
                await settle(db)
                loading += time.perf_counter() - before
                phase(f"start-up by replaying {size:,} events")
                replayed = await measure("replay-startup", url)
                startups = []
                for number in range(rounds):
                    phase(f"start-up from the snapshot at {size:,}, {number + 1} of {rounds}")
                    startups.append(await measure("startup", url))
                if {run.counts["snapshot"] for run in startups} != {snapshot.counts["position"]}:
                    raise AssertionError(f"a start-up at {size:,} events did not use the snapshot")
                digests = {run.counts["digest"] for run in startups}
                if digests != {replayed.counts["digest"]}:
                    raise AssertionError(f"a start-up at {size:,} events folded another state")
                startup_s = median([run.seconds for run in startups])
                results.append(
                    Size(
                        events=size,
                        load_seconds=round(loading, 1),
                        load_events_per_s=round(per_second(size - loaded_from, loading)),
                        snapshot=snapshot,
                        replay=replayed,
                        startups=startups,
                        startup_median_s=startup_s,
                        replay_over_startup=round(replayed.seconds / startup_s, 1),
                    )
                )
            phase("end")
        finally:
            await db.close()
            await engine.dispose()
    ratio = round(results[-1].startup_median_s / results[0].startup_median_s, 2)
    return StartupResults(
        benchmark="eventstore-startup",
        started_at=started_at,
        server=server.description,
        machine=machine,
        tail=tail,
        rounds=rounds,
        sizes=results,
        largest_over_smallest=ratio,
        target=TARGET_RATIO,
        met=ratio <= TARGET_RATIO,
        load_average=loads,
    )


def report(results: StartupResults) -> str:
    machine = results.machine
    rows = []
    for size in results.sizes:
        startup, replayed, snapshot = size.startups, size.replay, size.snapshot
        rows.append((
            f"{size.events:,}",
            f"{size.startup_median_s:.2f} ({', '.join(f'{r.seconds:.2f}' for r in startup)})",
            f"{replayed.seconds:.2f}",
            f"{size.replay_over_startup:.1f}x",
            f"{max(r.peak_rss_mib for r in startup):,.0f} / {replayed.peak_rss_mib:,.0f}",
            f"{snapshot.counts['bytes'] / 2**20:,.1f} MiB in {snapshot.counts['chunks']}",
            f"{snapshot.counts['save_ms'] / 1000:.2f}",
            f"{replayed.counts['replicas']:,}",
        ))  # fmt: skip
    headers = (
        "events", "start-up from snapshot, s (rounds)", "replaying all, s", "faster",
        "peak RSS MiB", "snapshot", "writing it, s", "replicas in state",
    )  # fmt: skip
    met = "met" if results.met else "NOT met"
    return "\n".join(
        [
            f"{machine.cpu_model}, {machine.cores} cores, {machine.memory_gib} GiB, "
            f"Python {machine.python}, PostgreSQL {machine.postgresql} ({results.server})",
            f"snapshot {results.tail:,} events before the end; medians of {results.rounds}",
            format_table(headers, rows),
            f"start-up at {results.sizes[-1].events:,} over {results.sizes[0].events:,}: "
            f"{results.largest_over_smallest:.2f}x (target <= {results.target:.0f}x: {met})",
            "load: "
            + "; ".join(
                f"{s.events:,} in {s.load_seconds:,.0f} s ({s.load_events_per_s:,.0f}/s)"
                for s in results.sizes
            ),
        ]
    )


# -- in the child processes --------------------------------------------------------------------


def _digest(state: ClusterState) -> int:
    """A fingerprint of a fold, to compare two processes' (dicts in the order folded)."""
    digest = hashlib.sha256()
    for chunk in snapshot_format.encode(state, {}):
        digest.update(chunk)
    return int.from_bytes(digest.digest()[:7], "big")


def _figures(state: ClusterState) -> dict[str, int]:
    return {
        "position": state.position,
        "replicas": len(state.replicas),
        "nodes": len(state.nodes),
        "digest": _digest(state),
    }


async def _startup(engine: AsyncEngine) -> dict[str, int]:
    store = PostgresEventStore(engine, policy=None)
    await store.catch_up()
    assert store.started is not None
    return {
        **_figures(store.state),
        "snapshot": store.started.snapshot or 0,
        "events_folded": store.started.events_folded,
    }


async def _replay_startup(engine: AsyncEngine) -> dict[str, int]:
    store = FoldedEventStore(PostgresRecorder(engine))
    await store.catch_up()
    return _figures(store.state)


async def _snapshot(engine: AsyncEngine) -> dict[str, int]:
    store = PostgresEventStore(engine, policy=None)
    await store.catch_up()
    before = time.perf_counter()
    position = await store.save_snapshot()
    saving = time.perf_counter() - before
    async with connection(engine) as db:
        row = await db.fetchrow(
            "SELECT bytes, chunks FROM fold_snapshots WHERE position = $1", position
        )
    return {
        "position": position or 0,
        "save_ms": round(saving * 1000),
        "bytes": row["bytes"],
        "chunks": row["chunks"],
    }


CHILD_OPERATIONS: dict[str, ChildOperation] = {
    "startup": _startup,
    "replay-startup": _replay_startup,
    "snapshot": _snapshot,
}
