"""`llmgw-cli forget-ended --before 30d|TIME`: the retention of ended replicas. The
projection keeps a row for every replica that ever ran; this forgets those that ended at or
before the cutoff, for good, keeping their history in the log."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Annotated

import msgspec
from cyclopts import Parameter, Token

from cli.arguments import ArgumentRefused, duration, moment
from cli.client import ADMIN
from cli.config import ConnectionFlags
from cli.operator import Output, post_change
from cli.render import utc_seconds


class EndedReplicasForgetting(msgspec.Struct, frozen=True, kw_only=True):
    before: datetime
    forgotten: int = 0
    models: dict[str, int] = {}
    changed: bool = False


def cutoff(type_: object, tokens: Sequence[Token]) -> timedelta | datetime:
    """cyclopts' converter for ``--before``: an age (``30d``, as ``duration`` reads it) or a
    time with its timezone (as ``moment`` reads it)."""
    value = tokens[0].value.strip()
    if value[:1].isdigit() and value[-1:] in {"s", "m", "h", "d", "w"}:
        return duration(type_, tokens)
    try:
        return moment(type_, tokens)
    except ArgumentRefused:
        raise ArgumentRefused(
            "must be an age (a whole number and s, m, h, d or w, such as 30d) or an ISO 8601 "
            f"time with its timezone (such as 2026-11-01T00:00:00Z), got {tokens[0].value}"
        ) from None


def forget_ended(
    *,
    before: Annotated[
        timedelta | datetime,
        Parameter(
            converter=cutoff,
            metavar="AGE|TIME",
            help="Forget the replicas that ended at or before this: an age, by the server's "
            "clock (30d: ended 30 days ago or earlier; a whole number and s, m, h, d or w), "
            "or an ISO 8601 time with its timezone (2026-11-01T00:00:00Z). At least an hour "
            "ago.",
        ),
    ],
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Forget the replicas that ended (stopped, failed, timed_out, lost) at or before a
    cutoff: they leave `replicas --all` and the projection tables for good, so that a
    fleet that ends thousands of replicas a day does not keep them all. Replicas not ended
    are never touched, no replica number is given twice, and the log keeps every event
    about each: `history replica <id>` still answers for a forgotten one. The cutoff must
    be at least an hour ago (else exit 1, nothing forgotten). Says how many replicas were
    forgotten, of which models.

    ```
    llmgw-cli forget-ended --before 30d
    llmgw-cli forget-ended --before 2026-11-01T00:00:00Z
    ```
    """
    body = (
        {"older_than_s": before.total_seconds()}
        if isinstance(before, timedelta)
        else {"before": before.isoformat()}
    )
    return post_change(
        "forget-ended",
        lambda: f"{ADMIN}/replicas/forget-ended",
        EndedReplicasForgetting,
        body,
        output,
        connection,
        done=_forgotten,
        unchanged=lambda done: (
            f"no replica had ended by {utc_seconds(done.before)} UTC: nothing forgotten"
        ),
    )


def _forgotten(done: EndedReplicasForgetting) -> str:
    models = ", ".join(f"{count} of {model}" for model, count in sorted(done.models.items()))
    return (
        f"forgot {done.forgotten} replica(s) that ended by {utc_seconds(done.before)} UTC "
        f"({models}); their history stays in the log"
    )
