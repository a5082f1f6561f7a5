"""Measuring one operation in a process of its own, so that its time and its peak memory are
its own and not the loading process's (``benchmarks/eventstore.py``).

The parent runs ``<script> --child <operation>`` with the database URL in
``LLMGW_BENCH_CHILD_URL`` (not on the command line: it may hold a password); the child
connects, runs the operation from its table and prints a ``ChildRun`` as JSON (its logs go
to stderr, warnings and worse only).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import msgspec
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.logs import configure_logging
from app.store.database import create_engine
from benchmarks.common import max_rss_mib, peak_rss_mib, per_second

CHILD_URL_ENV = "LLMGW_BENCH_CHILD_URL"

ChildOperation = Callable[[AsyncEngine], Awaitable[dict[str, int]]]
"""Runs against the database; returns counts to report (rows, positions, milliseconds)."""


class ChildRun(msgspec.Struct, frozen=True, kw_only=True):
    """One operation, measured in a process of its own."""

    operation: str
    events: int
    seconds: float
    cpu_seconds: float
    """This process's CPU time during the operation: the rest of ``seconds`` is the
    server's work and waiting for a core."""
    events_per_s: float
    rss_before_mib: float
    """Peak RSS with the interpreter, the imports and a connection, before the operation."""
    peak_rss_mib: float
    """The process's own peak RSS (``VmHWM``)."""
    ru_maxrss_mib: float
    """``ru_maxrss``: at least the parent's RSS when it started this process (see
    ``benchmarks.common.peak_rss_mib``), so only an upper bound."""
    counts: dict[str, int]


async def measure_in_child(script: Path, operation: str, url: str) -> ChildRun:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        "--child",
        operation,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, CHILD_URL_ENV: url},  # not on the command line: it may hold a password
    )
    output, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the {operation} process exited with status {process.returncode}")
    return msgspec.json.decode(output, type=ChildRun)


async def run_child(operations: Mapping[str, ChildOperation], operation: str, url: str) -> ChildRun:
    # stdout carries the result alone; a warning (a snapshot passed over, say) goes to stderr.
    configure_logging("warning", command="benchmarks/children.py")
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:  # connecting is not part of the operation
            events = (await conn.execute(text("SELECT count(*) FROM events"))).scalar_one()
        rss_before = peak_rss_mib()
        started, cpu_started = time.perf_counter(), time.process_time()
        counts = await operations[operation](engine)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        peak, ru_maxrss = peak_rss_mib(), max_rss_mib()
    finally:
        await engine.dispose()
    return ChildRun(
        operation=operation,
        events=events,
        seconds=round(seconds, 3),
        cpu_seconds=round(cpu_seconds, 3),
        events_per_s=round(per_second(events, seconds)),
        rss_before_mib=rss_before,
        peak_rss_mib=peak,
        ru_maxrss_mib=ru_maxrss,
        counts=counts,
    )
