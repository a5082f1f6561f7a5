"""``llmgw-server log verify`` and ``llmgw-server log head``: the event log against its chain."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, NoReturn, TypeVar

import msgspec
from cyclopts import Parameter
from sqlalchemy.ext.asyncio import AsyncEngine

from app.commands.answer_wait import (
    DEFAULT_ANSWER_TIMEOUT_S,
    AnswerTimeout,
    answer_timeout_problem,
    why_unanswered,
)
from app.commands.common import LOG_HEAD, LOG_VERIFY, DatabaseUrl, database_url_problem
from app.logs import configure_logging
from app.store.chain import Head, parse_anchor
from app.store.database import waiting_engine
from app.store.errors import InvalidAnchor, RoleRefused, StoreError
from app.store.grants import DEFAULT_RUNTIME_ROLE
from app.store.verification import (
    Progress,
    UnhashedHead,
    Verification,
    read_head,
    verify_log,
)
from app.usage_errors import print_command_error

T = TypeVar("T")

BROKEN = 1
"""The exit status when the log does not check out (``log verify``), or has no head to record
because its last event has no chain hash (``log head``): what to raise an alarm on."""
USAGE_ERROR = 2
"""A flag is wrong (as for any command the command line itself refuses)."""
UNREADABLE = 3
"""The log could not be read (the database is unreachable, not migrated, gave no answer
within ``--answer-timeout``, or the role may not read it): nothing is known of the log, and
nothing should be concluded about it."""
Output = Annotated[str, Parameter(help="text or json")]


def verify_command(
    *,
    database_url: DatabaseUrl,
    anchor: Annotated[
        list[str] | None,
        Parameter(
            help="POSITION:HASH, a head recorded earlier by `log head`, kept outside the "
            "database: the chain must pass through it (repeat for several)",
            negative="",
        ),
    ] = None,
    output: Output = "text",
    answer_timeout: AnswerTimeout = DEFAULT_ANSWER_TIMEOUT_S,
) -> None:
    """Check every event of the log against its chain hash, from the first to the last, and
    print how many there are and the head (position and chain hash). Exits 1 at the first
    break, naming its position and what is wrong there: an event changed, missing, inserted
    or moved, or an anchor the chain does not pass through. Exits 3 when the log cannot be
    read (the database unreachable, not migrated, not readable by the role, or without an
    answer to one statement for --answer-timeout seconds, or waiting 80 % of that for a
    lock another session holds): nothing is known of it then, and nothing was changed. Exits 2
    for a wrong flag.

    The chain alone shows changes made by someone who did not recompute the hashes after
    them. Someone able to rewrite the whole table can recompute them too; only heads
    recorded elsewhere before (`log head`, then `--anchor`) show that. Reads one snapshot
    with a cursor: memory stays the same however long the log, and appends may go on.

    Example: llmgw-server log verify --anchor "$(tail -n 1 /srv/audit/llmgw-heads)"
    """
    configure_logging(command=LOG_VERIFY)
    _check_flags(LOG_VERIFY, database_url, output, answer_timeout)
    try:
        anchors = [parse_anchor(value) for value in anchor or ()]
    except InvalidAnchor as exc:
        _refuse(LOG_VERIFY, f"--anchor: {exc}", USAGE_ERROR)
    progress = _terminal_progress() if output == "text" and sys.stderr.isatty() else None
    result = _run(
        LOG_VERIFY,
        database_url,
        answer_timeout,
        lambda engine: verify_log(engine, anchors, progress),
        "verify",
    )
    if progress is not None:
        sys.stderr.write("\r\x1b[K")
    if output == "json":
        print(msgspec.json.encode(_json_report(result)).decode())
    else:
        _print_report(result)
    if not result.ok:
        sys.exit(BROKEN)


def head_command(
    *,
    database_url: DatabaseUrl,
    output: Output = "text",
    answer_timeout: AnswerTimeout = DEFAULT_ANSWER_TIMEOUT_S,
) -> None:
    """Print the log's head: the last event's position and chain hash, as POSITION:HASH.

    Record it somewhere the database's administrators cannot rewrite (another system, a
    ticket, a signed mail) from time to time; `log verify --anchor POSITION:HASH` later shows
    whether the log up to there is still the one that was recorded.

    Exits 1, printing nothing, when the last event has no chain hash, or one of another
    length than a sha256's (the chain is broken there: `log verify` finds where it breaks
    first); 3 when the log cannot be read (as for `log verify`: the database unreachable,
    or without an answer for --answer-timeout seconds), 2 for a wrong flag.

    Example: llmgw-server log head >> /srv/audit/llmgw-heads
    """
    configure_logging(command=LOG_HEAD)
    _check_flags(LOG_HEAD, database_url, output, answer_timeout)
    head = _run(LOG_HEAD, database_url, answer_timeout, read_head, "read the head of")
    if isinstance(head, UnhashedHead):
        _refuse(
            LOG_HEAD,
            f"the last event, at position {head.position}, {head.why}: the chain is broken "
            "there, so there is no head to record (`llmgw-server log verify` finds where it "
            "breaks first)",
            BROKEN,
        )
    if output == "json":
        print(msgspec.json.encode(_json_head(head)).decode())
    else:
        print(head)


def _check_flags(command: str, database_url: str, output: str, answer_timeout: float) -> None:
    for problem in (database_url_problem(database_url), answer_timeout_problem(answer_timeout)):
        if problem is not None:
            _refuse(command, problem, USAGE_ERROR)
    if output not in ("text", "json"):
        _refuse(command, f"--output is text or json, not {output!r}", USAGE_ERROR)


def _run(
    command: str,
    url: str,
    answer_timeout: float,
    work: Callable[[AsyncEngine], Awaitable[T]],
    action: str,
) -> T:
    async def run() -> T:
        engine = waiting_engine(url, answer_timeout)
        try:
            return await work(engine)
        finally:
            await engine.dispose()

    try:
        return asyncio.run(run())
    except StoreError as exc:
        waited = why_unanswered(exc, answer_timeout)
        if waited is not None:
            _refuse(
                command,
                f"cannot {action} the log: {waited}; nothing was changed (it only reads), "
                "and nothing is known of the log",
                UNREADABLE,
            )
        _refuse(command, f"cannot {action} the log: {_unreadable(exc)}", UNREADABLE)


def _unreadable(exc: StoreError) -> str:
    """Why the log could not be read, and what to do about it: a role that does not exist
    is told as such, not as a schema not migrated, though PostgreSQL says "does not exist"
    of both."""
    if isinstance(exc, RoleRefused) and exc.missing_role is not None:
        return (
            f'the role "{exc.missing_role}" of --database-url (LLMGW_DATABASE_URL) does not '
            "exist on this PostgreSQL server; connect as a role that may read the log (the "
            "runtime role may): the server's administrator creates roles (createuser, or "
            f"CREATE ROLE), and `llmgw-server migrate --runtime-role {DEFAULT_RUNTIME_ROLE}` "
            "creates the runtime role where the owner may create roles (docs/operations.md, "
            "PostgreSQL)"
        )
    if not isinstance(exc, RoleRefused) and "does not exist" in str(exc):
        return f"{exc} (is the database at the newest revision? llmgw-server migrate)"
    return str(exc)


def _terminal_progress() -> Progress:
    def show(events: int, position: int, last: int) -> None:
        share = f" ({position / last:.0%})" if last else ""
        sys.stderr.write(f"\rverifying: {events:,} events, at position {position:,}{share}")
        sys.stderr.flush()

    return show


def _print_report(result: Verification) -> None:
    if result.broken is None:
        span = f"position {result.head.position}" if result.events else "the genesis"
        print(f"log verified: {result.events:,} events, the chain holds up to {span}")
    else:
        broken = result.broken
        print(f"the chain breaks at position {broken.position} ({broken.problem}): {broken.detail}")
        print(f"{result.events:,} events before it checked out")
    print(f"head {result.head}" if result.ok else f"last good head {result.head}")
    for anchor in result.anchors:
        print(f"passes through anchor {anchor}")


def _json_head(head: Head) -> dict[str, object]:
    return {"position": head.position, "chain_hash": head.chain_hash.hex()}


def _json_report(result: Verification) -> dict[str, object]:
    broken = result.broken
    return {
        "ok": result.ok,
        "events": result.events,
        "head": _json_head(result.head),
        "anchors": [_json_head(anchor) for anchor in result.anchors],
        "break": None
        if broken is None
        else {"position": broken.position, "problem": str(broken.problem), "detail": broken.detail},
    }


def _refuse(command: str, message: str, status: int) -> NoReturn:
    print_command_error(command, message)
    sys.exit(status)
