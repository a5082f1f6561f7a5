"""The gateway's report to the control plane, on a connection of its own.

Every ``report_interval_s`` a ``GatewayReporter`` writes one row of ``gateway_reports``
(``app.store.gateway_reports``): the requests the router has in flight per replica and
holds queued per model (the demand the autoscaler reads), what it saw of each replica's
requests over its window (the admin API's traffic), the replicas it keeps out of its
rotation, and the position of the routing table it counted them by. It writes at once,
rather than at its turn, when ``report_soon()`` is called (the router does when it starts
holding requests for a model that starts from zero), but never more often than every
``MIN_REPORT_GAP_S``. On ``close`` it removes the row: a gateway that stops cleanly is
gone, not silent.

Each gateway process writes its report with a token of its own (``instance``: hostname,
pid and a random part) and never overwrites another live process's. Two processes started
with the same id (``--gateway-id``, or ``serve``'s ``--server-id``) would otherwise replace
each other's requests in flight twice a second, and the leader would read about half the
demand. The one that finds its id's row held by another live report (written by another
process within ``REPORT_MAX_AGE_S``, or after its own last write) writes under
``ID@INSTANCE`` from then on, so the leader sums both as two gateways. While both write,
each of them (the one under the id, which finds the other's ``ID@INSTANCE`` row, and the
one under its own key, which finds the id's row) logs ``gateway_id_shared`` (an error, at
most once a minute) and counts each such report in ``llmgw_gateway_id_shared_reports``, so
that whichever of their logs an operator reads says so. A restarted
gateway takes back its previous life's row at once when that life's connection to the
database is gone: each reporter's connection holds a session lock of its token
(``hold_writer_lock``), which PostgreSQL lets go when the process exits, is killed, or loses
the connection, wherever it ran and whatever its pid runs now. A live twin holds its lock,
so two live processes never take or retire each other's rows. While the previous life's
session lingers (its host vanished without closing the connection), the restarted gateway
takes the row back at once when that life ran on the same host and its process is gone
(``previous_life``: a gateway killed and started again by its supervisor), and otherwise
writes under a key of its own, logging nothing, since the previous life writes no more;
the previous life's rows (under the id or a key of its own) are retired by the first report
after its session ends (``gateway_reports_retired``), or else age as a crashed gateway's
do.

The connection is its own so that nothing else the gateway asks of the database (a
snapshot read waiting on a lock, a grant) can make a report late: a report more than
``REPORT_LATE_S`` late makes the leader take the gateway for silent, and hold every
autoscaled model from scaling down until it reports again. A late report is still logged
(``gateway_report_late``): the write itself, or a busy event loop, can make one late.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Callable
from datetime import datetime
from time import monotonic

import asyncpg
import structlog

from app.domain.log_throttle import LogThrottle
from app.gateway.reconnecting import CONNECTION_LOST, ConnectedTask, require_positive
from app.store.database import driver_url
from app.store.gateway_reports import (
    ReportWritten,
    TrafficReport,
    delete_report,
    hold_writer_lock,
    report_holder,
    write_report,
)

log = structlog.get_logger(__name__)

DEFAULT_REPORT_INTERVAL_S = 0.5
MIN_REPORT_GAP_S = 0.05
"""``report_soon()`` writes a report at most this soon after the last one, however often
it is called."""
REPORT_LATE_S = 2.0
"""A report this much later than due is logged (``gateway_report_late``)."""
QUERY_TIMEOUT_S = 5.0
SHARED_ID_LOG_EVERY_S = 60.0
"""``gateway_id_shared`` is logged at most this often while the id is shared."""
SHARED_ID = "gateway_id_shared"
"""The one key of the reporter's throttled line."""

MAX_GATEWAY_ID_CHARS = 200
"""The longest id a gateway reports under: a name an operator reads in logs and tables."""


def gateway_id_problem(gateway_id: str, flag: str, variable: str) -> str | None:
    """What is wrong with a gateway's reporting id given by ``flag`` or its environment
    ``variable``; None when it will do. A blank one names no gateway: an empty variable is
    more likely a value left unfilled than a wish for the default. ``@`` is the mark of a
    twin's row (``ID@INSTANCE``): an id holding one would read as another gateway's twin,
    and that gateway's rows as its own."""
    if not gateway_id.strip():
        return blank_id_problem(flag, variable)
    if len(gateway_id) > MAX_GATEWAY_ID_CHARS:  # first: the other problems repeat the id
        return f"{flag} is at most {MAX_GATEWAY_ID_CHARS} characters, not {len(gateway_id)}"
    if "@" in gateway_id:
        return f"{flag} must not contain '@' (it marks a twin's reports: ID@INSTANCE)"
    if not gateway_id.isprintable():
        return f"{flag} must be printable: {gateway_id!a}"
    return None


def blank_id_problem(flag: str, variable: str) -> str:
    """``--gateway-id (or LLMGW_GATEWAY_ID) is blank: ...``, for an id given empty or as
    spaces alone (the default, hostname and pid, is what leaving it unset gives)."""
    return f"{flag} (or {variable}) is blank: give a name, or leave it unset for the default"


InFlightCounter = Callable[[], dict[str, int]]
QueuedCounter = Callable[[], dict[str, int]]
TrafficReader = Callable[[], TrafficReport]
EjectedReader = Callable[[], dict[str, int]]
PositionReader = Callable[[], int | None]


class GatewayReporter:
    def __init__(
        self,
        database_url: str,
        *,
        gateway_id: str,
        in_flight: InFlightCounter,
        routing_position: PositionReader,
        queued: QueuedCounter | None = None,
        traffic: TrafficReader | None = None,
        ejected: EjectedReader | None = None,
        report_interval_s: float = DEFAULT_REPORT_INTERVAL_S,
        query_timeout_s: float = QUERY_TIMEOUT_S,
        on_shared_id: Callable[[], None] = lambda: None,
    ) -> None:
        """``routing_position``: the position of the routing table the counts were made by
        (None before the gateway has one). ``on_shared_id``: called for each report that
        finds another live process reporting under ``gateway_id``."""
        require_positive(("report interval", report_interval_s), ("query timeout", query_timeout_s))
        self.gateway_id = gateway_id
        self.instance = process_token(socket.gethostname(), os.getpid(), secrets.token_hex(4))
        _TOKENS_IN_THIS_PROCESS.add(self.instance)
        """This process's token in its report: no other process has it."""
        self.reports_as = gateway_id
        """The key this gateway's report is written under: ``gateway_id``, or
        ``gateway_id@instance`` once another live process's report held that row."""
        self._written_at: datetime | None = None
        """The time (database's clock) the last write under ``reports_as`` set, while known:
        a later time there is another process's write."""
        self._writing_since: datetime | None = None
        """When this process's first write under ``reports_as`` went in."""
        self._on_shared_id = on_shared_id
        self._shared_lines = LogThrottle(SHARED_ID_LOG_EVERY_S, max_keys=1)
        """When ``gateway_id_shared`` was last logged. Its count of lines left out goes
        unused: the metric counts every such report (``on_shared_id``)."""
        self._connection = ConnectedTask(
            driver_url(database_url),
            application_name=f"llmgw-report-{gateway_id}",
            timeout_s=query_timeout_s,
        )
        self._in_flight = in_flight
        self._routing_position = routing_position
        self._queued = queued
        self._traffic = traffic
        self._ejected = ejected
        self._interval_s = report_interval_s
        self._timeout_s = query_timeout_s
        self._soon = False
        self._late_logged = False
        self.reports = 0
        """Reports written so far (tests wait on it)."""
        self.last_error: str | None = None
        """Why reports cannot be written, while they cannot."""

    def report_soon(self) -> None:
        """Write the next report now rather than at its turn (at most every
        ``MIN_REPORT_GAP_S``): something the readers should see has just begun. Call it on
        the reporter's loop."""
        self._soon = True
        self._connection.wake.set()

    async def start(self) -> None:
        """Start reporting; the first report goes out as soon as the database answers."""
        self._connection.start(
            self._report,
            lost=self._lost,
            failed=lambda: log.exception("gateway_report_failed"),
        )

    async def close(self) -> None:
        """Stop reporting; this gateway's report is removed if the database answers."""
        error = await self._connection.close()
        if error is not None:
            log.error("gateway_report_stopped", error=str(error))

    async def _report(self, db: asyncpg.Connection) -> None:
        db.add_termination_listener(lambda _connection: self._connection.wake.set())
        next_report = monotonic()
        last_report = float("-inf")
        holding = False
        while not self._connection.stop.is_set():
            if not await self._connection.wait_turn_on(db, next_report):
                continue
            if self._soon:
                self._soon = False
                next_report = min(next_report, last_report + MIN_REPORT_GAP_S)
            if monotonic() < next_report:
                continue
            started = monotonic()
            self._note_lateness(started - next_report)
            if not holding:  # this connection's previous one may hold it for a moment still
                holding = await hold_writer_lock(db, self.instance, within_s=self._timeout_s)
            await self._write(db)
            self.reports += 1
            self._back()
            # From when this one began: a write that took long makes the next one late.
            last_report = started
            next_report = started + self._interval_s
        with contextlib.suppress(*CONNECTION_LOST):
            await delete_report(
                db, self.reports_as, instance=self.instance, within_s=min(self._timeout_s, 1.0)
            )

    async def _write(self, db: asyncpg.Connection) -> None:
        """One report, under this gateway's key; under a key of its own from now on when
        another live process's report holds that one."""
        written = await self._write_once(db)
        if written.at is None and self.reports_as == self.gateway_id:
            written = await self._take_back(db) or written
        if written.at is None:
            held = self.reports_as
            self.reports_as = f"{self.gateway_id}@{self.instance}"
            self._written_at = self._writing_since = None
            log.info(
                "gateway_reports_as",
                gateway_id=self.gateway_id,
                reports_as=self.reports_as,
                reason=f"another live report holds {held!r}: this gateway's previous life, "
                "or another process started with the same id",
            )
            written = await self._write_once(db)
            if written.at is None:  # another process holds this one too: a token reused
                raise RuntimeError(f"the report under {self.reports_as!r} is not this one's")
        self._written_at = written.at
        self._writing_since = self._writing_since or written.at
        if written.retired:
            log.info(
                "gateway_reports_retired",
                gateway_id=self.gateway_id,
                retired=list(written.retired),
                reason="their writers' connections are gone: previous lives of this gateway",
            )
        if written.shared:
            self._shared_id()

    async def _take_back(self, db: asyncpg.Connection) -> ReportWritten | None:
        """Write over the row under this gateway's id if a previous life of it on this host
        holds it (a gateway killed and started again at once): that process is gone, and
        its row would otherwise count as a silent gateway for ``SILENT_HOLD_S``, holding
        every stop of a drained or scaled-down replica meanwhile. None when the holder is
        not known to be gone."""
        holder = await report_holder(db, self.gateway_id, within_s=self._timeout_s)
        if holder is None or not previous_life(holder, self.instance, pid_alive):
            return None
        written = await self._write_once(db, taking_over=holder)
        if written.at is not None:
            log.info("gateway_report_taken_back", gateway_id=self.gateway_id, previous=holder)
        return written

    async def _write_once(
        self, db: asyncpg.Connection, *, taking_over: str | None = None
    ) -> ReportWritten:
        try:
            return await write_report(
                db,
                self.reports_as,
                self._in_flight(),
                within_s=self._timeout_s,
                instance=self.instance,
                written_at=self._written_at,
                named=self.gateway_id,
                named_since=self._writing_since,
                traffic=None if self._traffic is None else self._traffic(),
                queued=None if self._queued is None else self._queued(),
                ejected=None if self._ejected is None else self._ejected(),
                routing_position=self._routing_position(),
                taking_over=taking_over,
            )
        except BaseException:
            # Whether it went in is not known: the next write takes this process's row
            # back by its token alone.
            self._written_at = None
            raise

    def _shared_id(self) -> None:
        """Another live process reports under this gateway's id: both reports are counted,
        but the id names two processes (in logs, metrics, the database's sessions)."""
        self._on_shared_id()
        if self._shared_lines.admit(SHARED_ID, monotonic()) is None:
            return
        log.error(
            "gateway_id_shared",
            gateway_id=self.gateway_id,
            reports_as=self.reports_as,
            reason="another gateway process is reporting under this id; each report is "
            "kept apart and the control plane counts both, but give each process its own "
            "--gateway-id (serve: --server-id), or leave it to the default",
        )

    def _note_lateness(self, late_s: float) -> None:
        """Say when a report goes out much later than due (once until they are on time
        again): readers stop counting this gateway's requests ``REPORT_MAX_AGE_S`` after its
        last report, and the autoscaler then holds its models from scaling down."""
        if late_s > REPORT_LATE_S and not self._late_logged:
            log.warning(
                "gateway_report_late",
                gateway_id=self.gateway_id,
                late_s=round(late_s, 2),
                reason="the report before it took this long to write, or the gateway's "
                "event loop was busy",
            )
        self._late_logged = late_s > REPORT_LATE_S

    def _lost(self, exc: BaseException) -> None:
        first = self.last_error is None
        self.last_error = str(exc) or type(exc).__name__
        if first:
            log.warning(
                "gateway_report_unwritten",
                gateway_id=self.gateway_id,
                error=self.last_error,
                effect="the control plane takes this gateway for silent, then gone",
            )

    def _back(self) -> None:
        if self.last_error is not None:
            self.last_error = None
            log.info("gateway_report_written", gateway_id=self.gateway_id)


_TOKENS_IN_THIS_PROCESS: set[str] = set()
"""The tokens of the reporters this process started (a test runs several)."""


def process_token(hostname: str, pid: int, nonce: str) -> str:
    """A gateway process's ``instance``: its host, its pid and a random part."""
    return f"{hostname}-{pid}-{nonce}"


def previous_life(holder: str, instance: str, alive: Callable[[int], bool]) -> bool:
    """Whether the process whose token is ``holder`` is an earlier one on this process's
    host (``instance``'s) that is gone: its pid runs nothing, or runs this process and the
    token is none of this process's reporters' (a pid is not two live processes). A holder
    on another host, or whose pid still runs something else, may be a live twin: it is not
    taken over."""
    ours, theirs = _host_and_pid(instance), _host_and_pid(holder)
    if ours is None or theirs is None or holder in _TOKENS_IN_THIS_PROCESS or ours[0] != theirs[0]:
        return False
    return theirs[1] == ours[1] or not alive(theirs[1])


def _host_and_pid(token: str) -> tuple[str, int] | None:
    """The host and pid a token names (``process_token``); None for one that names none
    (a pid of 0 would name a process group)."""
    head, _, _nonce = token.rpartition("-")
    host, _, pid = head.rpartition("-")
    if not host or not (pid.isascii() and pid.isdigit()) or len(pid) > 10 or int(pid) == 0:
        return None
    return host, int(pid)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (one of another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True
