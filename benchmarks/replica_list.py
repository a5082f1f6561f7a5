"""What a page of the admin API's replica list costs as the projection's history grows.

    python benchmarks/replica_list.py [--live 20000] [--ended 300000] [--repeat 20]

``GET /admin/v1/replicas?after=&limit=`` merges the replicas the fold holds with the ended
ones it forgot, read a page at a time from the projection
(``app.store.replica_rows.read_forgotten_replicas``). One fresh migrated database
(``benchmarks/common.py``) is seeded straight into the projection tables as
``benchmarks/gateway_snapshot.py`` seeds it: 40 models, ``--live`` serving replicas and
``--ended`` stopped ones, interleaved, one shard each. Then, as the runtime role, with the
fold's replicas (the live ones) passed as known, it times three pages of 500 of the ended
replicas: the first, one from the middle (after a replica half way down the list), and
the first of one model; median and p90 of ``--repeat`` reads, and the plan of the middle
one. It does so twice in the same run: with the list's index (``ix_replicas_listing``,
migration 0019), then with it dropped, as before that migration.

Results are printed and written to ``benchmarks/results/replica-list-<timestamp>.json``;
``docs/performance.md`` discusses them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.domain.replica_listing import ReplicaPage
from app.domain.state import ENDED_PHASES, ReplicaFilter, ReplicaPhase
from app.store.database import create_engine
from app.store.replica_rows import (
    any_ended_replica,
    any_ended_statement,
    ended_rows_statement,
    read_forgotten_replicas,
)
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
from benchmarks.gateway_snapshot import LIVE_PER_NODE, seed

PAGE = 500
PLAN_LINE_CHARACTERS = 160
_MIDDLE = """
SELECT model, number, id FROM replicas
ORDER BY model COLLATE "C", number, id COLLATE "C" OFFSET $1 LIMIT 1
"""


class Page(msgspec.Struct, frozen=True, kw_only=True):
    page: str
    median_ms: float
    p90_ms: float
    replicas: int


class Check(msgspec.Struct, frozen=True, kw_only=True):
    """Whether any ended replica matches ``among``: what a list without them left out."""

    among: str
    median_ms: float
    p90_ms: float
    found: bool


class Run(msgspec.Struct, frozen=True, kw_only=True):
    index: bool
    pages: list[Page]
    plan: list[str]
    checks: list[Check] = []
    check_plan: list[str] = []


class Results(msgspec.Struct, frozen=True, kw_only=True):
    benchmark: str
    started_at: str
    command: str
    server: str
    machine: Machine | None
    live: int
    ended: int
    repeat: int
    load_average: tuple[float, float, float]
    runs: list[Run]


async def time_pages(
    url: str, known: list[str], middle: tuple[str, int, str], repeat: int
) -> list[Page]:
    engine = create_engine(runtime_url(url), pool_size=1)
    pages = {
        "first": (ReplicaFilter(), ReplicaPage(limit=PAGE)),
        "middle": (ReplicaFilter(), ReplicaPage(after=middle, limit=PAGE)),
        "one model's first": (ReplicaFilter(model="model-7"), ReplicaPage(limit=PAGE)),
    }
    measured = []
    try:
        for name, (among, page) in pages.items():
            for _ in range(3):  # warm the caches
                await read_forgotten_replicas(engine, known, among, page)
            times, count = [], 0
            for _ in range(repeat):
                started = time.perf_counter()
                count = len(await read_forgotten_replicas(engine, known, among, page))
                times.append((time.perf_counter() - started) * 1000)
            measured.append(
                Page(
                    page=name,
                    median_ms=round(median(times), 2),
                    p90_ms=round(percentile(times, 90), 2),
                    replicas=count,
                )
            )
    finally:
        await engine.dispose()
    return measured


CHECKS = {
    "every replica": ReplicaFilter(),
    "one model": ReplicaFilter(model="model-7"),
    "one node": ReplicaFilter(node_id="gpu-3"),
    "a model with none": ReplicaFilter(model="model-none"),
    "a node with none": ReplicaFilter(node_id="gpu-none"),
    "a phase none is in": ReplicaFilter(phase=ReplicaPhase.LOST),
    "one model, a phase none is in": ReplicaFilter(model="model-7", phase=ReplicaPhase.LOST),
}
"""What the check of ended replicas left out is timed for."""


async def time_checks(url: str, repeat: int) -> list[Check]:
    engine = create_engine(runtime_url(url), pool_size=1)
    measured = []
    try:
        for name, among in CHECKS.items():
            for _ in range(3):  # warm the caches
                await any_ended_replica(engine, among)
            times, found = [], False
            for _ in range(repeat):
                started = time.perf_counter()
                found = await any_ended_replica(engine, among)
                times.append((time.perf_counter() - started) * 1000)
            measured.append(
                Check(
                    among=name,
                    median_ms=round(median(times), 2),
                    p90_ms=round(percentile(times, 90), 2),
                    found=found,
                )
            )
    finally:
        await engine.dispose()
    return measured


async def check_plan(owner: asyncpg.Connection, among: ReplicaFilter) -> list[str]:
    """The plan of the check of whether an ended replica is ``among`` those asked for."""
    statement, args = any_ended_statement(ENDED_PHASES, among)
    rows = await owner.fetch("EXPLAIN (ANALYZE, BUFFERS) " + statement, *args)
    return [_shortened(str(r[0])) for r in rows]


async def plan(
    owner: asyncpg.Connection, known: list[str], among: ReplicaFilter, page: ReplicaPage
) -> list[str]:
    """The plan of the statement that reads ``page`` of the ended replicas ``among``."""
    phases = [phase.value for phase in ENDED_PHASES]
    statement, args = ended_rows_statement(phases, known, among, page)
    rows = await owner.fetch("EXPLAIN (ANALYZE, BUFFERS) " + statement, *args)
    return [_shortened(str(r[0])) for r in rows]


def _shortened(line: str, most: int = PLAN_LINE_CHARACTERS) -> str:
    """``line`` cut at ``most`` characters: a filter names every known replica id."""
    return line if len(line) <= most else line[: most - 3] + "..."


async def run(server: BenchServer, arguments: argparse.Namespace) -> Results:
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    live, ended = arguments.live, arguments.ended
    runs = []
    async with fresh_database(server) as url:
        machine = await describe_machine(url)
        owner = await asyncpg.connect(url)
        try:
            print(f"seeding {live:,} live and {ended:,} ended replicas", flush=True)
            await seed(owner, live, ended, max(1, live // LIVE_PER_NODE))
            await settle(owner)
            known = [r["id"] for r in await owner.fetch("SELECT id FROM replicas WHERE routable")]
            row = await owner.fetchrow(_MIDDLE, (live + ended) // 2)
            assert row is not None
            middle = (str(row["model"]), int(row["number"]), str(row["id"]))
            for index in (True, False):
                if not index:
                    await owner.execute("DROP INDEX ix_replicas_listing")
                    await settle(owner)
                print(f"pages {'with' if index else 'without'} the index", flush=True)
                pages = await time_pages(url, known, middle, arguments.repeat)
                middle_page = ReplicaPage(after=middle, limit=PAGE)
                one_model = ReplicaFilter(model="model-7")
                plans = [
                    *await plan(owner, known, ReplicaFilter(), middle_page),
                    "",
                    *await plan(owner, known, one_model, ReplicaPage(limit=PAGE)),
                ]
                checks = await time_checks(url, arguments.repeat)
                checked = await check_plan(owner, CHECKS["one model"])
                runs.append(
                    Run(index=index, pages=pages, plan=plans, checks=checks, check_plan=checked)
                )
        finally:
            await owner.close()
    return Results(
        benchmark="replica-list",
        started_at=started_at,
        command=" ".join(["python", *sys.argv]),
        server=server.description,
        machine=machine,
        live=live,
        ended=ended,
        repeat=arguments.repeat,
        load_average=load_average(),
        runs=runs,
    )


def report(results: Results) -> str:
    lines = [results.command, ""]
    rows = [
        [
            "with ix_replicas_listing" if r.index else "without (before 0019)",
            p.page,
            f"{p.median_ms:.1f}",
            f"{p.p90_ms:.1f}",
            f"{p.replicas}",
        ]
        for r in results.runs
        for p in r.pages
    ]
    lines.append(
        f"a page of {PAGE} ended replicas, {results.live:,} live + {results.ended:,} ended:"
    )
    lines.append(format_table(["index", "page", "median ms", "p90", "replicas"], rows))
    checks = [
        [
            "with ix_replicas_listing" if r.index else "without (before 0019)",
            c.among,
            f"{c.median_ms:.2f}",
            f"{c.p90_ms:.2f}",
            "yes" if c.found else "no",
        ]
        for r in results.runs
        for c in r.checks
    ]
    lines += ["", "whether a list without the ended replicas left any out:"]
    lines.append(format_table(["index", "among", "median ms", "p90", "found"], checks))
    for r in results.runs:
        lines += [
            "",
            f"plans of the middle page and of one model's first page "
            f"{'with' if r.index else 'without'} the index:",
        ]
        lines += r.plan
        lines += ["", "plan of the check of one model:", *r.check_plan]
    lines.append(f"load average: {results.load_average}")
    return "\n".join(lines)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", type=int, default=20_000)
    parser.add_argument("--ended", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=20)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    arguments = parse_arguments(argv)
    with bench_server() as server:
        results = asyncio.run(run(server, arguments))
    print(report(results))
    print(f"results: {write_results('replica-list', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
