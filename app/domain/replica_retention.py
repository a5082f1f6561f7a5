"""Forgetting the replicas that ended long ago: the retention of the ``replicas`` and
``shards`` tables. Pure decisions, no I/O.

The fold forgets ended replicas past ``ENDED_KEPT_PER_MODEL`` per model, but the tables keep
a row for every replica that ever ran: a fleet that scales to zero and back and rolls out
revisions ends thousands a day. An operator forgets those that ended at or before a cutoff
(``llmgw-cli forget-ended --before 30d``): one ``ended_replicas_forgotten`` per model that
has any, on the model's stream, which the fold and ``llmgw_append`` (migration 0020) both
apply, so that a replay, ``projections rebuild`` and a start-up from a snapshot give the
same tables.

What stays: every replica not ended; each model's count of replicas created, so no number
is given twice; every event about a forgotten replica, so ``llmgw-cli history replica``
still answers, and a page of the replica list may still start after one. A cutoff in the
future or less than ``MIN_AGE`` ago is refused: the replicas that just ended are those an
operator looks into.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta

import msgspec

from app.domain.events import AnyEvent, EndedReplicasForgotten, model_stream
from app.domain.keys import utc_text
from app.domain.operation_results import Change, OperationError

MIN_AGE = timedelta(hours=1)
"""The most recent cutoff taken: an hour before the request."""


class InvalidCutoff(OperationError):
    """A cutoff that is not one: in the future, too recent, or without its offset."""


MAX_AGE_S = 100 * 365 * 86400.0
"""The oldest cutoff an age may name, a century: further back, nothing ever ran."""


def cutoff_of(before: datetime | None, older_than_s: float | None, now: datetime) -> datetime:
    """The cutoff a request names: ``before``, or ``older_than_s`` seconds before ``now``
    (exactly one of them); ``InvalidCutoff`` raised when it names none, both, or one that
    ``checked_cutoff`` refuses."""
    if (before is None) == (older_than_s is None):
        raise InvalidCutoff(
            "name the cutoff by a time (before) or by an age (older_than_s), one of them; "
            "nothing was forgotten"
        )
    if older_than_s is not None:
        if not 0 <= older_than_s <= MAX_AGE_S:
            raise InvalidCutoff(
                f"older_than_s {older_than_s:g} is not an age from 0 to {MAX_AGE_S:g} seconds; "
                "nothing was forgotten"
            )
        before = now - timedelta(seconds=older_than_s)
    assert before is not None
    return checked_cutoff(before, now)


def checked_cutoff(before: datetime, now: datetime) -> datetime:
    """``before`` in UTC, or ``InvalidCutoff`` raised saying why it cannot be taken."""
    if before.tzinfo is None:
        raise InvalidCutoff(
            f"the cutoff {before.isoformat()} has no UTC offset: say which time it is "
            "(2026-11-01T00:00:00Z); nothing was forgotten"
        )
    try:
        before = before.astimezone(UTC)
    except OverflowError:
        raise InvalidCutoff(
            f"the cutoff {before.isoformat()} is no time in UTC (years 1 to 9999); nothing "
            "was forgotten"
        ) from None
    if before > now:
        raise InvalidCutoff(
            f"the cutoff {utc_text(before)} is in the future (it is {utc_text(now)}): the "
            "replicas that end until then are not ended yet; nothing was forgotten"
        )
    if now - before < MIN_AGE:
        raise InvalidCutoff(
            f"the cutoff {utc_text(before)} is less than {_hours(MIN_AGE)} ago (it is "
            f"{utc_text(now)}): only replicas that ended at least that long ago can be "
            "forgotten; nothing was forgotten"
        )
    return before


def forget_ended(before: datetime, now: datetime, held: Mapping[str, int]) -> list[Change]:
    """The changes that forget the replicas that ended at or before ``before``: one per
    model of ``held`` (how many such replicas the tables hold, by model) with any, in the
    order of the models' names; none when there is nothing to forget. Raises
    ``InvalidCutoff`` for a cutoff that cannot be taken at ``now``."""
    before = checked_cutoff(before, now)
    return [
        Change(
            stream=model_stream(model),
            events=(EndedReplicasForgotten(model=model, before=before, replicas=count),),
        )
        for model, count in sorted(held.items())
        if count > 0
    ]


class Forgetting(msgspec.Struct, frozen=True, kw_only=True):
    """What a request forgot: its cutoff, and how many replicas of each model (as counted
    when it was decided), none when nothing had ended by then."""

    before: datetime
    models: dict[str, int] = {}

    @property
    def replicas(self) -> int:
        return sum(self.models.values())


def forgetting(before: datetime, events: Iterable[AnyEvent]) -> Forgetting:
    """The ``Forgetting`` that ``events`` (those of one request) recorded."""
    forgotten = [e for e in events if isinstance(e, EndedReplicasForgotten)]
    return Forgetting(
        before=forgotten[0].before if forgotten else before,
        models={e.model: e.replicas for e in forgotten},
    )


def _hours(age: timedelta) -> str:
    hours = age.total_seconds() / 3600
    return "1 hour" if hours == 1 else f"{hours:g} hours"
