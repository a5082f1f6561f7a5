"""What every ``llmgw-server`` command shares: the database URL flag, the engine networks
flag, failing in one line, and the refusal to serve as a database role that could rewrite
the event log."""

from __future__ import annotations

import sys
from typing import Annotated, NoReturn

import asyncpg
import structlog
from cyclopts import Parameter

from app.domain.egress import EngineNetworks
from app.store.database_url import InvalidDatabaseUrl, parse_database_url
from app.store.errors import StoreUnavailable
from app.store.grants import DEFAULT_RUNTIME_ROLE
from app.store.privileges import may_append, privileged_role
from app.usage_errors import print_command_error

log = structlog.get_logger(__name__)

DatabaseUrl = Annotated[
    str,
    Parameter(
        env_var="LLMGW_DATABASE_URL",
        help="PostgreSQL URL, e.g. postgresql://llmgw@db:5432/llmgw; several hosts find "
        "the primary after a failover: postgresql://llmgw@db-a:5432,db-b:5432/llmgw"
        "?target_session_attrs=read-write.",
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


EngineNetworksFlag = Annotated[
    str,
    Parameter(
        env_var="LLMGW_ENGINE_NETWORKS",
        help="where engines may live, comma-separated: networks (10.20.0.0/16), addresses, "
        "DNS names (gpu-07.internal) or *.domain; the gateway contacts no engine elsewhere. "
        "[default: only the address each node's agent connects from, and loopback if it "
        "connects over loopback]",
        show_default=False,
    ),
]


def engine_networks_of(text: str) -> EngineNetworks | None:
    """The ``--engine-networks`` value, or None for the default when it is not given.
    Raises ``InvalidEngineNetworks`` (its message names the flag) for a bad list."""
    if not text.strip():
        return None
    return EngineNetworks.parse(text)


HeaderTimeout = Annotated[
    float,
    Parameter(
        env_var="LLMGW_HEADER_TIMEOUT",
        help="seconds a client has to send a request's headers (from connecting, or from "
        "the first byte of the next request); then it gets 408 and is disconnected",
    ),
]
BodyTimeout = Annotated[
    float,
    Parameter(
        env_var="LLMGW_BODY_TIMEOUT",
        help="seconds a client has to send a request's body once its headers are in, not "
        "counting the time the server does not read it (the request waits for a replica); "
        "then it gets 408 and is disconnected",
    ),
]

SendTimeout = Annotated[
    float,
    Parameter(
        env_var="LLMGW_SEND_TIMEOUT",
        help="seconds a client may take in nothing of an answer the server has for it (a "
        "stream it stopped reading); then it is disconnected and its request ends, freeing "
        "what it held",
    ),
]

EngineHeadTimeout = Annotated[
    float,
    Parameter(
        env_var="LLMGW_ENGINE_HEAD_TIMEOUT",
        help="seconds an engine may take to send its answer's head, and a stream's first "
        "piece, after the request (an answer that is not streamed comes only once it is "
        "generated whole, after its time in the engine's queue); then the client gets 504, "
        "the engine's connection is closed and the attempt counts as the replica's failure",
    ),
]
EngineIdleTimeout = Annotated[
    float,
    Parameter(
        env_var="LLMGW_ENGINE_IDLE_TIMEOUT",
        help="seconds an engine may send nothing once its answer has begun (the gateway "
        "not reading it, its client being slow, does not count); then the answer ends as "
        "one whose engine broke off (a stream gets an error event and [DONE]) and the "
        "engine's connection is closed",
    ),
]


AuthFailureBurst = Annotated[
    int,
    Parameter(
        env_var="LLMGW_AUTH_FAILURE_BURST",
        help="wrong keys or tokens one client address may send at once before it gets 429 "
        "with Retry-After",
    ),
]
AuthFailuresPerMinute = Annotated[
    float,
    Parameter(
        env_var="LLMGW_AUTH_FAILURES_PER_MINUTE",
        help="wrong keys or tokens an address earns back each minute",
    ),
]


EjectAfterFailures = Annotated[
    int,
    Parameter(
        env_var="LLMGW_EJECT_AFTER_FAILURES",
        help="requests in a row a replica fails (no answer, or a 5xx before the first "
        "byte) before the gateway takes it out of rotation for a cool-off; 0: never",
    ),
]
EjectionCoolOff = Annotated[
    float,
    Parameter(
        env_var="LLMGW_EJECTION_COOL_OFF",
        help="seconds an ejected replica stays out the first time; doubled with each "
        "ejection in a row. Then one request probes it: a success returns it",
    ),
]
MaxEjectionCoolOff = Annotated[
    float,
    Parameter(
        env_var="LLMGW_MAX_EJECTION_COOL_OFF",
        help="the longest cool-off, however many ejections in a row",
    ),
]
MaxEjectedPercent = Annotated[
    int,
    Parameter(
        env_var="LLMGW_MAX_EJECTED_PERCENT",
        help="at most this share of a model's replicas is ejected at once (at least "
        "one of two or more; never the last one in rotation)",
    ),
]
MaxUploadMib = Annotated[
    int,
    Parameter(
        env_var="LLMGW_GATEWAY_MAX_UPLOAD_MIB",
        help="an upload's body at most (/v1/audio/transcriptions and translations), in "
        "MiB; a larger one is 413. A large upload must also arrive within --body-timeout",
    ),
]


# Each command as typed: the start of every error line it ends with, as of its usage
# errors (``llmgw-server log verify: --anchor: ...``).
SERVE = "llmgw-server serve"
GATEWAY = "llmgw-server gateway"
MIGRATE = "llmgw-server migrate"
REBUILD = "llmgw-server projections rebuild"
LOG_VERIFY = "llmgw-server log verify"
LOG_HEAD = "llmgw-server log head"


def fail(command: str, message: str) -> NoReturn:
    """End ``command`` (``llmgw-server migrate``) with exit code 1, saying why in one line:
    ``llmgw-server migrate: cannot migrate: ...``."""
    print_command_error(command, message)
    sys.exit(1)


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


async def database_role_allowed(database_url: str, *, allow_privileged: bool, command: str) -> bool:
    """False, after saying why on stderr as ``command`` (``llmgw-server serve``), when the
    database role could rewrite the event log and that was not allowed explicitly. Raises
    ``StoreUnavailable`` when the database cannot be asked."""
    try:
        role, reason = await privileged_role(database_url)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
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
