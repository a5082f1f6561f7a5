"""The gateway's snapshot from PostgreSQL, kept current, and its in-flight reports.

``PostgresSnapshotSource`` holds one connection to the database. On it, it

- reads the snapshot (``app.gateway.snapshot``: declared models and their canaries, the
  ``routing_table`` view, live API keys and the projection's position) in one statement,
  so it sees one consistent state;
- LISTENs on the log's channel: an append wakes it, and after ``debounce_s`` (one read for
  a burst of appends) it reads again, so a revoked key is refused within a second;
- reads again every ``refresh_interval_s`` anyway, in case a notification was lost;
- writes the router's in-flight counts to ``gateway_reports`` every
  ``report_interval_s``, for the reconciler (``app.store.gateway_reports``), and in the
  same statement the requests it holds queued per model (with the in-flight counts, the
  demand the autoscaler reads), what the gateway saw of each replica's requests over
  its window, for the admin API (``app.gateway.traffic``), and the replicas it keeps out
  of its rotation for failing (``app.gateway.ejection``);
- writes that report at once, instead of at its next turn, when ``report_soon()`` is
  called (the router does when it starts holding requests for a model that starts from
  zero), but never more often than every ``MIN_REPORT_GAP_S``.

When the database goes away the last snapshot keeps serving and ``fresh()`` turns false
(``/readyz`` says so); the loss is logged once, and so is the return. It reconnects with
backoff and reads the snapshot again at once when the database is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from time import monotonic
from typing import Any

import asyncpg
import structlog

from app.gateway.snapshot import read_snapshot
from app.gateway.table import GatewaySnapshot, SnapshotListener
from app.store.database import driver_url
from app.store.gateway_reports import TrafficReport, delete_report, write_report
from app.store.postgres import NOTIFY_CHANNEL

log = structlog.get_logger(__name__)

DEFAULT_REFRESH_INTERVAL_S = 5.0
DEFAULT_REPORT_INTERVAL_S = 0.5
DEFAULT_DEBOUNCE_S = 0.05
MIN_REPORT_GAP_S = 0.05
"""``report_soon()`` writes a report at most this soon after the last one, however often
it is called."""
REPORT_LATE_S = 2.0
"""A report this much later than due is logged (``gateway_report_late``)."""
QUERY_TIMEOUT_S = 5.0
"""A statement that takes longer is taken for a dead connection (a network that drops
packets sends no reset)."""
BACKOFF_S = (0.1, 2.0)
CLOSE_WITHIN_S = 2.0

_CONNECTION_LOST = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,  # also a schema that is not migrated yet: wait for it alike
    asyncpg.InterfaceError,
)

InFlightCounter = Callable[[], dict[str, int]]
QueuedCounter = Callable[[], dict[str, int]]
TrafficReader = Callable[[], TrafficReport]
EjectedReader = Callable[[], dict[str, int]]


def default_gateway_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _same_content(a: GatewaySnapshot, b: GatewaySnapshot) -> bool:
    return (
        a.declared == b.declared
        and a.routes == b.routes
        and a.canaries == b.canaries
        and a.cold_start_s == b.cold_start_s
        and a.keys == b.keys
    )


class PostgresSnapshotSource:
    def __init__(
        self,
        database_url: str,
        *,
        gateway_id: str | None = None,
        refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S,
        report_interval_s: float = DEFAULT_REPORT_INTERVAL_S,
        debounce_s: float = DEFAULT_DEBOUNCE_S,
        query_timeout_s: float = QUERY_TIMEOUT_S,
    ) -> None:
        for name, value in (
            ("refresh interval", refresh_interval_s),
            ("report interval", report_interval_s),
            ("query timeout", query_timeout_s),
        ):
            if value <= 0:
                raise ValueError(f"the {name} must be positive, not {value}")
        self.gateway_id = gateway_id or default_gateway_id()
        self._url = driver_url(database_url)
        self._refresh_interval_s = refresh_interval_s
        self._report_interval_s = report_interval_s
        self._debounce_s = max(debounce_s, 0.0)
        self._timeout_s = query_timeout_s
        self._snapshot = GatewaySnapshot()
        self._listeners: list[SnapshotListener] = []
        self._in_flight: InFlightCounter | None = None
        self._traffic: TrafficReader | None = None
        self._queued: QueuedCounter | None = None
        self._ejected: EjectedReader | None = None
        self._report_soon = False
        self._up = False
        self._up_since_connect = False
        self._loss_logged = False
        self._late_logged = False
        self._wake = asyncio.Event()
        self._notified = False
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.first_attempt = asyncio.Event()
        """Set once the first connection and read succeeded or failed."""
        self.loads = 0
        """Snapshots read so far (tests wait on it)."""
        self.last_error: str | None = None

    # -- the SnapshotSource protocol ------------------------------------------------------

    def current(self) -> GatewaySnapshot:
        return self._snapshot

    def fresh(self) -> bool:
        """True while the database answers; false on the last snapshot it gave, or before
        the first one."""
        return self._up

    def subscribe(self, callback: SnapshotListener) -> None:
        """Call ``callback`` with every snapshot whose routes, canaries, cold-start timeouts,
        keys or models changed."""
        self._listeners.append(callback)

    def stale_reason(self) -> str:
        """Why ``fresh()`` is false, for ``/readyz``."""
        if self._up:
            return ""
        if self.loads == 0:
            return f"no routing table read yet: {self.last_error or 'connecting'}"
        return (
            f"database unreachable ({self.last_error}); serving the routing table and keys "
            f"read at position {self._snapshot.position}"
        )

    # -- lifecycle --------------------------------------------------------------------------

    def report_in_flight(self, counter: InFlightCounter) -> None:
        """Write ``counter()`` (requests open per replica) to the database periodically."""
        self._in_flight = counter

    def report_traffic(self, reader: TrafficReader) -> None:
        """Write ``reader()`` (per-replica figures over a window) with each in-flight
        report."""
        self._traffic = reader

    def report_queued(self, counter: QueuedCounter) -> None:
        """Write ``counter()`` (requests queued per model) with each in-flight report."""
        self._queued = counter

    def report_ejected(self, reader: EjectedReader) -> None:
        """Write ``reader()`` (the replicas this gateway keeps out of rotation, with their
        ejections in a row) with each in-flight report."""
        self._ejected = reader

    def report_soon(self) -> None:
        """Write the next report now rather than at its turn (at most every
        ``MIN_REPORT_GAP_S``): something the readers should see has just begun. Call it on
        the source's loop."""
        self._report_soon = True
        self._wake.set()

    async def start(self, *, wait_s: float = QUERY_TIMEOUT_S) -> None:
        """Connect and start following the database; returns once the first snapshot is
        read, or after ``wait_s`` without one (it keeps trying; ``fresh()`` tells)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"snapshot-{self.gateway_id}")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self.first_attempt.wait()

    async def close(self) -> None:
        """Stop following; this gateway's in-flight report is removed if the database
        answers."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        self._wake.set()
        await asyncio.wait({task}, timeout=CLOSE_WITHIN_S)
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_WITHIN_S)
        if not task.cancelled() and task.exception() is not None:
            log.error("routing_source_failed", error=str(task.exception()))

    # -- the loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        low, high = BACKOFF_S
        backoff = low
        while not self._stop.is_set():
            try:
                connection = await asyncpg.connect(
                    self._url,
                    timeout=self._timeout_s,
                    server_settings={"application_name": f"llmgw-gateway-{self.gateway_id}"},
                )
            except _CONNECTION_LOST as exc:
                self._lost(exc)
            else:
                try:
                    await self._follow(connection)
                    return  # stopping
                except _CONNECTION_LOST as exc:
                    self._lost(exc)
                except Exception as exc:  # a bug must not end the loop: retry as if lost
                    log.exception("routing_table_read_failed")
                    self._lost(exc)
                finally:
                    connection.terminate()
                if self._up_since_connect:
                    backoff = low
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await self._stop.wait()
            backoff = min(backoff * 2, high)

    async def _follow(self, db: asyncpg.Connection) -> None:
        self._up_since_connect = False
        db.add_termination_listener(self._on_termination)
        await db.add_listener(NOTIFY_CHANNEL, self._on_notify)
        await self._read(db)
        self._back()
        self._up_since_connect = True
        next_read = monotonic() + self._refresh_interval_s
        next_report = monotonic()
        last_report = float("-inf")
        while not self._stop.is_set():
            if db.is_closed():
                raise ConnectionResetError("the database closed the connection")
            due = next_read if self._in_flight is None else min(next_read, next_report)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(due - monotonic(), 0.0)):
                    await self._wake.wait()
            self._wake.clear()
            if self._stop.is_set() or db.is_closed():
                continue
            if self._report_soon:
                self._report_soon = False
                next_report = min(next_report, last_report + MIN_REPORT_GAP_S)
            if self._notified:
                await asyncio.sleep(self._debounce_s)  # one read for a burst of appends
                self._notified = False
                next_read = 0.0
            if monotonic() >= next_read:
                await self._read(db)
                next_read = monotonic() + self._refresh_interval_s
            if self._in_flight is not None and monotonic() >= next_report:
                self._note_lateness(monotonic() - next_report)
                await write_report(
                    db,
                    self.gateway_id,
                    self._in_flight(),
                    within_s=self._timeout_s,
                    traffic=None if self._traffic is None else self._traffic(),
                    queued=None if self._queued is None else self._queued(),
                    ejected=None if self._ejected is None else self._ejected(),
                    # The table the counts were made by: the listeners applied it in _read.
                    routing_position=self._snapshot.position if self.loads else None,
                )
                last_report = monotonic()
                next_report = last_report + self._report_interval_s
        with contextlib.suppress(*_CONNECTION_LOST):
            await delete_report(db, self.gateway_id, within_s=min(self._timeout_s, 1.0))

    def _note_lateness(self, late_s: float) -> None:
        """Say when a report goes out much later than due (once until they are on time
        again): readers stop counting this gateway's requests ``REPORT_MAX_AGE_S`` after its
        last report, and the autoscaler then holds its models from scaling down."""
        if late_s > REPORT_LATE_S and not self._late_logged:
            log.warning(
                "gateway_report_late",
                gateway_id=self.gateway_id,
                late_s=round(late_s, 2),
                reason="the snapshot read or the report before it took this long, or the "
                "gateway's event loop was busy",
            )
        self._late_logged = late_s > REPORT_LATE_S

    async def _read(self, db: asyncpg.Connection) -> None:
        snapshot = await read_snapshot(db, within_s=self._timeout_s)
        changed = self.loads == 0 or not _same_content(snapshot, self._snapshot)
        self._snapshot = snapshot
        self.loads += 1
        if not changed:
            return
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:  # one broken listener must not stop the others' updates
                log.exception("routing_listener_failed", listener=repr(listener))

    # -- events -----------------------------------------------------------------------------

    def _on_notify(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        with contextlib.suppress(ValueError):
            if int(payload) <= self._snapshot.position:
                return  # already read (our own periodic read got there first)
        self._notified = True
        self._wake.set()

    def _on_termination(self, _connection: Any) -> None:
        self._wake.set()

    def _lost(self, exc: BaseException) -> None:
        self.last_error = str(exc) or type(exc).__name__
        self._up = False
        self.first_attempt.set()
        if not self._loss_logged:
            self._loss_logged = True
            log.warning(
                "database_unreachable",
                gateway_id=self.gateway_id,
                error=self.last_error,
                serving=f"the routing table and keys at position {self._snapshot.position}"
                if self.loads
                else "nothing until it answers",
            )

    def _back(self) -> None:
        self._up = True
        self.last_error = None
        self.first_attempt.set()
        if self._loss_logged:
            self._loss_logged = False
            log.info(
                "database_reachable",
                gateway_id=self.gateway_id,
                position=self._snapshot.position,
            )
