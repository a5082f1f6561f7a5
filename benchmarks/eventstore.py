"""Event store benchmark: appends, batched appends, replay and rebuild of a large log, and
what the chain hash costs.

    python benchmarks/eventstore.py [--events 1000000] [--single 3000] [--quick]
    python benchmarks/eventstore.py --startup [--startup-sizes 100000,1000000,5000000]

One run, one fresh migrated database on one server (see ``benchmarks/common.py``):

1. load a synthetic cluster history of ``--events`` events through the store, in batches
   of 1,000 (timed, and its mix of event types reported); at a tenth of it, and again at
   the end, ``log verify`` the chain, in a child process (peak RSS: memory stays flat);
2. replay it into ``ClusterState``, verify the projection tables against it, and rebuild
   them, each in a child process of its own so that its peak RSS is its own;
3. single-event appends through ``PostgresEventStore.append`` against a bare asyncpg
   INSERT + COMMIT of the same rows into the same table, in alternating rounds;
4. batched appends (100 events per ``append_many``) against a bare 100-row INSERT;
5. the chain hash per append: single and batched appends through the same store and the
   same ``llmgw_append``, with the chain and with a copy that skips the hash
   (``benchmarks/chain.py``), in alternating rounds;
6. migration 0005 chaining the whole log, as an upgrade from 0004 does.

The appends run after the load, against a log of ``--events`` events, as they would in a
cluster that has run for a while. Results are printed and written to
``benchmarks/results/eventstore-<timestamp>.json``; ``docs/performance.md`` discusses them.

``--startup`` measures only the store's start-up instead, from a fold snapshot and by
replaying the whole log, at each of ``--startup-sizes`` (``benchmarks/startup.py``), into
``benchmarks/results/eventstore-startup-<timestamp>.json``.

``--guards`` measures only what migration 0017's checks cost an append
(``benchmarks/append_guards.py``): on a log of ``--events`` (100,000) events, appends of
1, 5, 100, 1,000 and 5,000 events a call through ``llmgw_append`` with and without them,
in ``--rounds`` alternating rounds, into ``benchmarks/results/eventstore-guards-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

# Run as a script, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Meta
from app.domain.events import event_type
from app.store.codec import encode_event, encode_meta
from app.store.database import connection, create_engine
from app.store.interface import NO_STREAM, AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from app.store.rebuild import rebuild
from app.store.replay import replay
from app.store.verification import verify_log
from benchmarks import children, startup
from benchmarks.append_guards import (
    BATCHES,
    UNGUARDED_SCHEMA,
    GuardCost,
    install_unguarded_append,
)
from benchmarks.chain import (
    UNCHAINED_SCHEMA,
    Backfill,
    install_unchained_append,
    measure_backfill,
)
from benchmarks.children import CHILD_URL_ENV, ChildOperation, ChildRun
from benchmarks.common import (
    BenchServer,
    Machine,
    bench_server,
    describe_machine,
    engine_finding_first,
    format_table,
    fresh_database,
    load_average,
    median,
    per_second,
    percentile,
    runtime_url,
    settle,
    stop_on_sigterm,
    write_results,
)
from benchmarks.history import ClusterHistory, Step

META = Meta(actor="reconciler")
LOAD_BATCH = 1_000
APPEND_BATCH = 100
WARM_UP = 50
WARM_UP_MAX_EVENTS = 5_000
TARGET_SINGLE_RATIO = 0.7
TARGET_BATCHED_PER_S = 50_000.0
TARGET_REPLAY_PER_S = 200_000.0
SCRIPT = Path(__file__).resolve()


# -- feeding the history to the store and to the bare baseline ------------------------------


class Feed:
    """Takes steps from a history and turns them into append requests that expect the
    streams' current versions, or into the bare rows the baseline inserts."""

    def __init__(self, history: ClusterHistory) -> None:
        self._steps = history.steps()
        self._versions: dict[str, int] = {}
        self._baseline_versions: dict[str, int] = {}

    def take(self, count: int) -> list[Step]:
        return list(itertools.islice(self._steps, count))

    def requests(self, steps: Sequence[Step], *, checked: bool = True) -> list[AppendRequest]:
        """One request per run of consecutive steps on one stream."""
        requests = []
        for stream, run in itertools.groupby(steps, key=lambda step: step[0]):
            events = [NewEvent(event) for _, event in run]
            version = self._versions.get(stream, NO_STREAM)
            self._versions[stream] = version + len(events)
            requests.append(AppendRequest(stream, version if checked else None, events))
        return requests

    def singles(self, steps: Sequence[Step]) -> list[AppendRequest]:
        return [request for step in steps for request in self.requests([step])]

    def baseline_rows(self, steps: Sequence[Step]) -> list[tuple[Any, ...]]:
        """The rows the store would insert for ``steps`` (same columns, same payloads), on
        streams of their own so that they never collide with the store's."""
        meta = encode_meta(META).decode()
        now = datetime.now(UTC)
        rows = []
        for stream, event in steps:
            type_name, schema_version, data = encode_event(event)
            baseline_stream = f"baseline-{stream}"
            version = self._baseline_versions.get(baseline_stream, 0) + 1
            self._baseline_versions[baseline_stream] = version
            node_id = getattr(event, "node_id", None) or getattr(event, "claimed_node_id", None)
            rows.append(
                (baseline_stream, version, type_name, schema_version, data.decode(), meta,
                 uuid.uuid4(), now, getattr(event, "replica_id", None), node_id,
                 getattr(event, "model", None), META.actor, META.correlation_id)
            )  # fmt: skip
        return rows


_COLUMNS = (
    "stream, version, type, schema_version, data, meta, event_id, recorded_at, replica_id, "
    "node_id, model, actor, correlation_id, previous_position, chain_hash"
)
# The chain's columns get a placeholder (as wide as a real hash): the baseline is the table
# alone, and these rows break the chain, which is verified before they are written.
_NO_CHAIN = f"0, '\\x{'00' * 32}'::bytea"
INSERT_ONE = (
    f"INSERT INTO events ({_COLUMNS}) "
    f"VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb, $7, $8, $9, $10, $11, $12, $13, {_NO_CHAIN})"
)
INSERT_MANY = (
    f"INSERT INTO events ({_COLUMNS}) SELECT *, {_NO_CHAIN} FROM unnest($1::text[], "
    "$2::int[], $3::text[], $4::smallint[], $5::jsonb[], $6::jsonb[], $7::uuid[], "
    "$8::timestamptz[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[])"
)


# -- results -----------------------------------------------------------------------------------


class Latency(msgspec.Struct, frozen=True):
    p50_ms: float
    p90_ms: float
    p99_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latency:
        return cls(*(round(percentile(seconds, pct) * 1000, 3) for pct in (50, 90, 99)))


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """The store against a bare INSERT + COMMIT of the same rows, in alternating rounds."""

    unit: str
    per_round: int
    store_rounds: list[float]
    baseline_rounds: list[float]
    store_median: float
    baseline_median: float
    ratio: float
    """Median store rate over median baseline rate."""
    round_ratios: list[float]
    store_latency: Latency
    baseline_latency: Latency
    store_client_cpu_ms: float
    """This process's CPU time per store call, over all rounds."""
    baseline_client_cpu_ms: float
    store_server_ms: float | None
    """Time per store call inside ``llmgw_append``, as PostgreSQL counts it
    (``track_functions``); None where the benchmark may not turn that on."""
    baseline_server_ms: float | None = None
    """The same for the baseline, where it is a function too (the chain comparison)."""


class Load(msgspec.Struct, frozen=True, kw_only=True):
    events: int
    batch: int
    seconds: float
    """Generating the history and appending it."""
    append_seconds: float
    """Inside ``append_many`` only."""
    events_per_s: float
    streams: int
    event_types: dict[str, int]
    settle_seconds: float
    """VACUUM ANALYZE and CHECKPOINT after the load, so that neither autovacuum nor a
    checkpoint of the load's writes runs during a measurement."""


class Results(msgspec.Struct, frozen=True, kw_only=True):
    benchmark: str
    started_at: str
    arguments: dict[str, int]
    server: str
    machine: Machine
    load_average: dict[str, tuple[float, float, float]]
    """At the start of each phase and at the end (1, 5, 15 minutes)."""
    load: Load
    replay: ChildRun
    verify: ChildRun
    rebuild: ChildRun
    single: Comparison
    batched: Comparison
    log_verify_early: ChildRun
    """``log verify`` at a tenth of the load."""
    log_verify: ChildRun
    chain_single: Comparison
    """Single appends with the chain hash (store) and without (baseline)."""
    chain_batched: Comparison
    backfill: Backfill
    targets: dict[str, float]
    met: dict[str, bool]


# -- phases --------------------------------------------------------------------------------------


async def load_history(
    store: PostgresEventStore,
    db: asyncpg.Connection,
    feed: Feed,
    count: int,
    pause: tuple[int, Callable[[], Awaitable[object]]] | None = None,
) -> Load:
    """Append ``count`` events; ``pause`` is (events, what to do once that many are in),
    not counted in the load's time."""
    started = time.perf_counter()
    appending = paused = 0.0
    types: Counter[str] = Counter()
    streams: set[str] = set()
    for offset in range(0, count, LOAD_BATCH):
        if pause is not None and offset == pause[0]:
            before = time.perf_counter()
            await pause[1]()
            paused += time.perf_counter() - before
        steps = feed.take(min(LOAD_BATCH, count - offset))
        types.update(event_type(event) for _, event in steps)
        streams.update(stream for stream, _ in steps)
        requests = feed.requests(steps, checked=False)
        before = time.perf_counter()
        await store.append_many(requests, META)
        appending += time.perf_counter() - before
    seconds = time.perf_counter() - started - paused
    settle_seconds = await settle(db)
    return Load(
        events=count,
        batch=LOAD_BATCH,
        seconds=round(seconds, 2),
        append_seconds=round(appending, 2),
        events_per_s=round(per_second(count, seconds)),
        streams=len(streams),
        event_types=dict(types.most_common()),
        settle_seconds=settle_seconds,
    )


async def track_function_time(db: asyncpg.Connection) -> None:
    """Have every new session of this database count time in PL/pgSQL functions (a
    superuser's setting: on a server of someone else's, the figure is left out)."""
    with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
        name = await db.fetchval("SELECT current_database()")
        await db.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'pl'")


async def compare_single(
    store: PostgresEventStore, db: asyncpg.Connection, feed: Feed, total: int, rounds: int
) -> Comparison:
    async def store_round(steps: list[Step]) -> Timed:
        calls = [
            partial(store.append, request.stream, request.expected_version, request.events, META)
            for request in feed.singles(steps)
        ]
        await store.catch_up()  # fold the baseline's rows before the clock starts
        return await _timed(calls)

    async def baseline_round(steps: list[Step]) -> Timed:
        return await _timed(
            [partial(_insert, db, INSERT_ONE, row) for row in feed.baseline_rows(steps)]
        )

    server = ServerClock(store, db)
    return await _compare("appends/s", feed, store_round, baseline_round, total, rounds, 1, server)


async def compare_batched(
    store: PostgresEventStore, db: asyncpg.Connection, feed: Feed, total: int, rounds: int
) -> Comparison:
    async def store_round(steps: list[Step]) -> Timed:
        batches = [feed.requests(steps[i : i + APPEND_BATCH]) for i in _batch_starts(steps)]
        calls = [partial(store.append_many, requests, META) for requests in batches]
        await store.catch_up()
        return await _timed(calls)

    async def baseline_round(steps: list[Step]) -> Timed:
        batches = [feed.baseline_rows(steps[i : i + APPEND_BATCH]) for i in _batch_starts(steps)]
        columns = [tuple(zip(*rows, strict=True)) for rows in batches]
        return await _timed([partial(_insert, db, INSERT_MANY, values) for values in columns])

    server = ServerClock(store, db)
    return await _compare(
        "events/s", feed, store_round, baseline_round, total, rounds, APPEND_BATCH, server
    )


async def compare_functions(
    installed: PostgresEventStore,
    copy: PostgresEventStore,
    db: asyncpg.Connection,
    feed: Feed,
    total: int,
    rounds: int,
    batch: int,
    copy_schema: str = UNCHAINED_SCHEMA,
) -> Comparison:
    """Appends of ``batch`` events per call through the same store code, calling the
    installed ``llmgw_append`` (the "store" side) and a copy of it in ``copy_schema`` (the
    "baseline" side): without the chain hash, or without 0017's guards."""

    def round_of(store: PostgresEventStore) -> Round:
        async def measure(steps: list[Step]) -> Timed:
            if batch == 1:
                calls = [
                    partial(store.append, r.stream, r.expected_version, r.events, META)
                    for r in feed.singles(steps)
                ]
            else:
                batches = [feed.requests(steps[i : i + batch]) for i in range(0, len(steps), batch)]
                calls = [partial(store.append_many, requests, META) for requests in batches]
            await store.catch_up()  # fold the other side's events before the clock starts
            return await _timed(calls)

        return measure

    unit = "appends/s" if batch == 1 else "events/s"
    return await _compare(
        unit, feed, round_of(installed), round_of(copy), total, rounds, batch,
        ServerClock(installed, db), ServerClock(copy, db, copy_schema),
    )  # fmt: skip


def _batch_starts(steps: Sequence[Step]) -> range:
    return range(0, len(steps), APPEND_BATCH)


async def _insert(db: asyncpg.Connection, statement: str, values: tuple[Any, ...]) -> None:
    async with db.transaction():
        await db.execute(statement, *values)


class Timed(NamedTuple):
    seconds: float
    cpu_seconds: float
    latencies: list[float]


async def _timed(calls: Sequence[Callable[[], Awaitable[object]]]) -> Timed:
    latencies = []
    started, cpu_started = time.perf_counter(), time.process_time()
    for call in calls:
        before = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - before)
    return Timed(time.perf_counter() - started, time.process_time() - cpu_started, latencies)


Round = Callable[[list[Step]], Awaitable[Timed]]


async def _compare(
    unit: str, feed: Feed, store_round: Round, baseline_round: Round, total: int, rounds: int,
    events_per_call: int, server: ServerClock, baseline_server: ServerClock | None = None,
) -> Comparison:  # fmt: skip
    """Alternate rounds of the two (which goes first alternates too, so that a drift in the
    machine's load favours neither). Preparing a round's calls is not timed."""
    per_round = max(total // rounds, events_per_call)
    warm_up = min(WARM_UP * events_per_call, WARM_UP_MAX_EVENTS)
    await store_round(feed.take(warm_up))
    await baseline_round(feed.take(warm_up))
    server_before = await server.reading()
    baseline_before = await baseline_server.reading() if baseline_server else (0, 0.0)
    rates: dict[str, list[float]] = {"store": [], "baseline": []}
    latencies: dict[str, list[float]] = {"store": [], "baseline": []}
    cpu = {"store": 0.0, "baseline": 0.0}
    for number in range(rounds):
        order = [("store", store_round), ("baseline", baseline_round)]
        for name, measure in order if number % 2 == 0 else reversed(order):
            steps = feed.take(per_round)
            timed = await measure(steps)
            latencies[name] += timed.latencies
            cpu[name] += timed.cpu_seconds
            rates[name].append(round(per_second(len(steps), timed.seconds), 1))
    server_ms = server.per_call(server_before, await server.reading())
    baseline_ms = (
        baseline_server.per_call(baseline_before, await baseline_server.reading())
        if baseline_server
        else None
    )
    store_median, baseline_median = median(rates["store"]), median(rates["baseline"])
    store_calls, baseline_calls = len(latencies["store"]), len(latencies["baseline"])
    return Comparison(
        unit=unit,
        per_round=per_round,
        store_rounds=rates["store"],
        baseline_rounds=rates["baseline"],
        store_median=store_median,
        baseline_median=baseline_median,
        ratio=round(store_median / baseline_median, 3),
        round_ratios=[
            round(s / b, 3) for s, b in zip(rates["store"], rates["baseline"], strict=True)
        ],
        store_latency=Latency.of(latencies["store"]),
        baseline_latency=Latency.of(latencies["baseline"]),
        store_client_cpu_ms=round(cpu["store"] / store_calls * 1000, 3),
        baseline_client_cpu_ms=round(cpu["baseline"] / baseline_calls * 1000, 3),
        store_server_ms=server_ms,
        baseline_server_ms=baseline_ms,
    )


class ServerClock:
    """Time PostgreSQL spent inside ``llmgw_append``, from ``pg_stat_user_functions``
    (counted where ``track_functions`` is on: ``run`` turns it on for the database)."""

    def __init__(
        self, store: PostgresEventStore, db: asyncpg.Connection, schema: str = "public"
    ) -> None:
        self._store = store
        self._db = db
        self._schema = schema

    async def reading(self) -> tuple[int, float]:
        """Calls so far and milliseconds spent in them."""
        # A backend reports its counts when a transaction ends, at most once a second.
        await asyncio.sleep(1.1)
        async with connection(self._store.engine) as conn:
            await conn.execute("SELECT 1")
        row = await self._db.fetchrow(
            "SELECT calls, total_time FROM pg_stat_user_functions "
            "WHERE funcname = $1 AND schemaname = $2",
            "llmgw_append",
            self._schema,
        )
        return (row["calls"], row["total_time"]) if row else (0, 0.0)

    @staticmethod
    def per_call(before: tuple[int, float], after: tuple[int, float]) -> float | None:
        calls = after[0] - before[0]
        return round((after[1] - before[1]) / calls, 3) if calls else None


# -- replay, verify and rebuild, each in a process of its own --------------------------------


async def measure_in_child(operation: str, url: str) -> ChildRun:
    return await children.measure_in_child(SCRIPT, operation, url)


async def _replay_counts(engine: AsyncEngine) -> dict[str, int]:
    state = await replay(engine)
    return {
        "nodes": len(state.nodes),
        "models": len(state.models),
        "replicas": len(state.replicas),
        "keys": len(state.keys),
        "position": state.position,
    }


async def _rebuild_counts(engine: AsyncEngine, verify: bool) -> dict[str, int]:
    report = await rebuild(engine, verify=verify)
    differences = Counter(f"differences.{d.table}.{d.problem}" for d in report.differences)
    return {**report.rows, "differences": len(report.differences), **differences}


async def _log_verify_counts(engine: AsyncEngine) -> dict[str, int]:
    result = await verify_log(engine)
    return {"verified": result.events, "head": result.head.position, "broken": int(not result.ok)}


CHILD_OPERATIONS: dict[str, ChildOperation] = {
    **startup.CHILD_OPERATIONS,
    "replay": _replay_counts,
    "verify": partial(_rebuild_counts, verify=True),
    "rebuild": partial(_rebuild_counts, verify=False),
    "log-verify": _log_verify_counts,
}


# -- the run -------------------------------------------------------------------------------


class Sizes(msgspec.Struct, frozen=True):
    events: int
    single: int
    batched: int
    rounds: int
    chain_single: int
    chain_batched: int


async def run(server: BenchServer, sizes: Sizes) -> Results:
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    loads: dict[str, tuple[float, float, float]] = {}

    def phase(name: str) -> None:
        loads[name] = load_average()
        print(f"{name} (load average {' '.join(map(str, loads[name]))})", flush=True)

    async with fresh_database(server) as url:
        machine = await describe_machine(url)
        db = await asyncpg.connect(url)
        await track_function_time(db)
        engine = create_engine(url)
        try:
            store = PostgresEventStore(engine)
            feed = Feed(ClusterHistory())
            phase(f"loading {sizes.events:,} events")
            early: list[ChildRun] = []
            tenth = sizes.events // 10 // LOAD_BATCH * LOAD_BATCH

            async def verify_early() -> None:
                phase(f"log verify at {tenth:,} events")
                early.append(await measure_in_child("log-verify", url))
                phase("loading the rest")

            load = await load_history(store, db, feed, sizes.events, (tenth, verify_early))
            phase("log verify")
            log_verified = await measure_in_child("log-verify", url)
            phase("replay")
            replayed = await measure_in_child("replay", url)
            phase("projections rebuild --verify")
            verified = await measure_in_child("verify", url)
            phase("projections rebuild")
            rebuilt = await measure_in_child("rebuild", url)
            phase(f"single-event appends ({sizes.single:,} a side)")
            single = await compare_single(store, db, feed, sizes.single, sizes.rounds)
            phase(f"batched appends ({sizes.batched:,} events a side)")
            batched = await compare_batched(store, db, feed, sizes.batched, sizes.rounds)
            await install_unchained_append(db)
            bare = engine_finding_first(url, UNCHAINED_SCHEMA)
            unchained = PostgresEventStore(bare)
            try:
                phase(f"chain: single appends ({sizes.chain_single:,} a side)")
                chain_single = await compare_functions(
                    store, unchained, db, feed, sizes.chain_single, sizes.rounds, 1
                )
                phase(f"chain: batched appends ({sizes.chain_batched:,} events a side)")
                chain_batched = await compare_functions(
                    store, unchained, db, feed, sizes.chain_batched, sizes.rounds, APPEND_BATCH
                )
            finally:
                await bare.dispose()
            await engine.dispose()
            phase("chaining the whole log (migration 0005)")
            backfill = await measure_backfill(url, await db.fetchval("SELECT count(*) FROM events"))
            phase("end")
        finally:
            await db.close()
            await engine.dispose()
    targets = {
        "single_ratio": TARGET_SINGLE_RATIO,
        "batched_events_per_s": TARGET_BATCHED_PER_S,
        "replay_events_per_s": TARGET_REPLAY_PER_S,
    }
    measured = {
        "single_ratio": single.ratio,
        "batched_events_per_s": batched.store_median,
        "replay_events_per_s": float(replayed.events_per_s),
    }
    return Results(
        benchmark="eventstore",
        started_at=started_at,
        arguments=msgspec.structs.asdict(sizes),
        server=server.description,
        machine=machine,
        load_average=loads,
        load=load,
        replay=replayed,
        verify=verified,
        rebuild=rebuilt,
        single=single,
        batched=batched,
        log_verify_early=early[0],
        log_verify=log_verified,
        chain_single=chain_single,
        chain_batched=chain_batched,
        backfill=backfill,
        targets=targets,
        met={name: measured[name] >= target for name, target in targets.items()},
    )


def report(results: Results) -> str:
    single, batched, replayed = results.single, results.batched, results.replay
    machine = results.machine
    yes_no = {True: "yes", False: "NO"}
    rows = [
        ("single appends/s, store", f"{single.store_median:,.0f}", "", ""),
        ("single appends/s, bare INSERT", f"{single.baseline_median:,.0f}", "", ""),
        ("single ratio store/bare", f"{single.ratio:.3f}", f">= {TARGET_SINGLE_RATIO}",
         yes_no[results.met["single_ratio"]]),
        ("single append p50/p99 ms, store",
         f"{single.store_latency.p50_ms:.2f}/{single.store_latency.p99_ms:.2f}", "", ""),
        ("single append p50/p99 ms, bare",
         f"{single.baseline_latency.p50_ms:.2f}/{single.baseline_latency.p99_ms:.2f}", "", ""),
        ("single client CPU / server ms, store",
         f"{single.store_client_cpu_ms:.2f}/{_ms(single.store_server_ms)}", "", ""),
        ("batched events/s, store", f"{batched.store_median:,.0f}",
         f">= {TARGET_BATCHED_PER_S:,.0f}", yes_no[results.met["batched_events_per_s"]]),
        ("batched events/s, bare INSERT", f"{batched.baseline_median:,.0f}", "", ""),
        ("batched ratio store/bare", f"{batched.ratio:.3f}", "", ""),
        ("batched p50 ms, store/bare",
         f"{batched.store_latency.p50_ms:.1f}/{batched.baseline_latency.p50_ms:.1f}", "", ""),
        ("batched client CPU / server ms, store",
         f"{batched.store_client_cpu_ms:.2f}/{_ms(batched.store_server_ms)}", "", ""),
        ("replay events/s", f"{replayed.events_per_s:,.0f}", f">= {TARGET_REPLAY_PER_S:,.0f}",
         yes_no[results.met["replay_events_per_s"]]),
        ("replay seconds (client CPU)", f"{replayed.seconds:.2f} ({replayed.cpu_seconds:.2f})",
         "", ""),
        ("replay peak RSS MiB (before)",
         f"{replayed.peak_rss_mib:,.0f} ({replayed.rss_before_mib:,.0f})", "", ""),
        ("rebuild --verify seconds", f"{results.verify.seconds:.2f}", "", ""),
        ("rebuild seconds", f"{results.rebuild.seconds:.2f}", "", ""),
        ("load events/s (seconds)",
         f"{results.load.events_per_s:,.0f} ({results.load.seconds:.0f})", "", ""),
    ]  # fmt: skip
    rows += chain_rows(results)
    rounds = [
        (f"{name} rounds, {comparison.unit}", " ".join(f"{r:,.0f}" for r in rates))
        for comparison, label in ((single, "single"), (batched, "batched"))
        for name, rates in (
            (f"{label} store", comparison.store_rounds),
            (f"{label} bare", comparison.baseline_rounds),
        )
    ]
    differences = results.verify.counts.get("differences", 0)
    return "\n".join(
        [
            f"{machine.cpu_model}, {machine.cores} cores, {machine.memory_gib} GiB, "
            f"Python {machine.python}, PostgreSQL {machine.postgresql} ({results.server})",
            format_table(("figure", "median", "target", "met"), rows),
            "",
            *(f"{name}: {values}" for name, values in rounds),
            f"rebuild --verify differences: {differences}",
            "load average: "
            + "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in results.load_average.items()),
        ]
    )


def chain_rows(results: Results) -> list[tuple[str, str, str, str]]:
    single, batched = results.chain_single, results.chain_batched
    early, verified, backfill = results.log_verify_early, results.log_verify, results.backfill
    return [
        ("chain: single appends/s, with / without",
         f"{single.store_median:,.0f} / {single.baseline_median:,.0f}", "", ""),
        ("chain: single ratio with / without", f"{single.ratio:.3f}", "", ""),
        ("chain: single p50 ms, with / without",
         f"{single.store_latency.p50_ms:.2f} / {single.baseline_latency.p50_ms:.2f}", "", ""),
        ("chain: single server ms, with / without",
         f"{_ms(single.store_server_ms)} / {_ms(single.baseline_server_ms)}", "", ""),
        ("chain: batched events/s, with / without",
         f"{batched.store_median:,.0f} / {batched.baseline_median:,.0f}", "", ""),
        ("chain: batched ratio with / without", f"{batched.ratio:.3f}", "", ""),
        ("chain: batched server ms, with / without",
         f"{_ms(batched.store_server_ms)} / {_ms(batched.baseline_server_ms)}", "", ""),
        (f"log verify of {verified.events:,} events, events/s (seconds)",
         f"{verified.events_per_s:,.0f} ({verified.seconds:.1f})", "", ""),
        ("log verify client CPU seconds", f"{verified.cpu_seconds:.1f}", "", ""),
        (f"log verify peak RSS MiB at {early.events:,} / {verified.events:,} events",
         f"{early.peak_rss_mib:,.0f} / {verified.peak_rss_mib:,.0f}", "", ""),
        ("log verify broke (early / end)",
         f"{early.counts['broken']} / {verified.counts['broken']}", "", ""),
        (f"chaining {backfill.events:,} events (0004 -> 0005), seconds",
         f"{backfill.seconds:.1f}", "", ""),
    ]  # fmt: skip


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", type=int, help="events in the replayed log (1,000,000)")
    parser.add_argument("--single", type=int, help="single-event appends a side (3,000)")
    parser.add_argument("--batched", type=int, help="events appended in batches a side (50,000)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (5)")
    parser.add_argument(
        "--chain-single", type=int, help="single appends a side, with and without the chain (3,000)"
    )
    parser.add_argument(
        "--chain-batched", type=int, help="events a side in batches, with and without (20,000)"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, to try it out")
    parser.add_argument(
        "--startup", action="store_true", help="measure the store's start-up only (see above)"
    )
    parser.add_argument(
        "--startup-sizes",
        type=_sizes,
        help="log sizes to start up at (100000,1000000,5000000; --quick: 20000,100000)",
    )
    parser.add_argument(
        "--startup-tail",
        type=int,
        help=f"events after the snapshot ({startup.TAIL:,}; --quick: 5,000)",
    )
    parser.add_argument(
        "--startup-rounds",
        type=int,
        default=startup.ROUNDS,
        help=f"start-ups from the snapshot per size ({startup.ROUNDS})",
    )
    parser.add_argument(
        "--guards",
        action="store_true",
        help="measure only what migration 0017's checks cost an append (see above)",
    )
    parser.add_argument("--child", choices=sorted(CHILD_OPERATIONS), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    arguments = parse_arguments(argv)
    if arguments.child:
        result = asyncio.run(
            children.run_child(CHILD_OPERATIONS, arguments.child, os.environ[CHILD_URL_ENV])
        )
        sys.stdout.write(msgspec.json.encode(result).decode() + "\n")
        return 0
    quick = arguments.quick
    if arguments.startup:
        return _startup(arguments)
    if arguments.guards:
        return _guards(arguments)
    sizes = Sizes(
        events=arguments.events or (20_000 if quick else 1_000_000),
        single=arguments.single or (500 if quick else 3_000),
        batched=arguments.batched or (5_000 if quick else 50_000),
        rounds=arguments.rounds,
        chain_single=arguments.chain_single or (500 if quick else 3_000),
        chain_batched=arguments.chain_batched or (5_000 if quick else 20_000),
    )
    with bench_server() as server:
        results = asyncio.run(run(server, sizes))
    print(report(results))
    print(f"results: {write_results('eventstore', results)}")
    return 0


# -- what 0017's guards cost (--guards) --------------------------------------------------------

GUARD_CALLS_PER_ROUND = {1: 200, 5: 100, 100: 20, 1_000: 4, 5_000: 2}
"""Calls per round and side at each batch size: a few seconds a round here."""


class GuardResults(msgspec.Struct, frozen=True, kw_only=True):
    benchmark: str
    started_at: str
    events: int
    """Events in the log before the first measured append."""
    rounds: int
    server: str
    machine: Machine
    load: Load
    load_average: dict[str, tuple[float, float, float]]
    costs: list[GuardCost]


async def run_guards(server: BenchServer, events: int, rounds: int, quick: bool) -> GuardResults:
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    loads: dict[str, tuple[float, float, float]] = {}

    def phase(name: str) -> None:
        loads[name] = load_average()
        print(f"{name} (load average {' '.join(map(str, loads[name]))})", flush=True)

    async with fresh_database(server) as url:
        machine = await describe_machine(url)
        db = await asyncpg.connect(url)
        await track_function_time(db)
        await install_unguarded_append(db)
        owner = create_engine(url)
        guarded = create_engine(runtime_url(url))
        unguarded = engine_finding_first(runtime_url(url), UNGUARDED_SCHEMA)
        try:
            feed = Feed(ClusterHistory())
            phase(f"loading {events:,} events")
            load = await load_history(PostgresEventStore(owner), db, feed, events)
            await owner.dispose()
            with_guards, without = PostgresEventStore(guarded), PostgresEventStore(unguarded)
            costs = []
            for batch in BATCHES:
                calls = max(GUARD_CALLS_PER_ROUND[batch] // (4 if quick else 1), 1)
                phase(f"{batch:,} events a call, {calls} calls a round")
                compared = await compare_functions(
                    with_guards, without, db, feed, batch * calls * rounds, rounds, batch,
                    UNGUARDED_SCHEMA,
                )  # fmt: skip
                costs.append(_guard_cost(batch, calls, compared))
            phase("end")
        finally:
            await db.close()
            for engine in (owner, guarded, unguarded):
                await engine.dispose()
    return GuardResults(
        benchmark="eventstore-guards",
        started_at=started_at,
        events=events,
        rounds=rounds,
        server=server.description,
        machine=machine,
        load=load,
        load_average=loads,
        costs=costs,
    )


def _guard_cost(batch: int, calls: int, compared: Comparison) -> GuardCost:
    """Rates in events/s whatever the batch (a single append is one event)."""
    return GuardCost(
        events_per_call=batch,
        calls_per_round=calls,
        guarded_rounds=compared.store_rounds,
        unguarded_rounds=compared.baseline_rounds,
        guarded_median=compared.store_median,
        unguarded_median=compared.baseline_median,
        ratio=compared.ratio,
        round_ratios=compared.round_ratios,
        guarded_p50_ms=compared.store_latency.p50_ms,
        unguarded_p50_ms=compared.baseline_latency.p50_ms,
        guarded_p99_ms=compared.store_latency.p99_ms,
        unguarded_p99_ms=compared.baseline_latency.p99_ms,
        guarded_server_ms=compared.store_server_ms,
        unguarded_server_ms=compared.baseline_server_ms,
    )


def guards_report(results: GuardResults) -> str:
    machine = results.machine
    rows = [
        (f"{cost.events_per_call:,}",
         f"{cost.guarded_median:,.0f} / {cost.unguarded_median:,.0f}",
         f"{cost.ratio:.2f} ({', '.join(f'{r:.2f}' for r in cost.round_ratios)})",
         f"{cost.guarded_p50_ms:.2f} / {cost.unguarded_p50_ms:.2f}",
         f"{cost.guarded_p99_ms:.2f} / {cost.unguarded_p99_ms:.2f}",
         f"{_ms(cost.guarded_server_ms)} / {_ms(cost.unguarded_server_ms)}")
        for cost in results.costs
    ]  # fmt: skip
    headers = (
        "events a call", "events/s, guarded / not", "ratio (rounds)", "p50 ms",
        "p99 ms", "in llmgw_append, ms a call",
    )  # fmt: skip
    return "\n".join([
        f"{machine.cpu_model}, {machine.cores} cores, {machine.memory_gib} GiB, "
        f"Python {machine.python}, PostgreSQL {machine.postgresql} ({results.server})",
        f"log of {results.events:,} events; medians of {results.rounds} alternating rounds; "
        "with 0017's guards / without (0016's function)",
        format_table(headers, rows),
    ])  # fmt: skip


def _guards(arguments: argparse.Namespace) -> int:
    events = arguments.events or (20_000 if arguments.quick else 100_000)
    with bench_server() as server:
        results = asyncio.run(run_guards(server, events, arguments.rounds, arguments.quick))
    print(guards_report(results))
    print(f"results: {write_results('eventstore-guards', results)}")
    return 0


def _startup(arguments: argparse.Namespace) -> int:
    quick = arguments.quick
    sizes = arguments.startup_sizes or ((20_000, 100_000) if quick else startup.SIZES)
    tail = arguments.startup_tail or (5_000 if quick else startup.TAIL)
    if tail >= min(sizes):
        raise SystemExit(f"the tail ({tail:,}) must be shorter than the smallest size")
    with bench_server() as server:
        results = asyncio.run(
            startup.run(server, measure_in_child, sizes, tail, arguments.startup_rounds)
        )
    print(startup.report(results))
    print(f"results: {write_results('eventstore-startup', results)}")
    return 0


def _sizes(value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted(int(part.replace("_", "")) for part in value.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {value!r}") from None
    if not sizes or sizes[0] <= 0:
        raise argparse.ArgumentTypeError("sizes are positive numbers of events")
    return sizes


if __name__ == "__main__":
    sys.exit(main())
