"""What every ``llmgw-server`` command shares: the database URL flag, reading the engine
networks flag, failing in one line, the refusal to serve as a database role that could
rewrite the event log, and the refusal to serve on a schema of another release."""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated, NoReturn

import asyncpg
import structlog
from cyclopts import Parameter
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.egress import EngineNetworks
from app.store.database_url import InvalidDatabaseUrl, parse_database_url
from app.store.errors import StoreUnavailable
from app.store.grants import DEFAULT_RUNTIME_ROLE
from app.store.privileges import CONNECT_TIMEOUT_S, may_append, privileged_role
from app.store.schema import schema_refusal, schema_revision
from app.usage_errors import print_command_error

log = structlog.get_logger(__name__)

DatabaseUrl = Annotated[
    str,
    Parameter(
        env_var="LLMGW_DATABASE_URL",
        help="PostgreSQL URL, e.g. postgresql://llmgw@db:5432/llmgw; several hosts find "
        "the primary after a failover: postgresql://llmgw@db-a:5432,db-b:5432/llmgw"
        "?target_session_attrs=read-write. A password given in this flag is visible to "
        "other local users in the process list: give the URL in $LLMGW_DATABASE_URL, or "
        "the password in ~/.pgpass or $PGPASSWORD.",
    ),
]


def database_url_problem(url: str) -> str | None:
    """What is wrong with ``--database-url``, in one line; None when it parses."""
    try:
        parse_database_url(url)
    except InvalidDatabaseUrl as exc:
        return f"--database-url: {exc}"
    return None


AllowPrivilegedRole = Annotated[
    bool,
    Parameter(
        env_var="LLMGW_ALLOW_PRIVILEGED_ROLE",
        help="start even when the database role could rewrite the event log (a superuser, "
        "the owner of its tables); a warning is logged. Connect as the runtime role instead",
    ),
]


def engine_networks_of(text: str) -> EngineNetworks | None:
    """The ``--engine-networks`` value, or None for the default when it is not given.
    Raises ``InvalidEngineNetworks`` for a bad list: its message says what is wrong with
    it, and each command puts the flag's name before it."""
    if not text.strip():
        return None
    return EngineNetworks.parse(text)


# Each command as typed: the start of every error line it ends with, as of its usage
# errors (``llmgw-server log verify: --anchor: ...``).
SERVE = "llmgw-server serve"
GATEWAY = "llmgw-server gateway"
MIGRATE = "llmgw-server migrate"
REBUILD = "llmgw-server projections rebuild"
LOG_VERIFY = "llmgw-server log verify"
LOG_HEAD = "llmgw-server log head"


EXIT_FAILED = 1
"""The command could not do its work (a database it cannot reach or write)."""
EXIT_USAGE = 2
"""A flag's value is wrong, as for any usage error the command line itself refuses."""


def fail(command: str, message: str) -> NoReturn:
    """End ``command`` (``llmgw-server migrate``) with exit code 1, saying why in one line:
    ``llmgw-server migrate: cannot migrate: ...``."""
    print_command_error(command, message)
    sys.exit(EXIT_FAILED)


def refuse_usage(command: str, message: str) -> NoReturn:
    """End ``command`` with exit code 2 for a flag's value it cannot run with, in one line
    as cyclopts' usage errors are: ``llmgw-server gateway: --engine-networks: ...``."""
    print_command_error(command, message)
    sys.exit(EXIT_USAGE)


async def warn_if_gateway_appends(database_url: str) -> None:
    """Log a warning when a standalone gateway's role may append (the runtime role): it
    never appends, and with that role whoever takes its machine could. Silent when the
    database cannot be asked: the gateway starts either way."""
    try:
        appends = await may_append(database_url)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return
    if appends:
        log.warning(
            "gateway_role_may_append",
            detail="this gateway's database role may append events and write projection "
            "rows, which a gateway never does; connect as the gateway role instead "
            "(`llmgw-server migrate --gateway-role llmgw_gateway`, docs/security.md)",
        )


CONNECTION_REFUSED = (
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidCatalogNameError,
    asyncpg.InsufficientPrivilegeError,
)
"""What PostgreSQL answers a connection whose user, password or database is wrong, or whose
role may not connect to that database."""


async def database_role_allowed(database_url: str, *, allow_privileged: bool, command: str) -> bool:
    """False, after saying why on stderr as ``command`` (``llmgw-server serve``), when the
    database role could rewrite the event log and that was not allowed explicitly, or when
    the database refused the connection for its user, password or database name, which
    asking again does not change. Raises ``StoreUnavailable`` when the database cannot be
    asked (it is away, starting or silent)."""
    try:
        role, reason = await privileged_role(database_url)
    except CONNECTION_REFUSED as exc:
        print_command_error(
            command,
            "the database refused the connection of --database-url (LLMGW_DATABASE_URL): "
            f"{exc}; check its user, password and database name",
        )
        return False
    except TimeoutError as exc:
        # Its message is empty: a database that took the connection and never answered.
        raise StoreUnavailable(
            f"database unreachable: no answer within {CONNECT_TIMEOUT_S:g} s from "
            "--database-url's host and port (LLMGW_DATABASE_URL); is PostgreSQL listening there?"
        ) from exc
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise StoreUnavailable(f"database unreachable: {exc}") from exc
    if reason is None:
        return True
    if allow_privileged:
        log.warning(
            "database_role_privileged",
            detail="serving with a privileged database role: it could rewrite the event log",
            role=role,
            reason=reason,
        )
        return True
    print_command_error(
        command,
        f'the database role "{role}" {reason}, so it could rewrite the event log; '
        f"connect as the runtime role instead (`llmgw-server migrate --runtime-role "
        f"{DEFAULT_RUNTIME_ROLE}` sets it up, docs/security.md), or pass "
        "--allow-privileged-role (LLMGW_ALLOW_PRIVILEGED_ROLE=1) to serve anyway",
    )
    return False


async def schema_allowed(engine: AsyncEngine, *, command: str, newer_allowed: bool = False) -> bool:
    """False, after saying why on stderr as ``command``, when the database's schema is not
    at this release's newest revision: not migrated, migrated by an older release only, or
    (unless ``newer_allowed``) by a newer one. Such a server used to start anyway: on no
    schema ``serve`` died with a traceback and a gateway served nothing, and on a newer one
    ``serve`` led and reconciled on tables it was not written for. Raises ``StoreError``
    when the database cannot be asked."""
    revision = await schema_revision(engine)
    refusal = await asyncio.to_thread(schema_refusal, revision, newer_allowed=newer_allowed)
    if refusal is None:
        return True
    print_command_error(command, refusal)
    return False
