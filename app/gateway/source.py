"""The gateway's snapshot from PostgreSQL, kept current.

``PostgresSnapshotSource`` holds one connection to the database. On it, it

- reads the snapshot (``app.gateway.snapshot``: declared models and their canaries, the
  ``routing_table`` view, live API keys and the projection's position) in one statement,
  so it sees one consistent state: every route on its first read on a connection and once
  every ``whole_read_interval_s``, and otherwise only the routes changed since the
  position it holds (``app.gateway.held_routes``), so that a read costs the database what
  changed, not the size of the fleet;
- LISTENs on the log's channel: an append wakes it, and after ``debounce_s`` (one read for
  a burst of appends; longer after a read that was long to take in, ``SNAPSHOT_SHARE``) it
  reads again, so a revoked key is refused within a second (two at most);
- reads again every ``refresh_interval_s`` anyway, in case a notification was lost.

What the gateway reports to the control plane goes on a connection of its own
(``app.gateway.reporter``), so that a read held up here never makes a report late.

When the database goes away the last snapshot keeps serving and ``fresh()`` turns false
(``/readyz`` says so); the loss is logged once, and so is the return. It reconnects with
backoff and reads the snapshot again at once when the database is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from time import monotonic
from typing import Any

import asyncpg
import msgspec
import structlog

from app.gateway.held_routes import HeldRoutes
from app.gateway.metrics import RoutingReadCounts
from app.gateway.reconnecting import ConnectedTask, require_positive
from app.gateway.snapshot import read_dated_rows, routing_of
from app.gateway.table import GatewaySnapshot, SnapshotListener
from app.store.database import driver_url
from app.store.postgres import NOTIFY_CHANNEL, REBUILT

log = structlog.get_logger(__name__)

DEFAULT_REFRESH_INTERVAL_S = 5.0
DEFAULT_DEBOUNCE_S = 0.05
DEFAULT_WHOLE_READ_INTERVAL_S = 30.0
"""How often a gateway reads every route rather than what changed: a bound on how long a
route changed without an event goes unseen (``projections rebuild``, which rewrites rows so,
says so on the channel, ``REBUILT``, and is read at once). At 20,000 replicas that is a
tenth of a second of the database's time every 30 s."""
SNAPSHOT_SHARE = 0.1
"""The most of the gateway's event loop that taking in new snapshots may take under steady
change: building one and handing it to the router and the egress check is work on the
loop, in the models a read changed (about a millisecond for one change at 20,000 routes,
about 14 ms for a read of every route that finds them as held) but in every route of a
model of thousands of replicas changed, or of a gateway's first read (about 70 ms at
20,000), so after a read that took ``t`` of it the next waits
``t * (1 / SNAPSHOT_SHARE - 1)`` (at least ``debounce_s``, at most ``MAX_PACE_S``)."""
MAX_PACE_S = 1.0
"""The longest a change waits for the share above: past about 110 ms a snapshot (a gateway's
first read at 20,000 routes, or changes to models of thousands of replicas each), freshness
comes first, and a change reaches the router within about a second and a snapshot's time."""
QUERY_TIMEOUT_S = 5.0
"""A statement that takes longer is taken for a dead connection (a network that drops
packets sends no reset)."""


def default_gateway_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _same_content(a: GatewaySnapshot, b: GatewaySnapshot) -> bool:
    """Whether two reads found the same table: every field but where and when each was
    read, so that a field added to the snapshot is never left out of the comparison (a
    routing policy or APIs changed alone must reach the router and the proxy)."""
    return msgspec.structs.replace(a, position=b.position, loaded_at=b.loaded_at) == b


class PostgresSnapshotSource:
    def __init__(
        self,
        database_url: str,
        *,
        gateway_id: str | None = None,
        refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S,
        debounce_s: float = DEFAULT_DEBOUNCE_S,
        query_timeout_s: float = QUERY_TIMEOUT_S,
        whole_read_interval_s: float = DEFAULT_WHOLE_READ_INTERVAL_S,
        snapshot_share: float = SNAPSHOT_SHARE,
    ) -> None:
        require_positive(
            ("refresh interval", refresh_interval_s),
            ("query timeout", query_timeout_s),
            ("whole read interval", whole_read_interval_s),
            ("snapshot share", snapshot_share),
        )
        if snapshot_share > 1:
            raise ValueError(f"the snapshot share must be at most 1, not {snapshot_share}")
        self.gateway_id = gateway_id or default_gateway_id()
        self._connection = ConnectedTask(
            driver_url(database_url),
            application_name=f"llmgw-gateway-{self.gateway_id}",
            timeout_s=query_timeout_s,
        )
        self._refresh_interval_s = refresh_interval_s
        self._debounce_s = max(debounce_s, 0.0)
        self._timeout_s = query_timeout_s
        self._snapshot = GatewaySnapshot()
        self._whole_read_interval_s = whole_read_interval_s
        self._pace = 1 / snapshot_share - 1
        self._held: HeldRoutes | None = None
        """The routes the snapshot was read with; ``None`` before the first read."""
        self._whole_read_due = 0.0
        """Until when reads may read only what changed: 0 asks the next read for every route
        (on a new connection, after a rebuild)."""
        self._next_read_from = 0.0
        """When a read a notification asks for may start (``SNAPSHOT_SHARE``)."""
        self._listeners: list[SnapshotListener] = []
        self._up = False
        self._up_since_connect = False
        self._loss_logged = False
        self._notified = False
        self.first_attempt = asyncio.Event()
        """Set once the first connection and read succeeded or failed."""
        self.loads = 0
        """Snapshots read so far (tests wait on it)."""
        self.whole_reads = 0
        """Of them, those that read every route."""
        self.taking_s = 0.0
        """Seconds of the event loop spent taking in what reads found: building each
        snapshot and handing it to the listeners (``SNAPSHOT_SHARE``)."""
        self.last_error: str | None = None

    # -- the SnapshotSource protocol ------------------------------------------------------

    def current(self) -> GatewaySnapshot:
        return self._snapshot

    def fresh(self) -> bool:
        """True while the database answers; false on the last snapshot it gave, or before
        the first one."""
        return self._up

    def subscribe(self, callback: SnapshotListener) -> None:
        """Call ``callback`` with every snapshot whose content changed (anything but its
        position and the time it was read)."""
        self._listeners.append(callback)

    def read_counts(self) -> RoutingReadCounts:
        """The reads so far, for ``/metrics``."""
        return RoutingReadCounts(self.loads, self.whole_reads, self.taking_s)

    def routing_position(self) -> int | None:
        """The position of the routing table the gateway routes by; None before the first
        read."""
        return self._snapshot.position if self.loads else None

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

    async def start(self, *, wait_s: float = QUERY_TIMEOUT_S) -> None:
        """Connect and start following the database; returns once the first snapshot is
        read, or after ``wait_s`` without one (it keeps trying; ``fresh()`` tells)."""
        self._connection.start(
            self._follow,
            lost=self._lost,
            failed=lambda: log.exception("routing_table_read_failed"),
            # A database that keeps refusing the first read (a schema not migrated yet)
            # is asked again with backoff; one that went away after serving, at once.
            settled=lambda: self._up_since_connect,
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self.first_attempt.wait()

    async def close(self) -> None:
        """Stop following."""
        error = await self._connection.close()
        if error is not None:
            log.error("routing_source_failed", error=str(error))

    # -- the loop ---------------------------------------------------------------------------

    async def _follow(self, db: asyncpg.Connection) -> None:
        self._up_since_connect = False
        self._whole_read_due = 0.0  # what changed while it was away is read whole
        db.add_termination_listener(self._on_termination)
        # Bounded like every read: a connection cut off once LISTEN was sent (a partition)
        # never answers it, and the loop below, with its reads, would never start.
        async with asyncio.timeout(self._timeout_s):
            await db.add_listener(NOTIFY_CHANNEL, self._on_notify)
        await self._read(db)
        self._back()
        self._up_since_connect = True
        next_read = monotonic() + self._refresh_interval_s
        while not self._connection.stop.is_set():
            if not await self._connection.wait_turn_on(db, next_read):
                continue
            if self._notified:
                # One read for a burst of appends, and a bounded share of the loop for them.
                await asyncio.sleep(max(self._debounce_s, self._next_read_from - monotonic()))
                self._notified = False
                next_read = 0.0
            if monotonic() >= next_read:
                await self._read(db)
                next_read = monotonic() + self._refresh_interval_s

    async def _read(self, db: asyncpg.Connection) -> None:
        held = self._held
        # A read of every route is still taken in against the routes held: only the models
        # whose rows differ are built again (``app.gateway.held_routes``).
        since = held.position if held is not None and monotonic() < self._whole_read_due else None
        dated = await read_dated_rows(db, within_s=self._timeout_s, since=since)
        started = monotonic()
        try:
            self._take(*routing_of(dated, held))
        finally:
            done = monotonic()
            self.taking_s += done - started
            self._next_read_from = done + min((done - started) * self._pace, MAX_PACE_S)
        if dated.rows.changed is None:  # every route read: asked for, or too far behind
            self.whole_reads += 1
            self._whole_read_due = done + self._whole_read_interval_s

    def _take(self, snapshot: GatewaySnapshot, held: HeldRoutes) -> None:
        changed = self.loads == 0 or not _same_content(snapshot, self._snapshot)
        self._snapshot = snapshot
        self._held = held
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
        if payload == REBUILT:  # rows rewritten without an event: no change names them
            self._whole_read_due = 0.0
        with contextlib.suppress(ValueError):
            if int(payload) <= self._snapshot.position:
                return  # already read (our own periodic read got there first)
        self._notified = True
        self._connection.wake.set()

    def _on_termination(self, _connection: Any) -> None:
        self._connection.wake.set()

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
