"""What a gateway's routing snapshot read costs the database as the fleet grows.

    python benchmarks/gateway_snapshot.py [--sizes 1000,5000,20000] [--ended-per-live 2]
                                          [--repeat 30] [--rates 10,100] [--churn-s 10]

Every gateway reads its routing snapshot (``app.store.routing_rows.read_routing_rows``, one
statement) on each notification of a projection change, after ``DEFAULT_DEBOUNCE_S``, and
every ``refresh_interval_s`` anyway (``app.gateway.source``). For each of ``--sizes`` live
(serving, routable) replicas, one fresh migrated database (``benchmarks/common.py``) is
seeded straight into the projection tables: 40 models, the live replicas and
``--ended-per-live`` times as many ended ones (stopped, as the projection keeps them), one
shard each, on one node per 4 live replicas, and 100 API keys. Then, on the runtime role's
connection, as a gateway reads:

- the statement reading every route (``read_routing_rows``: the round trip and decoding its
  JSON columns), median and p90 of ``--repeat`` reads;
- the statement reading the routes changed since the position before one change (an event
  about one replica), as a gateway reads after its first read, median and p90;
- taking in what each read found as a gateway does (``routing_of``: the snapshot built,
  from the routes held for a read of changes; then the egress check and the router),
  median: a read of every route on a gateway's first read (nothing held), a read of every
  route again with nothing changed (its periodic read, taken in against the routes held),
  a read of one change;
- the bytes of each answer (the JSON columns as the server sends them);
- at the largest size, both plans (``EXPLAIN (ANALYZE, BUFFERS)``), printed and kept;
- reads a second of a real ``PostgresSnapshotSource`` while a writer makes changes at each
  of ``--rates`` a second for ``--churn-s`` seconds (an event about a replica is added,
  the replica's weight changes, the checkpoint moves on to the event and the log's channel
  is notified with it, as an append does), with a router and an egress check taking
  each snapshot in as a gateway does, side by side: the source as a gateway runs it (reads
  of what changed, its loop's share for snapshots bounded) and one that reads every route
  on every read as soon as the last is done, as gateways did before. Notifications that
  come while a read is under way set one flag: one more read follows them all, so the
  reads a second are bounded by the read's own time plus the debounce (and the pace a
  gateway keeps), not by the rate of changes.

Results are printed and written to ``benchmarks/results/gateway-snapshot-<timestamp>.json``;
``docs/performance.md`` discusses them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import msgspec
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.gateway.egress import EngineEgress
from app.gateway.held_routes import HeldRoutes
from app.gateway.metrics import GatewayMetrics
from app.gateway.routed_urls import RoutedUrls
from app.gateway.router import Router
from app.gateway.snapshot import DatedRows, routing_of
from app.gateway.source import (
    DEFAULT_DEBOUNCE_S,
    DEFAULT_WHOLE_READ_INTERVAL_S,
    SNAPSHOT_SHARE,
    PostgresSnapshotSource,
)
from app.gateway.table import GatewaySnapshot
from app.store.postgres import CHECKPOINT, NOTIFY_CHANNEL
from app.store.routing_rows import read_routing_rows, routing_statement, statement_arguments
from benchmarks.common import (
    BenchServer,
    Machine,
    bench_server,
    describe_machine,
    format_table,
    fresh_database,
    load_average,
    median,
    percentile,
    runtime_url,
    settle,
    stop_on_sigterm,
    write_results,
)

MODELS = 40
KEYS = 100
LIVE_PER_NODE = 4
STATEMENT_TIMEOUT_S = 60.0
JSON_COLUMNS = (
    "declared",
    "created",
    "canaries",
    "cold_starts",
    "policies",
    "apis",
    "start_failures",
    "scaled_to_zero",
    "starting",
    "routes",
    "keys",
)


class Churn(msgspec.Struct, frozen=True, kw_only=True):
    """A gateway's reads while the projection changes ``changes_per_s`` times a second."""

    reads_changes: bool
    """As a gateway reads (what changed); false: every route on every read."""
    changes_per_s: float
    """Asked for."""
    changes: int
    """Made, in ``seconds``."""
    seconds: float
    reads: int
    reads_per_s: float
    whole_reads: int
    """Of the reads, those of every route."""
    gateway_share: float
    """Of the gateway's event loop, the share taking in what it read took: building each
    snapshot and handing it to a router and an egress check as a gateway does."""
    changes_per_read: float
    statement_share: float
    """Of one database connection's time, this gateway's reads took about this share:
    reads of every route a second times that statement's median, plus the other reads a
    second times the median of the read of one change."""


class Size(msgspec.Struct, frozen=True, kw_only=True):
    live_replicas: int
    ended_replicas: int
    nodes: int
    seed_s: float
    routes: int
    answer_bytes: int
    routes_bytes: int
    statement_median_ms: float
    statement_p90_ms: float
    changes_median_ms: float
    changes_p90_ms: float
    changes_bytes: int
    take_median_ms: float
    """Taking in a read of every route: the snapshot built, the egress check, the router."""
    take_p90_ms: float
    again_take_median_ms: float
    """Taking in a read of every route that finds them as held: a gateway's periodic read."""
    changes_take_median_ms: float
    """Taking in a read of one change, applied to the routes held."""
    load_average: tuple[float, float, float]
    churn: list[Churn] = []
    plan: list[str] = []
    changes_plan: list[str] = []


class Results(msgspec.Struct, frozen=True, kw_only=True):
    benchmark: str
    started_at: str
    command: str
    server: str
    machine: Machine | None
    repeat: int
    debounce_s: float
    sizes: list[Size]


# -- seeding -------------------------------------------------------------------------------

_SEED = (
    """
    INSERT INTO models (name, engine, command, gpus_per_shard, gpu_memory_gib,
                        shards_per_replica, desired_replicas, removed, weight, target_waiting,
                        kv_ceiling, spec, replicas_created, declared_at)
    SELECT 'model-' || m, 'vllm', 'vllm serve --port {port}', 1, 0, 1, :live / :models, false, 1, 4,
           0.9, '{}'::jsonb, (:live + :ended) / :models, now()
    FROM generate_series(0, :models - 1) m
    """,
    """
    INSERT INTO nodes (id, address, remote_address, labels, gpus, gpu_count,
                       healthy_gpu_count, agent_version, port_lo, port_hi, connected, lost,
                       cordoned, registered_at)
    SELECT 'gpu-' || n, '10.' || (n / 65536) || '.' || (n / 256 % 256) || '.' || (n % 256),
           '10.' || (n / 65536) || '.' || (n / 256 % 256) || '.' || (n % 256), '{}', '[]',
           8, 8, 'bench', 20000, 20999, true, false, false, now()
    FROM generate_series(0, :nodes - 1) n
    """,
    # Live and ended replicas interleaved, as a fleet that has replaced its replicas over
    # time has them: every (ended per live + 1)-th is live.
    """
    INSERT INTO replicas (id, model, number, phase, routable, placed_at, reason,
                          serving_since, ended_at, end_reason)
    SELECT 'model-' || (i % :models) || '-' || (i / :models + 1), 'model-' || (i % :models),
           i / :models + 1,
           CASE WHEN live THEN 'serving' ELSE 'stopped' END, live, now(), 'scale',
           now(), CASE WHEN live THEN NULL ELSE now() END,
           CASE WHEN live THEN NULL ELSE 'replaced' END
    FROM (SELECT i, i % (:ended / :live + 1) = 0 AS live
          FROM generate_series(0, :live + :ended - 1) i) r
    """,
    """
    INSERT INTO shards (replica_id, shard_index, node_id, gpus, port, phase, came_up,
                        log_tail)
    SELECT id, 0, 'gpu-' || (i % :nodes), jsonb_build_array(i / :nodes % 8), 20000 + i / :nodes,
           CASE WHEN routable THEN 'ready' ELSE 'stopped' END, true, '[]'
    FROM (SELECT id, routable, row_number() OVER (ORDER BY id) - 1 AS i FROM replicas) r
    """,
    """
    INSERT INTO api_keys (id, name, prefix, secret_hash, models, rpm, tpm, created_at,
                          created_by)
    SELECT 'key-' || k, 'bench key ' || k, 'llmgw_' || lpad(k::text, 6, '0'),
           md5(k::text), '[]', 600, NULL, now(), 'bench'
    FROM generate_series(0, :keys - 1) k
    """,
)


async def seed(db: asyncpg.Connection, live: int, ended: int, nodes: int) -> None:
    """The projection tables of a fleet of ``live`` serving replicas and ``ended`` stopped
    ones, written straight in (what the fold would write, without folding the history)."""
    sizes = {":live": live, ":models": MODELS, ":ended": ended, ":nodes": nodes, ":keys": KEYS}
    async with db.transaction():
        for statement in _SEED:
            for name, value in sizes.items():  # whole numbers, written in as literals
                statement = statement.replace(name, str(value))
            await db.execute(statement)
        await db.execute(
            "UPDATE projection_checkpoints SET position = 1 WHERE name = $1", CHECKPOINT
        )


# -- measuring -----------------------------------------------------------------------------


async def answer_bytes(db: asyncpg.Connection, since: int | None) -> tuple[int, int]:
    """The bytes of the statement's JSON columns, all of them and the routes alone."""
    statement = await routing_statement(db, since=since, within_s=STATEMENT_TIMEOUT_S)
    row = await db.fetchrow(statement, *statement_arguments(since))
    assert row is not None
    sizes = {name: len(str(row[name]).encode()) for name in JSON_COLUMNS}
    return sum(sizes.values()), sizes["routes"]


async def plan(db: asyncpg.Connection, since: int | None) -> list[str]:
    statement = await routing_statement(db, since=since, within_s=STATEMENT_TIMEOUT_S)
    rows = await db.fetch("EXPLAIN (ANALYZE, BUFFERS) " + statement, *statement_arguments(since))
    return [str(r[0]) for r in rows]


async def time_reads(
    db: asyncpg.Connection, repeat: int, since: int | None = None, *, again: bool = False
) -> tuple[list[float], list[float], int]:
    """Milliseconds of each statement and of taking in what it read as a gateway does
    (building the snapshot, the egress check, the router), and the routes read: every
    route, or with ``since`` those changed after it, applied to the routes of a read of
    every route taken in first; with ``again``, every route, taken in against the routes of
    a read of every route taken in first."""
    take = as_a_gateway_takes_it()
    held: HeldRoutes | None = None
    if since is not None or again:
        first = await read_routing_rows(db, within_s=STATEMENT_TIMEOUT_S)
        snapshot, held = routing_of(DatedRows(first, 0.0), None)
        take(snapshot)
    for _ in range(3):  # warm the caches and the prepared statement
        await read_routing_rows(db, within_s=STATEMENT_TIMEOUT_S, since=since)
    statement_ms, take_ms = [], []
    routes = 0
    for _ in range(repeat):
        started = time.perf_counter()
        rows = await read_routing_rows(db, within_s=STATEMENT_TIMEOUT_S, since=since)
        read = time.perf_counter()
        snapshot, _ = routing_of(DatedRows(rows, 0.0), held)
        take(snapshot)
        taken = time.perf_counter()
        statement_ms.append((read - started) * 1000)
        take_ms.append((taken - read) * 1000)
        routes = len(rows.routes)
    return statement_ms, take_ms, routes


_POSITION = "SELECT position FROM projection_checkpoints WHERE name = $1"

_CHANGE = """
WITH event AS (
  INSERT INTO events (stream, version, type, schema_version, data, meta, event_id,
                      recorded_at, replica_id, actor, previous_position, chain_hash)
  SELECT 'replica-' || $2, coalesce(max(version), 0) + 1, 'model_tuned', 1, '{}', '{}',
         gen_random_uuid(), now(), $2, 'bench', 0, sha256(''::bytea)
  FROM events WHERE stream = 'replica-' || $2
  RETURNING position),
moved AS (
  UPDATE projection_checkpoints SET position = (SELECT position FROM event) WHERE name = $1
  RETURNING position),
changed AS (
  UPDATE replicas SET weight = (SELECT position FROM moved) % 7 + 1 WHERE id = $2)
SELECT pg_notify($3, position::text) FROM moved
"""
"""One change as an append makes it, without folding: an event about a replica (its
chain left unfilled: nothing verifies this throwaway log), the replica's row, the
checkpoint moved on to the event, the channel notified."""


async def change(owner: asyncpg.Connection) -> None:
    await owner.execute(_CHANGE, CHECKPOINT, "model-0-1", NOTIFY_CHANNEL)


def as_a_gateway_takes_it() -> Callable[[GatewaySnapshot], None]:
    """What a gateway does with each snapshot (``Gateway._use``): the egress check, the
    engines it routes to followed (``GatewayApp.use``), then the router."""
    egress = EngineEgress(None, GatewayMetrics(CollectorRegistry()))
    routed = RoutedUrls()
    router = Router()

    def take(snapshot: GatewaySnapshot) -> None:
        admitted = egress.admit(snapshot)
        routed.take(admitted.routes)
        router.update(admitted)

    return take


async def churn(
    owner: asyncpg.Connection,
    url: str,
    rate: float,
    seconds: float,
    statement_ms: float,
    changes_ms: float,
    *,
    reads_changes: bool,
) -> Churn:
    """A gateway source following the database while ``rate`` changes a second land."""
    source = PostgresSnapshotSource(
        url,
        gateway_id="bench",
        query_timeout_s=STATEMENT_TIMEOUT_S,
        # As gateways read before: every route on every read, as soon as the last is done.
        whole_read_interval_s=DEFAULT_WHOLE_READ_INTERVAL_S if reads_changes else 1e-9,
        snapshot_share=SNAPSHOT_SHARE if reads_changes else 1.0,
    )
    source.subscribe(as_a_gateway_takes_it())
    await source.start(wait_s=STATEMENT_TIMEOUT_S)
    try:
        loads, whole, taking_s = source.loads, source.whole_reads, source.taking_s
        started = time.perf_counter()
        changes = 0
        while (elapsed := time.perf_counter() - started) < seconds:
            await change(owner)
            changes += 1
            await asyncio.sleep(max(0.0, changes / rate - (time.perf_counter() - started)))
        reads, whole_reads = source.loads - loads, source.whole_reads - whole
        taken_s = source.taking_s - taking_s
    finally:
        await source.close()
    reads_per_s = reads / elapsed
    database_s = whole_reads * statement_ms + (reads - whole_reads) * changes_ms
    return Churn(
        reads_changes=reads_changes,
        changes_per_s=rate,
        changes=changes,
        seconds=round(elapsed, 2),
        reads=reads,
        reads_per_s=round(reads_per_s, 2),
        whole_reads=whole_reads,
        gateway_share=round(taken_s / elapsed, 3),
        changes_per_read=round(changes / reads, 1) if reads else float("inf"),
        statement_share=round(database_s / 1000 / elapsed, 3),
    )


async def measure(
    server: BenchServer, live: int, arguments: argparse.Namespace, explain: bool
) -> tuple[Size, Machine]:
    ended = live * arguments.ended_per_live
    nodes = max(1, live // LIVE_PER_NODE)
    async with fresh_database(server) as url:
        machine = await describe_machine(url)
        owner = await asyncpg.connect(url)
        gateway = await asyncpg.connect(runtime_url(url))
        try:
            started = time.perf_counter()
            await seed(owner, live, ended, nodes)
            await settle(owner)
            seed_s = round(time.perf_counter() - started, 1)
            statement_ms, take_ms, routes = await time_reads(gateway, arguments.repeat)
            _, again_take_ms, _ = await time_reads(gateway, arguments.repeat, again=True)
            total, routes_bytes = await answer_bytes(gateway, None)
            await change(owner)
            since = int(await owner.fetchval(_POSITION, CHECKPOINT)) - 1
            changes_ms, changes_take_ms, _ = await time_reads(gateway, arguments.repeat, since)
            changes_bytes, _ = await answer_bytes(gateway, since)
            plan_lines = await plan(owner, None) if explain else []
            changes_plan = await plan(owner, since) if explain else []
            statement_median, changes_median = median(statement_ms), median(changes_ms)
            churns = [
                await churn(
                    owner,
                    runtime_url(url),
                    rate,
                    arguments.churn_s,
                    statement_median,
                    changes_median,
                    reads_changes=reads_changes,
                )
                for rate in arguments.rates
                for reads_changes in (True, False)
            ]
        finally:
            await gateway.close()
            await owner.close()
    size = Size(
        live_replicas=live,
        ended_replicas=ended,
        nodes=nodes,
        seed_s=seed_s,
        routes=routes,
        answer_bytes=total,
        routes_bytes=routes_bytes,
        statement_median_ms=round(statement_median, 2),
        statement_p90_ms=round(percentile(statement_ms, 90), 2),
        changes_median_ms=round(changes_median, 2),
        changes_p90_ms=round(percentile(changes_ms, 90), 2),
        changes_bytes=changes_bytes,
        take_median_ms=round(median(take_ms), 2),
        take_p90_ms=round(percentile(take_ms, 90), 2),
        again_take_median_ms=round(median(again_take_ms), 2),
        changes_take_median_ms=round(median(changes_take_ms), 2),
        load_average=load_average(),
        churn=churns,
        plan=plan_lines,
        changes_plan=changes_plan,
    )
    return size, machine


async def run(server: BenchServer, arguments: argparse.Namespace) -> Results:
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    sizes: list[Size] = []
    machine: Machine | None = None
    largest = max(arguments.sizes)
    for live in arguments.sizes:
        print(f"{live:,} live replicas (load average {load_average()})", flush=True)
        size, machine = await measure(server, live, arguments, explain=live == largest)
        sizes.append(size)
    return Results(
        benchmark="gateway-snapshot",
        started_at=started_at,
        command=" ".join(["python", *sys.argv]),
        server=server.description,
        machine=machine,
        repeat=arguments.repeat,
        debounce_s=DEFAULT_DEBOUNCE_S,
        sizes=sizes,
    )


# -- reporting -----------------------------------------------------------------------------


def report(results: Results) -> str:
    lines = [results.command, ""]
    rows = [
        [
            f"{s.live_replicas:,} live + {s.ended_replicas:,} ended, {s.nodes:,} nodes",
            f"{s.statement_median_ms:.1f}",
            f"{s.statement_p90_ms:.1f}",
            f"{s.answer_bytes / 1024:,.0f}",
            f"{s.changes_median_ms:.2f}",
            f"{s.changes_p90_ms:.2f}",
            f"{s.changes_bytes / 1024:,.1f}",
            f"{s.take_median_ms:.1f}",
            f"{s.again_take_median_ms:.1f}",
            f"{s.changes_take_median_ms:.2f}",
            f"{s.routes:,}",
        ]
        for s in results.sizes
    ]
    headers = [
        "fleet",
        "every route ms",
        "p90",
        "KiB",
        "one change ms",
        "p90",
        "KiB",
        "take ms",
        "take again ms",
        "take one change ms",
        "routes",
    ]
    lines.append(format_table(headers, rows))
    churn_rows = [
        [
            f"{s.live_replicas:,} live, {c.changes_per_s:g} changes/s",
            "what changed" if c.reads_changes else "every route",
            f"{c.changes / c.seconds:.1f}",
            f"{c.reads_per_s:.2f}",
            f"{c.whole_reads}",
            f"{c.changes_per_read:.1f}",
            f"{c.statement_share:.3f}",
            f"{c.gateway_share:.3f}",
        ]
        for s in results.sizes
        for c in s.churn
    ]
    if churn_rows:
        lines += ["", "one gateway under a churning fleet:"]
        headers = ["fleet", "reads", "changes/s", "reads/s", "of every route", "changes/read"]
        lines.append(format_table([*headers, "db share", "gateway share"], churn_rows))
        lines.append("db share: the reads' statement medians a second, of one connection's time")
        lines.append("gateway share: of its event loop, taking in what it read")
    for s in results.sizes:
        if s.plan:
            lines += ["", f"plan of a read of every route at {s.live_replicas:,} live replicas:"]
            lines += s.plan
        if s.changes_plan:
            lines += ["", f"plan of a read of one change at {s.live_replicas:,} live replicas:"]
            lines += s.changes_plan
    lines.append(f"load average: {load_average()}")
    return "\n".join(lines)


def counts(text: str) -> list[int]:
    try:
        values = [int(item.replace("_", "")) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of counts") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each must be at least 1")
    return values


def rates(text: str) -> list[float]:
    try:
        values = [float(item) for item in text.split(",") if item]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of rates") from None
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each rate must be above 0")
    return values


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=counts, default=counts("1000,5000,20000"))
    parser.add_argument(
        "--ended-per-live", type=int, default=2, choices=range(0, 101), metavar="0-100"
    )
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--rates", type=rates, default=rates("10,100"), help="'': no churn")
    parser.add_argument("--churn-s", type=float, default=10.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    arguments = parse_arguments(argv)
    with bench_server() as server:
        results = asyncio.run(run(server, arguments))
    print(report(results))
    print(f"results: {write_results('gateway-snapshot', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
