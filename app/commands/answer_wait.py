"""How long ``migrate``, ``projections rebuild`` and ``log verify``/``log head`` wait for the
database to answer one statement (``--answer-timeout``), and what they say when it did not.

These commands may run for minutes on a large log, so nothing bounds a whole run: each
statement (a page of the log, a revision, a grant) is bounded instead, by two limits:

- the client's (asyncpg's ``command_timeout``, and its connect timeout): a statement that
  gets no answer for ``--answer-timeout`` seconds is given up and its connection dropped.
  Only the client can tell a partition or a frozen host: no answer ever comes from them.
- PostgreSQL's ``lock_timeout``, at ``LOCK_SHARE`` of it: a statement waiting for a lock
  another session holds is canceled by the database first, which says so (SQLSTATE
  ``55P03``), so the command names the lock instead of blaming a silent database.

``app.store.database.waiting_engine`` sets both.

``serve`` and ``gateway`` bound their statements by their own rules (twice the leader lease;
the gateway's reads), not by this flag.
"""

from __future__ import annotations

from typing import Annotated

from cyclopts import Parameter

from app.store.database import LOCK_SHARE, lock_timeout_s
from app.usage_errors import finite_number_flag

DEFAULT_ANSWER_TIMEOUT_S = 120.0
"""Long enough for any one statement of these commands on a log of millions of events (a
page of 5,000 events, a revision, a projection table written whole), short enough that a
script or cron job hears of a database that stopped answering within minutes."""
MAX_ANSWER_TIMEOUT_S = 86400.0
LOCK_NOT_AVAILABLE = "55P03"
QUERY_CANCELED = "57014"

AnswerTimeout = Annotated[
    float,
    Parameter(
        converter=finite_number_flag,
        env_var="LLMGW_ANSWER_TIMEOUT",
        help="seconds one statement may go without an answer from the database before the "
        "command gives up (a network cut off, a frozen host); a statement waiting for a "
        f"lock another session holds is given up after {LOCK_SHARE:.0%} of it. Bounds each "
        "statement, not the whole run, which may take minutes on a long log",
    ),
]


def answer_timeout_problem(seconds: float) -> str | None:
    """What is wrong with ``--answer-timeout``, in one line; None when it can be used."""
    if not seconds > 0:  # NaN too
        return f"--answer-timeout must be positive, not {seconds:g}"
    if seconds > MAX_ANSWER_TIMEOUT_S:
        return f"--answer-timeout must be at most {MAX_ANSWER_TIMEOUT_S:g} seconds, not {seconds:g}"
    return None


def why_unanswered(error: BaseException, answer_timeout_s: float) -> str | None:
    """What a statement waited for, when ``error`` (a ``StoreError`` and the driver errors
    behind it) is a wait given up: no answer, a lock, or a cancel; None for any other
    error."""
    found = causes(error)
    states = {getattr(cause, "sqlstate", None) for cause in found}
    if LOCK_NOT_AVAILABLE in states:
        return (
            f"a statement waited {lock_timeout_s(answer_timeout_s):g} s for a lock another "
            "session holds, and PostgreSQL gave it up (lock_timeout); pg_stat_activity shows "
            "the session holding it (a long transaction, `idle in transaction`, another "
            "llmgw-server migrate or projections rebuild): let it end, or raise --answer-timeout"
        )
    if QUERY_CANCELED in states:
        return (
            "PostgreSQL canceled a statement (query_canceled: an administrator's "
            "pg_cancel_backend, or a statement_timeout set for the role or the database)"
        )
    if any(isinstance(cause, TimeoutError) for cause in found):
        return (
            f"the database gave no answer for {answer_timeout_s:g} s (--answer-timeout): the "
            "network to it is cut off, its host is frozen, or it is stalled"
        )
    return None


def causes(error: BaseException) -> list[BaseException]:
    """``error`` and every error behind it: causes, contexts and SQLAlchemy's ``orig``."""
    found: list[BaseException] = []
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop()
        if any(current is seen for seen in found):
            continue
        found.append(current)
        for behind in (
            current.__cause__,
            current.__context__,
            getattr(current, "orig", None),
        ):
            if isinstance(behind, BaseException):
                pending.append(behind)
    return found
