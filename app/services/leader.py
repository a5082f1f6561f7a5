"""Leader election: one control plane leads at a time, and a deposed one cannot write.

Two mechanisms, each doing one job:

- **Liveness: a session-level advisory lock.** Every server keeps a dedicated connection
  (never a pooled one: the lock belongs to the session and must not be handed to other
  work) and tries ``pg_try_advisory_lock(LEADER_LOCK_KEY)`` on it every
  ``retry_interval_s``. PostgreSQL grants the lock to one session at a time and frees it
  when that session ends, so when a leader dies, or its connection does, a standby takes
  over within about a retry interval.
- **Safety: epoch fencing in the store.** On taking the lock, the new leader increments
  ``leadership.epoch`` in one statement (``llmgw_next_epoch``) and stamps every event it
  appends with that epoch (``Meta.epoch``). ``llmgw_append`` refuses an append whose epoch
  is older than the current one, checked under the append lock (migration 0002).

Why both: the lock alone cannot stop a deposed leader. A leader whose lock connection was
cut (a network partition, ``pg_terminate_backend``) can still hold pooled connections and
append through them before it notices the loss. The epoch closes that window: the new
leader bumps the epoch before its first append, and appends are serialized by the append
lock, so an old-epoch append either committed before that first append or reads the new
epoch and is refused with ``FencedError``. Nothing of epoch N can land after the first
event of epoch N+1. The lock only decides who *should* lead; the epoch makes sure the
log never listens to anyone else.

A session lasts as long as PostgreSQL sees its client, and a frozen leader (SIGSTOP, a
stalled virtual machine) or one cut off from the database by a partition is never seen to
go: the kernel still answers for a frozen process's sockets, and a partitioned peer is
noticed only by TCP keepalives, two hours by default. So the lock's session is a **lease**
too: it runs with ``idle_session_timeout`` set to ``lease_s`` (``DEFAULT_LEASE_S``), and the
leader proves it is alive by checking the session every ``check_interval_s``. A leader
that stops doing so for ``lease_s`` has its session ended by PostgreSQL itself, which
frees the lock for a standby; the old leader, if it ever runs again, finds its connection
closed (and its appends fenced). A leader that runs but cannot reach the database gives up
after ``check_interval_s`` + ``check_timeout_s`` (6 s), shorter than the lease, so it has
stopped its hub before a standby can be elected.

A candidate whose clock is far from the database's would win the lock and then append
nothing (``llmgw_append`` refuses events whose time is a minute off its clock), holding
off every standby with a good clock. So each try, and each check of a held lock, reads the
database's clock too (``app.clock_offset``): a candidate more than
``MAX_LEADER_CLOCK_OFFSET_S`` off does not ask for the lock (and says why, once a minute),
and a leader whose clock moves that far gives up leadership, as on losing the lock.

Losing the lock connection means losing leadership, even when the database is fine: this
side cannot tell a killed session from a slow network, and the session may already have
been ended and the lock granted elsewhere. ``lost()`` reports it; the caller stops leading
(and, in ``llmgw-server``, exits so a supervisor restarts it as a standby).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import asyncpg
import structlog

from app.clock_offset import MAX_LEADER_CLOCK_OFFSET_S, leader_clock_problem, read_clock
from app.domain.log_throttle import LogThrottle
from app.store.database import DATABASE_CLOCK, driver_url

LEADER_LOCK_KEY = 0x6C6C6D67_77000002
"""``"llmgw"`` + 2; the append lock is + 1 (``app.store.postgres.APPEND_LOCK_KEY``)."""

NEXT_EPOCH = "SELECT llmgw_next_epoch($1)"
"""One more than the last epoch, recorded with the holder (migration 0005): a function, so
that the runtime role, which may not write ``leadership`` itself, can only ever add one."""
CONNECT_TIMEOUT_S = 5.0
DEFAULT_LEASE_S = 10.0
LONGEST_LEASE_S = 3600.0
"""A frozen leader holds the agents and every append for as long as its lease: an hour is
already more than any failover should take."""
DEFAULT_RETRY_INTERVAL_S = 1.0
DEFAULT_CHECK_INTERVAL_S = 1.0
DEFAULT_CHECK_TIMEOUT_S = 5.0
CLOCK_WARNING_EVERY_S = 60.0
"""How often a candidate whose clock is too far off says so while it waits."""
CLOCK_OFF = "leader_clock_off"
"""The one key of the candidate's throttled clock warning."""


def lease_problem(
    lease_s: float,
    *,
    retry_interval_s: float = DEFAULT_RETRY_INTERVAL_S,
    check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
) -> str | None:
    """Why ``lease_s`` cannot be the leader lease, or None when it can. A leader that cannot
    reach its session gives up within one check interval and one check timeout: that must
    come before PostgreSQL ends the session and a standby takes over."""
    shortest = max(check_interval_s + check_timeout_s, retry_interval_s)
    if not shortest < lease_s <= LONGEST_LEASE_S:  # NaN too
        return (
            f"the leader lease ({lease_s:g}s) must be longer than the check interval and "
            f"timeout together ({check_interval_s + check_timeout_s:g}s) and the retry "
            f"interval ({retry_interval_s:g}s), and at most {LONGEST_LEASE_S:g}s"
        )
    return None


"""How long the lock's session may sit idle before PostgreSQL ends it: a leader checks it
every second, so only one frozen or cut off for this long loses it."""

log = structlog.get_logger(__name__)

_CONNECTION_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # A terminated backend's last message can leave the protocol busy for a moment; a query
    # then fails with this rather than with the termination itself.
    asyncpg.InternalClientError,
)


class LeaderElection:
    """``epoch = await election.acquire()`` waits until this process leads;
    ``reason = await election.lost()`` waits until it no longer does; ``close()`` resigns."""

    def __init__(
        self,
        database_url: str,
        holder_id: str,
        *,
        retry_interval_s: float = DEFAULT_RETRY_INTERVAL_S,
        check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
        check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
        lease_s: float = DEFAULT_LEASE_S,
        lock_key: int = LEADER_LOCK_KEY,
        wall_clock: Callable[[], float] = time.time,
        max_clock_offset_s: float = MAX_LEADER_CLOCK_OFFSET_S,
    ) -> None:
        problem = lease_problem(
            lease_s,
            retry_interval_s=retry_interval_s,
            check_interval_s=check_interval_s,
            check_timeout_s=check_timeout_s,
        )
        if problem is not None:
            raise ValueError(problem)
        self._url = driver_url(database_url)
        self.holder_id = holder_id
        self._retry_interval_s = retry_interval_s
        self._check_interval_s = check_interval_s
        self._check_timeout_s = check_timeout_s
        self.lease_s = lease_s
        self._lock_key = lock_key
        self._wall_clock = wall_clock
        self._max_clock_offset_s = max_clock_offset_s
        self._clock_warnings = LogThrottle(CLOCK_WARNING_EVERY_S, max_keys=1)
        """When ``leader_clock_off`` was last logged; forgotten once the clock is right, so
        that a clock that goes wrong again is said at once."""
        self._connection: asyncpg.Connection | None = None
        self._connection_closed = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        self._lost_reason = ""
        self.epoch: int | None = None
        """The epoch this process leads in; None before it is elected."""
        self.tries = 0
        """How many times this process asked for the lock (standbys keep asking)."""

    @property
    def backend_pid(self) -> int | None:
        """The PostgreSQL backend that holds (or asks for) the lock."""
        return None if self._connection is None else self._connection.get_server_pid()

    @property
    def leading(self) -> bool:
        return self.epoch is not None and not self._lost.is_set()

    async def acquire(self) -> int:
        """Ask for the lock until it is granted, then take the next epoch and return it.
        A database that cannot be reached is retried; this never gives up by itself."""
        if self.epoch is not None:
            raise RuntimeError("this election was already won; use a new one to lead again")
        while True:
            try:
                epoch = await self._try_once()
            except _CONNECTION_ERRORS as exc:
                log.warning("leader_lock_request_failed", error=str(exc), detail="asking again")
                await self._drop_connection()
                epoch = None
            if epoch is not None:
                self.epoch = epoch
                self._watch = asyncio.create_task(self._watch_lock(), name="leader-lock-watch")
                log.info("leader_elected", holder=self.holder_id, epoch=epoch)
                return epoch
            await asyncio.sleep(self._retry_interval_s)

    async def lost(self) -> str:
        """Wait until leadership is lost; returns why."""
        await self._lost.wait()
        return self._lost_reason

    async def close(self) -> None:
        """Resign: end the session that holds the lock, so a standby takes over at once."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        if self.epoch is not None and not self._lost.is_set():
            self._lost_reason = "resigned"
            self._lost.set()
            log.info("leadership_resigned", holder=self.holder_id, epoch=self.epoch)
        await self._drop_connection()

    async def _try_once(self) -> int | None:
        connection = await self._connect()
        self.tries += 1
        problem = await self._clock_problem(connection)
        if problem is not None:
            self._warn_of_clock(problem)
            return None
        self._clock_warnings.forget(CLOCK_OFF)
        granted = await connection.fetchval("SELECT pg_try_advisory_lock($1)", self._lock_key)
        if not granted:
            return None
        epoch: int = await connection.fetchval(NEXT_EPOCH, self.holder_id)
        return epoch

    async def _connect(self) -> asyncpg.Connection:
        if self._connection is not None and not self._connection.is_closed():
            return self._connection
        self._connection_closed = asyncio.Event()
        closed = self._connection_closed
        connection = await asyncpg.connect(
            self._url,
            timeout=CONNECT_TIMEOUT_S,
            server_settings={
                "application_name": f"llmgw-leader-{self.holder_id}"[:63],
                # The lease: PostgreSQL ends the session (and frees the lock) once this
                # side has not checked it for this long. A standby's session asks every
                # retry interval, so it is never idle for as long.
                "idle_session_timeout": str(round(self.lease_s * 1000)),
            },
        )
        connection.add_termination_listener(lambda _: closed.set())
        self._connection = connection
        return connection

    async def _watch_lock(self) -> None:
        try:
            reason = await self._until_lock_lost()
        except Exception as exc:
            # Whatever broke, this side can no longer vouch for the lock.
            log.exception("leader_lock_watch_failed")
            reason = f"watching the leader lock failed: {exc!r}"
        self._report_lost(reason)
        await self._drop_connection()

    async def _until_lock_lost(self) -> str:
        """The lock lives exactly as long as its session: watch the session; returns why
        it is gone."""
        connection = self._connection
        assert connection is not None, "watching starts once the lock is held"
        while True:
            # asyncio.timeout, not wait_for, which can swallow a cancellation on Python 3.11.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._check_interval_s):
                    await self._connection_closed.wait()
            if self._connection_closed.is_set() or connection.is_closed():
                return "the connection holding the leader lock was closed"
            try:
                async with asyncio.timeout(self._check_timeout_s):
                    problem = await self._clock_problem(connection)
            except _CONNECTION_ERRORS as exc:
                failure = str(exc) or type(exc).__name__
                return f"the connection holding the leader lock failed: {failure}"
            if problem is not None:
                return problem

    async def _clock_problem(self, connection: asyncpg.Connection) -> str | None:
        """Why this machine's clock is too far from the database's to lead, or None."""

        async def theirs() -> float:
            return float(await connection.fetchval(DATABASE_CLOCK))

        reading = await read_clock(theirs, self._wall_clock)
        return leader_clock_problem(reading, self._max_clock_offset_s)

    def _warn_of_clock(self, problem: str) -> None:
        if self._clock_warnings.admit(CLOCK_OFF, time.monotonic()) is None:
            return
        log.warning(
            "leader_clock_off", holder=self.holder_id, problem=problem, detail="not leading"
        )

    def _report_lost(self, reason: str) -> None:
        self._lost_reason = reason
        self._lost.set()
        log.warning("leadership_lost", holder=self.holder_id, epoch=self.epoch, reason=reason)

    async def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None or connection.is_closed():
            return
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await connection.close()
        except _CONNECTION_ERRORS:
            connection.terminate()
