"""Connecting to PostgreSQL: one place that builds the engine and translates driver errors."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import cast

import asyncpg
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, StatementError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.store.database_url import parse_database_url
from app.store.errors import PrivilegeRefused, RoleRefused, StoreError, StoreUnavailable


def sqlalchemy_url(url: str) -> str:
    """Accept ``postgresql://`` (what operators paste, with one host or libpq's list of
    several) as well as the driver-qualified form; raises ``InvalidDatabaseUrl``."""
    return parse_database_url(url).sqlalchemy()


def driver_url(url: str) -> str:
    """The plain ``postgresql://`` URL asyncpg itself takes (the leader lock, LISTEN
    connections), several hosts in libpq's form; raises ``InvalidDatabaseUrl``."""
    return parse_database_url(url).libpq()


def create_engine(
    url: str,
    *,
    pool_size: int = 10,
    idle_in_transaction_timeout_s: float | None = None,
    answer_timeout_s: float | None = None,
    lock_timeout_s: float | None = None,
) -> AsyncEngine:
    """A pool of connections to ``url``. With ``idle_in_transaction_timeout_s``, PostgreSQL
    ends a session whose transaction waits that long for its client's next statement. With
    ``answer_timeout_s``, a statement that gets no answer that long raises ``TimeoutError``
    (``StoreUnavailable`` once translated) and its connection is dropped: without it, a
    connection cut off without a reset (a partition, a frozen database host) waits for the
    kernel to give up on it, a quarter of an hour. With ``lock_timeout_s``, PostgreSQL
    cancels a statement that waits that long for a lock another session holds (SQLSTATE
    ``55P03``, ``LOCK_NOT_AVAILABLE``); shorter than ``answer_timeout_s``, it says that
    a lock was the wait where the client would only see no answer."""
    server_settings: dict[str, str] = {}
    if idle_in_transaction_timeout_s is not None:
        server_settings["idle_in_transaction_session_timeout"] = _milliseconds(
            idle_in_transaction_timeout_s
        )
    if lock_timeout_s is not None:
        server_settings["lock_timeout"] = _milliseconds(lock_timeout_s)
    connect_args: dict[str, object] = {"server_settings": server_settings}
    if answer_timeout_s is not None:
        connect_args["command_timeout"] = answer_timeout_s
        connect_args["timeout"] = answer_timeout_s
    return create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        # No pre-ping: it costs two round trips per checkout, more than an append itself.
        # A connection that broke is invalidated where the error surfaces (connection()).
        pool_pre_ping=False,
        pool_recycle=1800,
        connect_args=connect_args,
    )


LOCK_SHARE = 0.8
"""The share of a ``waiting_engine``'s answer timeout PostgreSQL lets a statement wait for
a lock: it gives up first, and says that the wait was for a lock (SQLSTATE ``55P03``)."""


def lock_timeout_s(answer_timeout_s: float) -> float:
    return answer_timeout_s * LOCK_SHARE


def waiting_engine(url: str, answer_timeout_s: float) -> AsyncEngine:
    """One connection to ``url`` for a command that runs its statements one after another
    (``migrate``, ``projections rebuild``, ``log verify``): each statement waits at most
    ``answer_timeout_s`` for an answer, and at most ``lock_timeout_s`` of it for a lock."""
    return create_engine(
        url,
        pool_size=1,
        answer_timeout_s=answer_timeout_s,
        lock_timeout_s=lock_timeout_s(answer_timeout_s),
    )


def _milliseconds(seconds: float) -> str:
    """A PostgreSQL timeout setting: whole milliseconds, at least 1 (0 would turn it off)."""
    return str(max(1, round(seconds * 1000)))


async def driver_connection(conn: AsyncConnection) -> asyncpg.Connection:
    """The asyncpg connection under ``conn``, inside the same transaction.

    The store runs its statements on it directly (prepared by asyncpg, no SQLAlchemy
    statement layer on the hot path); docs/performance.md has what an append costs.
    """
    raw = await conn.get_raw_connection()
    return cast(asyncpg.Connection, raw.driver_connection)


_BROKEN_CONNECTION = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
)
"""What leaves a connection unusable. ``InternalClientError``: the driver's protocol is in a
state it cannot go on from, as when the server ended the session (a transaction left idle
past ``idle_in_transaction_session_timeout``) and its notice raced the next statement.
``OSError`` includes ``TimeoutError``: a statement got no answer within the pool's
``answer_timeout_s``; the connection may be cut off, and what it was doing is unknown."""


def broke_connection(exc: BaseException) -> bool:
    """Whether ``exc`` left its connection unusable (and what it was doing unanswered)."""
    return isinstance(exc, _BROKEN_CONNECTION)


@asynccontextmanager
async def connection(engine: AsyncEngine) -> AsyncIterator[asyncpg.Connection]:
    """A pooled asyncpg connection, with errors translated. A connection that broke (the
    database restarted, say, or failed over to its standby) is invalidated so the pool
    never hands it out again, and so are the others the pool holds: they were opened to
    the same server and are broken too, and each would otherwise cost one failed
    operation before the pool opened a new one (to the new primary)."""
    async with translated_errors(), engine.connect() as conn:
        try:
            yield await driver_connection(conn)
        except (*_BROKEN_CONNECTION, StoreUnavailable):
            # StoreUnavailable: a broken connection the store has already told apart (an
            # append whose outcome is unknown).
            await conn.invalidate()
            await engine.dispose(close=False)
            raise


@asynccontextmanager
async def dropped_when_broken(conn: AsyncConnection) -> AsyncIterator[None]:
    """Work on ``conn`` (from ``engine.connect()``) whose connection is invalidated when an
    error broke it: closing it then sends no ``ROLLBACK``, which would wait out the answer
    timeout again on a connection cut off, and on one reset would raise its own error
    (``cannot call Transaction.rollback(): the underlying connection is closed``) in place
    of the one that says what broke."""
    try:
        yield
    except (*_BROKEN_CONNECTION, StoreUnavailable):
        await conn.invalidate()
        raise


@asynccontextmanager
async def translated_errors() -> AsyncIterator[None]:
    """Driver and connection errors become ``StoreError``s, with the cause kept."""
    with translated_blocking_errors():
        yield


@contextmanager
def translated_blocking_errors() -> Iterator[None]:
    """``translated_errors`` around blocking work: Alembic's migrations, which connect
    through SQLAlchemy's synchronous face."""
    try:
        yield
    except Exception as exc:
        error = store_error(exc)
        if error is None:
            raise
        raise error from exc


CONNECTION_ENDED = (
    "the connection to the database was ended during the operation (its session was ended "
    "by an administrator or a timeout, or the database restarted or failed over)"
)
"""What a connection the driver found in the middle of an operation when it ended is
called: its own words for that (a protocol state it cannot switch to) say nothing to an
operator."""


def _connection_ended_midway(exc: BaseException) -> bool:
    """Whether ``exc`` is the driver's internal error, raised as it is or wrapped by
    SQLAlchemy (as the error's ``orig`` or that one's cause), which it raises when the
    connection ended while an operation was under way on it."""
    orig = getattr(exc, "orig", None) if isinstance(exc, StatementError) else None
    cause = orig.__cause__ if orig is not None else None
    return any(isinstance(error, asyncpg.InternalClientError) for error in (exc, orig, cause))


def store_error(exc: Exception) -> StoreError | None:
    """The ``StoreError`` a driver or connection error is; None for any other error (a
    ``StoreError`` too: it is raised as it is)."""
    if _connection_ended_midway(exc):
        return StoreUnavailable(CONNECTION_ENDED)
    match exc:
        case StoreError():
            return None
        case TimeoutError():
            return StoreUnavailable(
                "the database did not answer in time (the connection is cut off, or the "
                "database is stalled)"
            )
        case OSError() | asyncpg.exceptions.PostgresConnectionError() | asyncpg.InterfaceError():
            return StoreUnavailable(f"database unreachable: {exc}")
        case OperationalError() | InterfaceError():
            return StoreUnavailable(f"database unreachable: {exc.orig or exc}")
        case asyncpg.exceptions.CannotConnectNowError():
            return StoreUnavailable(f"database is starting or shutting down: {exc}")
        case asyncpg.exceptions.OperatorInterventionError():
            return StoreUnavailable(f"database shut down: {exc}")
        case DBAPIError(connection_invalidated=True):
            return StoreUnavailable(f"database connection lost: {exc.orig}")
        case DBAPIError():
            # The dialect raises asyncpg's error as its own, from the original: a database
            # refusing new connections while it starts or stops is unavailable for now.
            driver = exc.orig.__cause__ if exc.orig is not None else None
            unavailable = store_error(driver) if isinstance(driver, Exception) else None
            if isinstance(unavailable, StoreUnavailable):
                return unavailable
            if isinstance(driver, asyncpg.PostgresError):
                return answer_error(driver, f"database error: {exc.orig}")
            return StoreError(f"database error: {exc.orig}")
    return None


ROLE_REFUSALS = (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InsufficientPrivilegeError)
"""What PostgreSQL answers a role it will not let in (no such role, a password or
``pg_hba.conf`` refusing it) or let do the work (no privilege)."""
_MISSING_ROLE = re.compile(r'role "(?P<name>.*)" does not exist')
"""PostgreSQL's words for a role it does not know (28000, which ``pg_hba.conf`` refusals
share): a server set to answer in another language is told as any other refusal."""


def answer_error(exc: asyncpg.PostgresError, message: str | None = None) -> StoreError:
    """The ``StoreError`` PostgreSQL's answer ``exc`` is, said as ``message`` (its own
    words when None): ``RoleRefused`` for a role it refused, naming the role when it does
    not exist, and ``PrivilegeRefused`` for one it let in without a privilege the work
    needs."""
    said = str(exc) if message is None else message
    if not isinstance(exc, ROLE_REFUSALS):
        return StoreError(said)
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return PrivilegeRefused(said)
    missing = _MISSING_ROLE.fullmatch(str(exc))
    return RoleRefused(said, missing_role=missing["name"] if missing else None)


async def ping(engine: AsyncEngine) -> None:
    async with translated_errors(), engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


async def database_clock(engine: AsyncEngine) -> float:
    """The database's clock now, in seconds since the epoch."""
    async with translated_errors(), engine.connect() as conn:
        now = (await conn.execute(text(DATABASE_CLOCK))).scalar_one()
    return float(now)


DATABASE_CLOCK = "SELECT extract(epoch FROM clock_timestamp())::float8"
"""The database's clock, read as the statement runs (not as its transaction began)."""
