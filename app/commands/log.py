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
from app.commands.check_failures import (
    COULD_NOT_CHECK,
    DATABASE_UNANSWERED,
    ROLE_REFUSED,
    missing_role_problem,
    unreadable_problem,
)
from app.commands.common import LOG_HEAD, LOG_VERIFY, DatabaseUrl, database_url_problem
from app.logs import configure_logging
from app.store.chain import Head, parse_anchor
from app.store.database import waiting_engine
from app.store.errors import InvalidAnchor, RoleRefused, StoreError, StoreUnavailable
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
    or moved, or an anchor the chain does not pass through. When the log cannot be read,
    nothing is known of it and nothing was changed; it exits 3 when the database is
    unreachable, or gives no answer to one statement for --answer-timeout seconds, or one
    waits 80 % of that for a lock another session holds; 4 when it refuses the role (no
    such role, a password refused, no privilege to read the log); 5 when the database does
    not exist or is not migrated. Exits 2 for a wrong flag.

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
    first); 3, 4 or 5 when the log cannot be read, as `log verify` does (3 the database
    unreachable or without an answer for --answer-timeout seconds, 4 the role refused, 5
    the database missing or not migrated); 2 for a wrong flag.

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
        # A refused role is 4 and a database without the log 5, as for `projections
        # rebuild`: 3 is only a database that did not answer, which trying again may mend.
        waited = why_unanswered(exc, answer_timeout)
        if waited is not None:
            _refuse(
                command,
                f"cannot {action} the log: {waited}; nothing was changed (it only reads), "
                "and nothing is known of the log",
                DATABASE_UNANSWERED,
            )
        if isinstance(exc, StoreUnavailable):
            _refuse(command, f"cannot {action} the log: {exc}", DATABASE_UNANSWERED)
        if isinstance(exc, RoleRefused):
            why = missing_role_problem(exc, _ROLE_THAT_MAY_READ) or str(exc)
            _refuse(command, f"cannot {action} the log: {why}", ROLE_REFUSED)
        _refuse(command, f"cannot {action} the log: {unreadable_problem(exc)}", COULD_NOT_CHECK)


_ROLE_THAT_MAY_READ = "a role that may read the log (the runtime role may)"


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
