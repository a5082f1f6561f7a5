"""How long forgetting ended replicas holds the log: the append of an
``ended_replicas_forgotten`` that deletes their rows, beside one that deletes none.

    python benchmarks/forget_ended.py [--live 20000] [--ended 300000] [--models 5]

``llmgw-cli forget-ended`` appends one ``ended_replicas_forgotten`` per model, and
``llmgw_append`` (migration 0020) deletes the model's rows that ended by the cutoff inside
the append: every other append (an agent's report, a reconciler pass, an operator's
change) waits until it is done. One fresh migrated database (``benchmarks/common.py``) is
seeded straight into the projection tables as ``benchmarks/gateway_snapshot.py`` seeds it:
40 models, ``--live`` serving replicas and ``--ended`` stopped ones, one shard each. Then,
through ``PostgresEventStore`` as the runtime role, it times:

- the baseline: the same event for a model with no row (the statement runs, deletes none);
- ``--models`` appends that each forget one model's ended replicas (``--ended`` / 40 each);
- one append that forgets every other model's at once, as a first ``forget-ended`` after
  months without one does.

Results are printed and written to ``benchmarks/results/forget-ended-<timestamp>.json``;
``docs/performance.md`` discusses them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.domain.envelope import Meta
from app.domain.events import EndedReplicasForgotten, model_stream
from app.store.database import create_engine
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from benchmarks.common import (
    BenchServer,
    Machine,
    bench_server,
    describe_machine,
    format_table,
    fresh_database,
    load_average,
    median,
    runtime_url,
    settle,
    stop_on_sigterm,
    write_results,
)
from benchmarks.gateway_snapshot import LIVE_PER_NODE, MODELS, seed

META = Meta(actor="operator:bench")
NO_ROWS_MODEL = "model-without-rows"


class Timed(msgspec.Struct, frozen=True):
    what: str
    rows: int
    """Replica rows the appends deleted, in all."""
    appends: int
    median_ms: float
    each_ms: list[float]


class Results(msgspec.Struct, frozen=True):
    benchmark: str
    started_at: str
    command: str
    server: str
    machine: Machine
    live: int
    ended: int
    load_average: tuple[float, float, float]
    timed: list[Timed]


async def forget(store: PostgresEventStore, models: Sequence[str], before: datetime) -> float:
    """Milliseconds of one append that forgets ``models``' replicas ended by ``before``."""
    requests = [
        AppendRequest(
            model_stream(model),
            None,
            [NewEvent(EndedReplicasForgotten(model=model, before=before))],
        )
        for model in models
    ]
    started = time.perf_counter()
    await store.append_many(requests, META)
    return (time.perf_counter() - started) * 1000


async def replica_rows(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM replicas"))


async def timed(
    what: str, store: PostgresEventStore, db: asyncpg.Connection, batches: list[list[str]]
) -> Timed:
    # A cutoff after the seeding: every seeded end is before it. The store takes any
    # cutoff; only the operator's request is held to an hour ago.
    before = datetime.now(UTC) + timedelta(minutes=1)
    rows_before = await replica_rows(db)
    each = [await forget(store, models, before) for models in batches]
    deleted = rows_before - await replica_rows(db)
    return Timed(
        what=what,
        rows=deleted,
        appends=len(batches),
        median_ms=round(median(each), 1),
        each_ms=[round(ms, 1) for ms in each],
    )


async def run(server: BenchServer, arguments: argparse.Namespace) -> Results:
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    live, ended = arguments.live, arguments.ended
    async with fresh_database(server) as url:
        machine = await describe_machine(url)
        owner = await asyncpg.connect(url)
        engine = create_engine(runtime_url(url))
        try:
            print(f"seeding {live:,} live and {ended:,} ended replicas", flush=True)
            await seed(owner, live, ended, max(1, live // LIVE_PER_NODE))
            await settle(owner)
            store = PostgresEventStore(engine)
            models = [f"model-{m}" for m in range(MODELS)]
            one_by_one, rest = models[: arguments.models], models[arguments.models :]
            results = [
                await timed("a model with no row (baseline)", store, owner, [[NO_ROWS_MODEL]] * 5),
                await timed("one model's ended replicas", store, owner, [[m] for m in one_by_one]),
                await timed(f"{len(rest)} models' at once", store, owner, [rest]),
            ]
        finally:
            await engine.dispose()
            await owner.close()
    return Results(
        benchmark="forget-ended",
        started_at=started_at,
        command=" ".join(["python", *sys.argv]),
        server=server.description,
        machine=machine,
        live=live,
        ended=ended,
        load_average=load_average(),
        timed=results,
    )


def report(results: Results) -> str:
    rows = [
        [t.what, f"{t.appends}", f"{t.rows:,}", f"{t.median_ms:.1f}", f"{max(t.each_ms):.1f}"]
        for t in results.timed
    ]
    return "\n".join(
        [
            results.command,
            "",
            f"an append of ended_replicas_forgotten, {results.live:,} live + "
            f"{results.ended:,} ended replicas:",
            format_table(["forgetting", "appends", "rows deleted", "median ms", "max ms"], rows),
            f"load average: {results.load_average}",
        ]
    )


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", type=int, default=20_000)
    parser.add_argument("--ended", type=int, default=300_000)
    parser.add_argument("--models", type=int, default=5, help="models forgotten one by one")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    arguments = parse_arguments(argv)
    with bench_server() as server:
        results = asyncio.run(run(server, arguments))
    print(report(results))
    print(f"results: {write_results('forget-ended', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
