"""What every benchmark needs: a PostgreSQL to measure against, a fresh database on it,
statistics, a description of the machine, and a place for the results.

The server is ``LLMGW_BENCH_DATABASE_URL`` when that is set (its role needs CREATEDB: each
run creates and drops a database of its own there), else a throwaway local cluster with
fsync on (``LocalPostgres(durable=True)``), so that a commit costs what it costs in
production.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import resource
import signal
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import msgspec
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.store import migrate
from app.store.database import sqlalchemy_url
from app.store.grants import RuntimeRole
from devcluster.postgres import LocalPostgres

BENCH_DATABASE_URL_ENV = "LLMGW_BENCH_DATABASE_URL"
BENCH_RUNTIME_ROLE = RuntimeRole("llmgw_runtime_bench", password="llmgw-runtime-bench")
"""The runtime role the control planes under measurement connect as, as in production."""
RESULTS_DIR = Path(__file__).resolve().parent / "results"
POSTGRES_SETTINGS = (
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "full_page_writes",
    "shared_buffers",
    "max_wal_size",
)


def stop_on_sigterm() -> None:
    """Make SIGTERM stop a benchmark as Ctrl-C does: the running coroutines are cancelled, so
    the processes it started and its throwaway PostgreSQL are taken down. Python's own
    response to SIGTERM ends the interpreter at once and leaves them running."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


class BenchServer(msgspec.Struct, frozen=True):
    """A PostgreSQL server the benchmark may create databases on."""

    admin_url: str
    description: str

    def url(self, database: str) -> str:
        """A ``postgresql://`` URL of ``database`` on this server."""
        url = make_url(self.admin_url).set(drivername="postgresql", database=database)
        return url.render_as_string(hide_password=False)


@contextmanager
def bench_server() -> Iterator[BenchServer]:
    """``LLMGW_BENCH_DATABASE_URL``, else a durable throwaway local cluster (stopped and
    removed on exit)."""
    configured = os.environ.get(BENCH_DATABASE_URL_ENV)
    if configured:
        shown = make_url(configured).render_as_string(hide_password=True)
        yield BenchServer(configured, f"{BENCH_DATABASE_URL_ENV} ({shown})")
        return
    with LocalPostgres(durable=True) as cluster:
        yield BenchServer(cluster.url(), "throwaway local cluster (fsync on)")


@asynccontextmanager
async def fresh_database(
    server: BenchServer, prefix: str = "llmgw_bench", runtime: RuntimeRole = BENCH_RUNTIME_ROLE
) -> AsyncIterator[str]:
    """A new database, migrated to head with ``runtime`` as its runtime role; dropped on
    exit. Yields its URL, the owner's (``runtime_url`` makes the runtime role's)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    await _as_admin(server, f'CREATE DATABASE "{name}"')
    try:
        url = server.url(name)
        await asyncio.to_thread(migrate.upgrade, url, "head", runtime)
        yield url
    finally:
        await _as_admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def runtime_url(url: str, runtime: RuntimeRole = BENCH_RUNTIME_ROLE) -> str:
    """``url`` as ``runtime`` connects to it."""
    as_runtime = make_url(url).set(username=runtime.name, password=runtime.password)
    return as_runtime.render_as_string(hide_password=False)


async def _as_admin(server: BenchServer, statement: str) -> None:
    connection = await asyncpg.connect(server.admin_url)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


# -- statistics ----------------------------------------------------------------------------


def engine_finding_first(url: str, schema: str) -> AsyncEngine:
    """An engine like ``app.store.database.create_engine``'s whose sessions look in
    ``schema`` before ``public``: where a benchmark keeps its copy of ``llmgw_append``
    without what it measures, so that the store calls the copy."""
    return create_async_engine(
        sqlalchemy_url(url),
        pool_size=10,
        max_overflow=10,
        pool_pre_ping=False,
        pool_recycle=1800,
        connect_args={"server_settings": {"search_path": f"{schema}, public"}},
    )


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct``-th percentile (0-100), interpolated between the closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def per_second(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


# -- the machine ---------------------------------------------------------------------------


class Machine(msgspec.Struct, frozen=True, kw_only=True):
    cpu_model: str
    cores: int
    memory_gib: float
    system: str
    python: str
    postgresql: str
    postgres_settings: dict[str, str]


async def describe_machine(database_url: str) -> Machine:
    connection = await asyncpg.connect(database_url)
    try:
        version = await connection.fetchval("SHOW server_version")
        settings = {name: await connection.fetchval(f"SHOW {name}") for name in POSTGRES_SETTINGS}
    finally:
        await connection.close()
    return Machine(
        cpu_model=_cpu_model(),
        cores=os.cpu_count() or 0,
        memory_gib=round(_memory_bytes() / 2**30, 1),
        system=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        postgresql=str(version),
        postgres_settings={name: str(value) for name, value in settings.items()},
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def load_average() -> tuple[float, float, float]:
    """1, 5 and 15-minute load averages: how busy the machine was besides us."""
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


def peak_rss_mib() -> float:
    """This process's own peak resident memory so far: ``VmHWM`` where ``/proc`` has it,
    else ``ru_maxrss``. The two differ in a child process: Linux carries the peak of the
    memory the child had before exec, a copy of its parent's, into ``ru_maxrss``, while
    ``VmHWM`` starts afresh at exec."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return max_rss_mib()


def max_rss_mib() -> float:
    """``ru_maxrss`` of this process (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


# -- reporting -----------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(row[i])) for row in (headers, *rows)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        first, *rest = (str(cell) for cell in cells)
        aligned = [first.ljust(widths[0])]
        aligned += [cell.rjust(width) for cell, width in zip(rest, widths[1:], strict=True)]
        return "  ".join(aligned)

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def write_results(benchmark: str, results: msgspec.Struct) -> Path:
    """Write ``results`` to ``benchmarks/results/<benchmark>-<UTC timestamp>.json``."""
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"{benchmark}-{stamp}.json"
    path.write_bytes(msgspec.json.format(msgspec.json.encode(results), indent=2) + b"\n")
    return path


async def settle(db: asyncpg.Connection) -> float:
    """VACUUM ANALYZE and CHECKPOINT after a load, so that neither autovacuum nor a
    checkpoint of the load's writes runs during a measurement; returns the seconds taken."""
    started = time.perf_counter()
    await db.execute("VACUUM ANALYZE")
    with contextlib.suppress(asyncpg.InsufficientPrivilegeError):  # a server of someone else's
        await db.execute("CHECKPOINT")
    return round(time.perf_counter() - started, 2)
