"""A model's rollouts as its log tells them: each rollout's events on the model's stream,
grouped by rollout id, with the declaration that started it and where each one ended.

The fold keeps only a model's latest rollout; this reads every one of them back from the
events (``RolloutStarted`` and what followed it, all carrying its ``rollout_id``), so
what an operator sees of a rollout long finished is what was recorded then.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec
from msgspec.structs import replace

from app.domain.envelope import Recorded
from app.domain.events import (
    ModelDeclared,
    RolloutFinished,
    RolloutPaused,
    RolloutResumed,
    RolloutRolledBack,
    RolloutStarted,
)
from app.domain.revisions import SpecChange
from app.domain.state import UNDER_WAY, RolloutState

ROLLOUT_EVENT_PREFIX = "rollout_"
"""The ``type`` of every rollout event starts so (``rollout_started``, ``rollout_verdict``)."""
SUPERSEDED = "superseded"
"""The state of a rollout that never finished because a newer revision was declared while
it ran (the fold keeps only the newer one's)."""


class RolloutRecord(msgspec.Struct, frozen=True, kw_only=True):
    rollout_id: str
    revision: int
    from_revision: int
    started_at: datetime
    started_by: str
    changes: tuple[SpecChange, ...]
    """What the declaration that started it changed."""
    state: str
    """A ``RolloutState`` value as the fold would have it, or ``SUPERSEDED``."""
    outcome: str | None = None
    finished_at: datetime | None = None
    events: tuple[Recorded, ...] = ()
    undoes: str | None = None
    """The rollout an undo started this one to undo; None when a declaration started it."""


def rollout_records(events: Sequence[Recorded], current_id: str | None) -> list[RolloutRecord]:
    """The rollouts of ``events`` (one model's rollout events and the declarations that
    started them, oldest first), newest first. ``current_id``: the model's rollout in the
    fold now; any other one that never finished was superseded by a newer revision."""
    records: dict[str, RolloutRecord] = {}
    declarations: dict[int, tuple[str, ModelDeclared]] = {}
    for recorded in events:
        event = recorded.event
        if isinstance(event, ModelDeclared):
            declarations[recorded.version] = (recorded.meta.actor, event)
        elif isinstance(event, RolloutStarted):
            # Recorded in one append with the declaration that made the revision.
            actor, declared = declarations.get(recorded.version - 1, (recorded.meta.actor, None))
            records[event.rollout_id] = RolloutRecord(
                rollout_id=event.rollout_id,
                revision=event.revision,
                from_revision=event.from_revision,
                started_at=recorded.recorded_at,
                started_by=actor,
                changes=declared.changes if declared is not None else (),
                state=RolloutState.RUNNING.value,
                events=(recorded,),
                undoes=event.undoes,
            )
        else:
            rollout_id = getattr(event, "rollout_id", None)
            record = records.get(rollout_id) if isinstance(rollout_id, str) else None
            if record is not None:
                records[record.rollout_id] = _after(record, recorded)
    ordered = sorted(records.values(), key=lambda r: r.events[0].position)
    for index, record in enumerate(ordered):
        newer = ordered[index + 1] if index + 1 < len(ordered) else None
        if RolloutState(record.state) in UNDER_WAY and record.rollout_id != current_id:
            by = f"revision {newer.revision}" if newer is not None else "a newer revision"
            records[record.rollout_id] = replace(
                record,
                state=SUPERSEDED,
                outcome=f"superseded by {by}, declared while it ran",
            )
    return sorted(records.values(), key=lambda r: r.events[0].position, reverse=True)


def _after(record: RolloutRecord, recorded: Recorded) -> RolloutRecord:
    """``record`` once ``recorded`` (one of its events) happened, as the fold has it."""
    record = replace(record, events=(*record.events, recorded))
    match recorded.event:
        case RolloutPaused():
            return replace(record, state=RolloutState.PAUSED.value)
        case RolloutResumed():
            return replace(record, state=RolloutState.RUNNING.value)
        case RolloutRolledBack(reason=reason):
            return replace(record, state=RolloutState.ROLLING_BACK.value, outcome=reason)
        case RolloutFinished(succeeded=succeeded, outcome=outcome):
            if succeeded:
                ended = RolloutState.SUCCEEDED
            elif record.state == RolloutState.ROLLING_BACK.value:
                ended = RolloutState.ROLLED_BACK
            else:
                ended = RolloutState.ENDED
            return replace(
                record, state=ended.value, outcome=outcome, finished_at=recorded.recorded_at
            )
    return record
