"""What applying a spec would do, decided as the apply decides it and recorded nowhere:
``llmgw-cli models apply --dry-run``, and the check of every spec of a file before any of
it is recorded.

The preview runs the same decision as the apply (``model_operations.apply_model``): the same
validation (an invalid spec raises ``InvalidSpec`` with every field), the same keeping of
the routing ``bench`` recorded and of an autoscaled model's count, the same revision rule.
So what it says is what an apply on the same log records.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from app.domain.events import ModelDeclared, RolloutStarted
from app.domain.model_operations import apply_model
from app.domain.model_spec import ModelSpec
from app.domain.revisions import SpecChange, at_once_changes
from app.domain.state import ClusterState, Model


class ApplyOutcome(StrEnum):
    NEW = "new"
    """Not declared yet: it would be declared at revision 1."""
    UNCHANGED = "unchanged"
    """Declared exactly so: nothing would be recorded."""
    AT_ONCE = "at_once"
    """Only fields that take effect at once change: the revision stays."""
    NEW_REVISION = "new_revision"
    """What runs changes: a new revision, and a rollout replaces the replicas with it."""
    DECLARED_AGAIN = "declared_again"
    """The model was removed: it would be declared again."""


class ApplyPreview(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    outcome: ApplyOutcome
    revision: int
    """The model's revision once applied."""
    from_revision: int | None
    """Its revision now; None for a model not declared yet."""
    revision_changes: tuple[SpecChange, ...] = ()
    """What makes it a new revision (empty unless it is one)."""
    at_once: tuple[SpecChange, ...] = ()
    """The other fields that change, taking effect at once for every replica."""
    rollout_id: str | None = None
    """The rollout the apply would start; None when none."""
    supersedes: str | None = None
    """The rollout under way that the new one would supersede: it records nothing more, and
    the new one starts from the revision it was rolling out."""


def preview_apply(state: ClusterState, spec: ModelSpec) -> ApplyPreview:
    """What ``apply_model(state, spec)`` would record, described; ``InvalidSpec`` as the
    apply raises it."""
    change = apply_model(state, spec)
    known = state.models.get(spec.name)
    declared = next((e for e in change.events if isinstance(e, ModelDeclared)), None)
    if known is None:
        revision = declared.revision if declared is not None else 1
        return ApplyPreview(
            model=spec.name, outcome=ApplyOutcome.NEW, revision=revision, from_revision=None
        )
    if declared is None:
        return ApplyPreview(
            model=spec.name,
            outcome=ApplyOutcome.UNCHANGED,
            revision=known.revision,
            from_revision=known.revision,
        )
    started = next((e for e in change.events if isinstance(e, RolloutStarted)), None)
    if known.removed:
        outcome = ApplyOutcome.DECLARED_AGAIN
    elif declared.revision != known.revision:
        outcome = ApplyOutcome.NEW_REVISION
    else:
        outcome = ApplyOutcome.AT_ONCE
    return ApplyPreview(
        model=spec.name,
        outcome=outcome,
        revision=declared.revision,
        from_revision=known.revision,
        revision_changes=declared.changes,
        at_once=at_once_changes(known.spec, declared.spec),
        rollout_id=started.rollout_id if started is not None else None,
        supersedes=_superseded(known, started),
    )


def _superseded(known: Model, started: RolloutStarted | None) -> str | None:
    rollout = known.rollout
    if started is None or known.removed or rollout is None or not rollout.under_way:
        return None
    return rollout.id
