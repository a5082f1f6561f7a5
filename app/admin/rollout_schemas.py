"""Bodies of ``/admin/v1/models/{name}/rollout`` and ``/rollouts``: a rollout's status, the
operator's requests, the model's rollout history (wire schemas, apart from domain types)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec

from app.admin.replica_schemas import MoveView, ReplicaTrafficView
from app.admin.schemas import EventView
from app.domain.free_text import MAX_REASON_LENGTH

MAX_PAUSE_REASON = MAX_REASON_LENGTH
"""Characters of a pause's reason, as of any reason: it is kept in the log for ever."""


class PauseRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: Annotated[str, msgspec.Meta(max_length=MAX_PAUSE_REASON)] = ""
    """Why, for the log; left out: ``paused by an operator``."""


ROLLOUT_ID_PATTERN = r"^rollout-[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?-r[1-9][0-9]{0,9}$"
"""A rollout's id: ``rollout-<model>-r<revision>``."""


class UndoRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    rollout_id: Annotated[str, msgspec.Meta(pattern=ROLLOUT_ID_PATTERN)] | None = None
    """The rollout to undo; refused (409) when it is not the model's rollout any more, so
    a repeated undo does not undo the rollout the first one started. Left out: the model's
    rollout, unless an undo started it (a 409 then: an undo of an undo names it)."""


class RolloutStepView(msgspec.Struct, frozen=True, kw_only=True):
    replicas: int | Literal["all"]
    """As declared: a number of replicas of the new revision, or ``"all"``."""
    target: int
    """How many replicas of the new revision serve once the step is done, at the model's
    desired count now."""
    traffic: float | None
    """The share of the model's requests they get during the step; null: their share by
    weight, as any replica."""
    hold_s: float
    """Seconds the step is held, once its replicas serve, before its verdict."""


class CanaryTrafficView(msgspec.Struct, frozen=True, kw_only=True):
    revision: int
    share: float
    """The share of the model's requests the gateways send to that revision's replicas."""


class RolloutView(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    rollout_id: str
    """Its correlation id in the log, and the drain id of its moves."""
    state: str
    """``running``, ``paused`` (by an operator, or by a verdict that could not be reached),
    ``rolling_back``, or, once finished, ``succeeded``, ``rolled_back`` or ``ended`` (its
    model was removed)."""
    finished: bool
    """Whether it is no longer under way (``state`` is none of the first three)."""
    revision: int
    """The revision it brings in."""
    from_revision: int
    """The revision it replaces, and the one a rollback goes back to."""
    model_revision: int
    """The model's revision now: ``revision`` while it runs, ``from_revision`` once rolled
    back."""
    undoes: str | None = None
    """The rollout an undo started this one to undo (after it had succeeded); null when a
    declaration started it. An undo that names no rollout does not undo such a one."""
    started_at: datetime
    step: int
    """The current step, from 0: an index of ``steps`` (the ``step`` of its events)."""
    steps: list[RolloutStepView]
    """Every step as it runs, the last one (every replica) included."""
    step_started_at: datetime | None
    """Null until the reconciler has started the step."""
    holding_since: datetime | None
    """When the step's replicas all served and its hold began."""
    hold_left_s: float | None
    """Seconds left of the hold; null when the step is not holding."""
    hold_ejections: dict[str, int] = {}
    """The model's replicas the gateways ejected for failing during the step's hold, as the
    log records them (``rollout_hold_ejection_seen``): replica id -> the most gateways seen
    ejecting it at once. The verdict counts them, even those back in rotation since;
    ``{}`` when none was, or no step holds."""
    pause_reason: str | None
    promoted: bool = False
    """Whether the step's hold is over and the step was promoted, by its verdict or by a
    resume after a verdict that could not be reached: the next step starts at the
    reconciler's next pass."""
    desired: int
    replicas_by_revision: dict[str, dict[str, int]]
    """The model's active replicas by the revision they run, then by phase."""
    moves: list[MoveView]
    """Replicas this rollout is replacing now, each with its replacement (as a drain's)."""
    max_surge: int
    max_unavailable: int
    failures: int
    """Replicas of the new revision that failed or timed out at start."""
    max_failures: int
    """Failures that roll it back."""
    last_failure: str | None
    verdict: str | None
    """The last verdict and why: ``promote: ...``, ``roll_back: ...`` or ``inconclusive: ...``."""
    canary: CanaryTrafficView | None
    """The share of traffic a canary step sends the new revision now; null when it gets
    its share by weight."""
    outcome: str | None
    """What it came to (or why it is rolling back), in words."""
    finished_at: datetime | None
    traffic_by_revision: dict[str, ReplicaTrafficView]
    """What the gateways measured of the model's active replicas over their window, per
    revision (as in ``GET /admin/v1/models/{name}``); ``{}`` when no gateway reports."""
    verdict_waits_for: str | None = None
    """While a step holds: what its verdict, taken on the gateways' figures now, would still
    wait for (``the gateways saw 3 request(s) to the new revision and 450 to the others,
    fewer than min_requests 20``, or too few latency samples, with the counts); a hold
    that ends so pauses the rollout. Null when the verdict would decide, or no step holds.
    Judged on ``hold_ejections`` and the ejections the gateways report now, as the verdict
    would be."""
    moves_progress: str
    """Where its moves are listed as a drain's: ``/admin/v1/drains/{rollout_id}`` (the
    ``state`` there is of the moves made so far, not of the rollout)."""
    placement: str
    """Where the next replacement would go and why other nodes would not:
    ``/admin/v1/models/{name}/placement`` (replacements run the model's current spec)."""


class RolloutChange(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    """False when the request changed nothing (and so recorded nothing)."""
    rollout: RolloutView


class SpecChangeView(msgspec.Struct, frozen=True, kw_only=True):
    field: str
    old: str | None
    """Null: added (an environment variable); values of ``env.*`` are never shown."""
    new: str | None


class RolloutRecordView(msgspec.Struct, frozen=True, kw_only=True):
    """One rollout as the log tells it."""

    rollout_id: str
    revision: int
    from_revision: int
    undoes: str | None = None
    """The rollout an undo started this one to undo; null when a declaration started it."""
    started_at: datetime
    started_by: str
    """The actor of the declaration that started it."""
    changes: list[SpecChangeView]
    """What the revision changed, as the declaration recorded it."""
    changes_summary: str
    """The same in one line: ``command 'a' -> 'b'; env: added HF_TOKEN``."""
    state: str
    """As the log has it now: ``running``, ``paused``, ``rolling_back``, ``succeeded``,
    ``rolled_back``, ``ended`` (its model was removed) or ``superseded`` (a newer revision
    was declared while it ran)."""
    outcome: str | None
    finished_at: datetime | None
    events: list[EventView]
    """Its events on the model's stream, oldest first: steps, holds, verdicts with the
    figures they judged, pauses, resumes, the rollback, the end."""


class RolloutHistoryView(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    rollouts: list[RolloutRecordView]
    """Newest first."""
    next_before: int | None
    """Pass as ``before`` for the next (older) page; null when this page is the last."""
