"""``llmgw-server migrate`` and ``llmgw-server projections rebuild``."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec
import structlog
from cyclopts import Parameter

from app.commands.answer_wait import (
    DEFAULT_ANSWER_TIMEOUT_S,
    AnswerTimeout,
    answer_timeout_problem,
    why_unanswered,
)
from app.commands.check_failures import (
    COULD_NOT_CHECK,
    DATABASE_UNANSWERED,
    ROLE_REFUSED,
    missing_role_problem,
    unreadable_problem,
)
from app.commands.common import (
    MIGRATE,
    REBUILD,
    DatabaseUrl,
    database_url_problem,
    fail,
    refuse_usage,
)
from app.commands.path_flag import path_flag
from app.logs import configure_logging
from app.regular_file import FileRefused, read_file_or_pipe
from app.store import migrate as migrations
from app.store.database import waiting_engine
from app.store.errors import (
    CommitOutcomeUnknown,
    PrivilegeRefused,
    RoleRefused,
    RuntimeRoleError,
    StoreError,
    StoreUnavailable,
)
from app.store.grants import DEFAULT_RUNTIME_ROLE, RuntimeRole, check_roles
from app.store.rebuild import RebuildReport, rebuild
from app.usage_errors import print_command_error

log = structlog.get_logger(__name__)


RUNTIME_PASSWORD_ENV = "LLMGW_RUNTIME_PASSWORD"
GATEWAY_PASSWORD_ENV = "LLMGW_GATEWAY_PASSWORD"
MAX_PASSWORD_FILE_BYTES = 4 * 1024
"""The most of a password file read: it holds one line."""
MIGRATE_AGAIN_IS_SAFE = (
    "running migrate again is safe: each of its steps (the roles, the revisions, the grants) "
    "is one transaction, which the database undoes when its connection ends, and a step "
    "already done is found done"
)
"""What ``migrate`` adds when it could not reach the database or lost it half-way."""


def migrate(
    *,
    database_url: DatabaseUrl,
    runtime_role: Annotated[
        str | None,
        Parameter(
            env_var="LLMGW_RUNTIME_ROLE",
            help="the role serve connects as: created (LOGIN, nothing else) if missing, then "
            "granted what it needs in this database and nothing more",
        ),
    ] = None,
    runtime_password_file: Annotated[
        Path | None,
        path_flag(
            "--runtime-password-file",
            "LLMGW_RUNTIME_PASSWORD_FILE",
            f"set the runtime role's password to this file's first line (or to "
            f"{RUNTIME_PASSWORD_ENV}); sent as a SCRAM-SHA-256 verifier, never in clear",
        ),
    ] = None,
    gateway_role: Annotated[
        str | None,
        Parameter(
            env_var="LLMGW_GATEWAY_ROLE",
            help="the role standalone gateways connect as: created likewise, granted what a "
            "gateway needs (reading, its reports) and no function: it cannot append",
        ),
    ] = None,
    gateway_password_file: Annotated[
        Path | None,
        path_flag(
            "--gateway-password-file",
            "LLMGW_GATEWAY_PASSWORD_FILE",
            f"set the gateway role's password to this file's first line (or to "
            f"{GATEWAY_PASSWORD_ENV}), as --runtime-password-file does",
        ),
    ] = None,
    answer_timeout: AnswerTimeout = DEFAULT_ANSWER_TIMEOUT_S,
) -> None:
    """Upgrade the database schema to the newest revision (safe to run repeatedly), as the
    role that owns the schema, and set up the runtime role that serve connects as: it reads
    what it needs, appends only through llmgw_append and owns nothing. With --gateway-role,
    also the role standalone gateways connect as, which reads what it needs, writes the
    gateways' reports and may not append at all (a gateway may also use the runtime role).

    Roles belong to the whole PostgreSQL server, privileges to one database: run migrate
    with --runtime-role (and --gateway-role) for every database. Every run grants the
    privileges again, to the roles given and to every role that holds them already, so
    tables of newer revisions are covered.

    Exit codes: 0 migrated; 1 the database unreachable or refusing (a password, a
    privilege), or one statement without an answer for --answer-timeout seconds (or
    waiting 80 % of that for a lock another session holds), said in one line on stderr:
    running migrate again is safe; 2 bad usage, found before connecting.

    Example: llmgw-server migrate --runtime-role llmgw_runtime --runtime-password-file pw
    --gateway-role llmgw_gateway --gateway-password-file gw-pw
    """
    configure_logging(command=MIGRATE)
    for problem in (database_url_problem(database_url), answer_timeout_problem(answer_timeout)):
        if problem is not None:
            refuse_usage(MIGRATE, problem)
    # What the flags alone say is wrong is bad usage (exit 2), found before connecting;
    # what only the database can tell (a role it refuses, no CREATEROLE) is a failure.
    try:
        runtime = _role("runtime", runtime_role, runtime_password_file, RUNTIME_PASSWORD_ENV)
        gateway = _role("gateway", gateway_role, gateway_password_file, GATEWAY_PASSWORD_ENV)
        check_roles(runtime, gateway)
    except (ValueError, RuntimeRoleError) as exc:
        refuse_usage(MIGRATE, str(exc))
    try:
        upgraded = migrations.upgrade(
            database_url, runtime=runtime, gateway=gateway, answer_timeout_s=answer_timeout
        )
    except StoreError as exc:
        waited = why_unanswered(exc, answer_timeout)
        if waited is not None:
            fail(MIGRATE, f"cannot migrate: {waited}; {MIGRATE_AGAIN_IS_SAFE}")
        if isinstance(exc, StoreUnavailable):
            fail(MIGRATE, f"cannot migrate: {exc}; {MIGRATE_AGAIN_IS_SAFE}")
        fail(MIGRATE, f"cannot migrate: {exc}")
    except (OSError, ValueError) as exc:
        fail(MIGRATE, f"cannot migrate: {exc}")
    print(f"database at revision {migrations.head_revision()}")
    _say_granted("runtime", runtime, upgraded.created_role, upgraded.runtime_roles)
    _say_granted("gateway", gateway, upgraded.created_gateway_role, upgraded.gateway_roles)
    if not upgraded.runtime_roles:
        print(
            "no runtime role yet: serve and gateway refuse to run as the owner; set one up "
            f"with --runtime-role {DEFAULT_RUNTIME_ROLE} (docs/security.md)"
        )


def _role(kind: str, name: str | None, path: Path | None, env: str) -> RuntimeRole | None:
    password = _password(kind, path, env)
    if password is not None and name is None:
        source = f"--{kind}-password-file" if path is not None else env
        raise ValueError(
            f"{source} needs --{kind}-role (LLMGW_{kind.upper()}_ROLE): the password is set "
            "on the role it names"
        )
    return RuntimeRole(name, password) if name is not None else None


def _say_granted(kind: str, given: RuntimeRole | None, created: bool, holders: list[str]) -> None:
    if given is not None:
        done = ["created" if created else "found"]
        done += ["password set"] if given.password is not None else []
        print(f'{kind} role "{given.name}": {", ".join(done)}, privileges granted')
    for role in holders:
        if given is None or role != given.name:
            print(f'{kind} role "{role}": privileges granted again')


def runtime_password(path: Path | None, environ: Mapping[str, str]) -> str | None:
    """The runtime role's password: the first line of ``path``, else
    ``$LLMGW_RUNTIME_PASSWORD``, else None (``_password``)."""
    return _password("runtime", path, RUNTIME_PASSWORD_ENV, environ)


def _password(
    kind: str, path: Path | None, env: str, environ: Mapping[str, str] = os.environ
) -> str | None:
    """The first line of ``path``, else ``$env``, else None. At most
    ``MAX_PASSWORD_FILE_BYTES`` of the file are read, so a device such as /dev/zero is
    refused by its size rather than read until memory runs out; a pipe (``<(...)``) is
    still read, and a named pipe nothing writes to refused rather than waited on
    (``read_file_or_pipe``). A ``ValueError`` names the file and the problem."""
    password: str | None
    if path is not None:
        try:
            content = read_file_or_pipe(path, MAX_PASSWORD_FILE_BYTES)
        except FileRefused as exc:
            raise ValueError(f"cannot read the {kind} password file {path}: {exc.reason}") from exc
        if len(content) > MAX_PASSWORD_FILE_BYTES:
            raise ValueError(
                f"the {kind} password file {path} is over {MAX_PASSWORD_FILE_BYTES // 1024} "
                "KiB: it holds one line"
            )
        try:
            lines = content.decode("utf-8").splitlines()
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"the {kind} password file {path} is not UTF-8 text "
                f"(byte 0x{content[exc.start]:02x} at offset {exc.start})"
            ) from exc
        password = lines[0] if lines else ""
        source = str(path)
    else:
        password = environ.get(env)
        source = env
    if password is None:
        return None
    if not password:
        raise ValueError(f"the {kind} password in {source} is empty")
    return password


def rebuild_command(
    *,
    database_url: DatabaseUrl,
    verify: bool = False,
    output: Annotated[str, Parameter(help="text or json")] = "text",
    answer_timeout: AnswerTimeout = DEFAULT_ANSWER_TIMEOUT_S,
) -> None:
    """Replay the whole log into fresh projection tables.

    With --verify nothing is written: every row that differs between the replayed log and
    the live tables is reported, and the exit code is 1 if there is any.

    Exit codes: 0 rebuilt, or no difference found; 1 differences found (--verify), and
    nothing else; 2 bad usage; 3 the database unreachable, or one statement without an
    answer for --answer-timeout seconds, or waiting 80 % of that for a lock another session
    holds: the rebuild is one transaction, and the line says whether it was committed; 4
    the database refused the role (no such role, a password refused, a privilege it lacks):
    nothing was changed; 5 nothing could be checked or rebuilt (no such database, a schema
    not migrated, an event in the log that cannot be decoded), said in one line: nothing was
    changed.

    Example: llmgw-server projections rebuild --verify
    """
    configure_logging(command=REBUILD)
    for problem in (database_url_problem(database_url), answer_timeout_problem(answer_timeout)):
        if problem is not None:
            refuse_usage(REBUILD, problem)
    if output not in ("text", "json"):
        refuse_usage(REBUILD, f"--output is text or json, not {output!r}")
    report = asyncio.run(_rebuild(database_url, verify, answer_timeout))
    if output == "json":
        print(msgspec.json.encode(report).decode())
    else:
        _print_report(report)
    if report.differences:
        sys.exit(1)


async def _rebuild(url: str, verify: bool, answer_timeout: float) -> RebuildReport:
    engine = waiting_engine(url, answer_timeout)
    try:
        return await rebuild(engine, verify=verify)
    except StoreError as exc:
        waited = why_unanswered(exc, answer_timeout)
        if waited is not None or isinstance(exc, StoreUnavailable):
            print_command_error(
                REBUILD,
                f"cannot rebuild the projections: {waited or exc}; {_what_was_done(exc, verify)}",
            )
            sys.exit(DATABASE_UNANSWERED)
        if isinstance(exc, RoleRefused):
            print_command_error(REBUILD, _role_refused(exc, verify))
            sys.exit(ROLE_REFUSED)
        # Not 1, which --verify gives to differences found: a check from cron tells "the
        # projections are wrong" from "they could not be checked".
        print_command_error(
            REBUILD,
            f"cannot {'verify' if verify else 'rebuild'} the projections: "
            f"{unreadable_problem(exc)}; {_what_was_done(exc, verify)}",
        )
        sys.exit(COULD_NOT_CHECK)
    finally:
        await engine.dispose()


def _role_refused(exc: RoleRefused, verify: bool) -> str:
    """What the database refused, and which role to run as instead."""
    who_may = (
        "a role that may read the projection tables (the runtime role may)"
        if verify
        else "the role that owns the projection tables (the one that runs migrate)"
    )
    missing = missing_role_problem(exc, who_may)
    if missing is not None:
        return missing
    if isinstance(exc, PrivilegeRefused) and not verify:
        return (
            f"{exc}; rebuilding writes the projection tables directly: run it as the role "
            "that owns them (the one that runs migrate), or use --verify"
        )
    return str(exc)


def _what_was_done(exc: StoreError, verify: bool) -> str:
    if verify:
        return "nothing was changed (--verify only reads)"
    if isinstance(exc, CommitOutcomeUnknown):
        return (
            "the rebuild is one transaction and its COMMIT got no answer: the tables are "
            "either as they were or wholly rebuilt; `llmgw-server projections rebuild "
            "--verify` tells"
        )
    return "nothing was changed: the rebuild is one transaction, never committed"


def _print_report(report: RebuildReport) -> None:
    rows = ", ".join(f"{count} {table}" for table, count in report.rows.items())
    action = "rewrote" if report.rewritten else "verified"
    print(f"replayed {report.events} events (up to position {report.position}); {action} {rows}")
    for diff in report.differences:
        detail = "; ".join(
            f"{column}: table has {live!r}, log implies {wanted!r}"
            for column, (live, wanted) in diff.columns.items()
        )
        print(f"  {diff.table} {diff.key}: {diff.problem}{' (' + detail + ')' if detail else ''}")
    if not report.rewritten:
        count = len(report.differences)
        print(f"{count} difference(s)" if count else "no differences")
