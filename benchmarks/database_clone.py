"""How long a test waits for its fresh database, for each way of making one, side by side.

    python -m benchmarks.database_clone [--tests 40] [--work-ms 300] [--cloners 1 3]

Each cloner is one pytest worker's share of the suite: a throwaway local cluster of its
own, started as the tests start theirs (``LocalPostgres(durable=False)``), with the schema
migrated into a template as ``tests/support/databases.py`` migrates it. It then plays
``--tests`` tests in a row: take a fresh database, "run" for ``--work-ms`` (a sleep: a
test mostly waits on processes and sockets), give the database back. The figures are the
medians, over every test of every cloner, of the time spent taking the database and of
the time spent giving it back: together, what each test waits on the database rather
than running. ``--cloners 3`` runs three such workers at once, as CI runs three pytest
workers on two cores.

The ways:

- ``template``: ``CREATE DATABASE ... TEMPLATE`` (PostgreSQL 15's ``WAL_LOG`` strategy),
  ``DROP DATABASE ... WITH (FORCE)`` at teardown: what the tests do.
- ``file_copy``: the same with ``STRATEGY = FILE_COPY`` (copies the files; a checkpoint
  before and after).
- ``vacuumed``: the template frozen and analysed first (``VACUUM (FREEZE, ANALYZE)``).
- ``checkpoints``: a cluster with ``checkpoint_timeout=1h`` and ``max_wal_size=4GB``.
- ``drop_later``: the database is dropped by a background task, not at teardown.
- ``pool``: databases cloned ahead by a background task (``POOL_SIZE`` ready), and
  dropped by it too; a test takes a ready one (the tests tried it and went back:
  docs/performance.md, Fresh databases for tests).

``CREATE DATABASE ... OID`` is left out: it only chooses the new database's OID, the copy
is the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import asyncpg

from app.store import migrate
from app.store.grants import RuntimeRole
from benchmarks.common import load_average, median, stop_on_sigterm
from devcluster.postgres import LocalPostgres

RUNTIME_ROLE = RuntimeRole("llmgw_runtime_bench", password="llmgw-runtime-bench")
RELAXED_CHECKPOINTS = {"checkpoint_timeout": "1h", "max_wal_size": "4GB"}
POOL_SIZE = 2


@dataclass
class Timings:
    take_s: list[float] = field(default_factory=list)
    give_back_s: list[float] = field(default_factory=list)


@dataclass
class Cloner:
    """One worker's cluster and its migrated template. Each statement is sent on a
    connection of its own, as ``tests/support/postgres.py`` sends it."""

    cluster: LocalPostgres
    template: str

    async def create(self, template: str, strategy: str = "") -> str:
        name = f"bench_{uuid.uuid4().hex[:12]}"
        suffix = f" STRATEGY = {strategy}" if strategy else ""
        await self.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"{suffix}')
        return name

    async def drop(self, name: str) -> None:
        await self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    async def execute(self, statement: str, database: str = "postgres") -> None:
        connection = await asyncpg.connect(self.cluster.url(database))
        try:
            await connection.execute(statement)
        finally:
            await connection.close()


Way = Callable[[Cloner, int, float, Timings], Awaitable[None]]


async def synchronous(
    cloner: Cloner,
    tests: int,
    work_s: float,
    timings: Timings,
    *,
    template: str | None = None,
    strategy: str = "",
) -> None:
    for _ in range(tests):
        started = time.perf_counter()
        name = await cloner.create(template or cloner.template, strategy)
        created = time.perf_counter()
        await asyncio.sleep(work_s)
        ended = time.perf_counter()
        await cloner.drop(name)
        timings.take_s.append(created - started)
        timings.give_back_s.append(time.perf_counter() - ended)


async def drop_later(cloner: Cloner, tests: int, work_s: float, timings: Timings) -> None:
    async with background_dropper(cloner) as to_drop:
        for _ in range(tests):
            started = time.perf_counter()
            name = await cloner.create(cloner.template)
            created = time.perf_counter()
            await asyncio.sleep(work_s)
            ended = time.perf_counter()
            to_drop.put_nowait(name)
            timings.take_s.append(created - started)
            timings.give_back_s.append(time.perf_counter() - ended)


async def pool(cloner: Cloner, tests: int, work_s: float, timings: Timings) -> None:
    ready: asyncio.Queue[str] = asyncio.Queue(maxsize=POOL_SIZE)

    async def fill() -> None:
        while True:
            await ready.put(await cloner.create(cloner.template))

    async with background_dropper(cloner) as to_drop:
        filler = asyncio.create_task(fill())
        try:
            for _ in range(tests):
                started = time.perf_counter()
                name = await ready.get()
                taken = time.perf_counter()
                await asyncio.sleep(work_s)
                ended = time.perf_counter()
                to_drop.put_nowait(name)
                timings.take_s.append(taken - started)
                timings.give_back_s.append(time.perf_counter() - ended)
        finally:
            filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await filler
            while not ready.empty():
                to_drop.put_nowait(ready.get_nowait())


@asynccontextmanager
async def background_dropper(cloner: Cloner) -> AsyncIterator[asyncio.Queue[str]]:
    """A queue of databases to drop, dropped one at a time by a task of its own; every
    queued one is dropped before this exits."""
    queue: asyncio.Queue[str] = asyncio.Queue()

    async def drop_each() -> None:
        while True:
            await cloner.drop(await queue.get())
            queue.task_done()

    dropper = asyncio.create_task(drop_each())
    try:
        yield queue
        await queue.join()
    finally:
        dropper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dropper


@asynccontextmanager
async def cloners(count: int, settings: dict[str, str]) -> AsyncIterator[list[Cloner]]:
    async with AsyncExitStack() as stack:
        clusters = [LocalPostgres(durable=False, settings=settings) for _ in range(count)]
        for cluster in clusters:
            stack.callback(cluster.close)
        await asyncio.gather(*(asyncio.to_thread(cluster.start) for cluster in clusters))
        # One at a time: two migrations in threads of one process trip over each other.
        yield [await migrated_cloner(cluster) for cluster in clusters]


async def migrated_cloner(cluster: LocalPostgres) -> Cloner:
    cloner = Cloner(cluster, "bench_template")
    await cloner.execute('CREATE DATABASE "bench_template"')
    await asyncio.to_thread(migrate.upgrade, cluster.url("bench_template"), "head", RUNTIME_ROLE)
    await cloner.execute('CREATE DATABASE "bench_vacuumed" TEMPLATE "bench_template"')
    await cloner.execute("VACUUM (FREEZE, ANALYZE)", database="bench_vacuumed")
    await cloner.execute("CHECKPOINT")
    return cloner


def ways() -> dict[str, tuple[dict[str, str], Way]]:
    async def template(c: Cloner, n: int, w: float, t: Timings) -> None:
        await synchronous(c, n, w, t)

    async def file_copy(c: Cloner, n: int, w: float, t: Timings) -> None:
        await synchronous(c, n, w, t, strategy="FILE_COPY")

    async def vacuumed(c: Cloner, n: int, w: float, t: Timings) -> None:
        await synchronous(c, n, w, t, template="bench_vacuumed")

    return {
        "template": ({}, template),
        "file_copy": ({}, file_copy),
        "vacuumed": ({}, vacuumed),
        "checkpoints": (RELAXED_CHECKPOINTS, template),
        "drop_later": ({}, drop_later),
        "pool": ({}, pool),
    }


async def measure(chosen: list[str], cloner_counts: list[int], tests: int, work_s: float) -> None:
    table = ways()
    print(f"{tests} tests a cloner, {work_s * 1000:.0f} ms of work each; load {load_average()}")
    print(f"{'way':<12} {'cloners':>7} {'take ms':>8} {'give ms':>8} {'wait ms':>8}", flush=True)
    for count in cloner_counts:
        for settings in ({}, RELAXED_CHECKPOINTS):
            names = [name for name in chosen if table[name][0] == settings]
            if not names:
                continue
            async with cloners(count, settings) as workers:
                for name in names:
                    timings = Timings()
                    way = table[name][1]
                    await asyncio.gather(*(way(c, tests, work_s, timings) for c in workers))
                    print_row(name, count, timings)
    print(f"load {load_average()}")


def print_row(name: str, count: int, timings: Timings) -> None:
    take = median(timings.take_s) * 1000
    give = median(timings.give_back_s) * 1000
    waits = [a + b for a, b in zip(timings.take_s, timings.give_back_s, strict=True)]
    print(
        f"{name:<12} {count:>7} {take:>8.1f} {give:>8.1f} {median(waits) * 1000:>8.1f}", flush=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=40, help="tests each cloner plays")
    parser.add_argument("--work-ms", type=float, default=300.0, help="each test's own time")
    parser.add_argument("--cloners", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--ways", nargs="+", default=list(ways()), choices=list(ways()))
    args = parser.parse_args()
    stop_on_sigterm()
    asyncio.run(measure(args.ways, args.cloners, args.tests, args.work_ms / 1000))


if __name__ == "__main__":
    main()
