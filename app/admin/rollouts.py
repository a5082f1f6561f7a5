"""A model's rollout (``/admin/v1/models/{name}/rollout``): how it is going, and an
operator's pause, resume and undo; the model's past rollouts (``/rollouts``), read from
the log. The reconciler carries rollouts out; these record the operator's word."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from litestar import get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, QueryParameter

from app.admin.bodies import NoBody
from app.admin.drains import DRAINS_PATH
from app.admin.guarded import GuardedController
from app.admin.history import MAX_POSITION, event_view
from app.admin.operation_schema import refusal
from app.admin.problem_schemas import ConflictProblem
from app.admin.replica_schemas import MoveView
from app.admin.rollout_schemas import (
    CanaryTrafficView,
    PauseRequest,
    RolloutChange,
    RolloutHistoryView,
    RolloutRecordView,
    RolloutStepView,
    RolloutView,
    SpecChangeView,
    UndoRequest,
)
from app.admin.schemas import as_view
from app.admin.traffic import TrafficSource, traffic_by_revision, traffic_view
from app.domain.events import model_stream
from app.domain.revisions import describe_changes
from app.domain.rollout_history import RolloutRecord, rollout_records
from app.domain.rollout_reads import verdict_groups, verdict_waits_for
from app.domain.traffic import TrafficFigures
from app.services.operations import Caller, Operations, RolloutReport
from app.store.history import read_rollouts
from app.store.postgres import PostgresEventStore

MODELS_PATH = "/admin/v1/models"
ROLLOUTS_PER_PAGE = 20
MAX_ROLLOUTS_PER_PAGE = 100


def rollout_view(
    report: RolloutReport,
    traffic: Mapping[str, TrafficFigures],
    verdict_waits_for: str | None = None,
) -> RolloutView:
    status = report.status
    rollout = status.rollout
    canary = status.canary
    return as_view(
        rollout,
        RolloutView,
        model=status.model,
        rollout_id=rollout.id,
        state=rollout.state.value,
        finished=not rollout.under_way,
        model_revision=report.model.revision,
        steps=[
            RolloutStepView(
                replicas=step.replicas,
                target=step.count(status.desired),
                traffic=step.traffic,
                hold_s=step.hold_s,
            )
            for step in status.steps
        ],
        hold_left_s=status.hold_left_s,
        desired=status.desired,
        replicas_by_revision={str(rev): phases for rev, phases in status.by_revision.items()},
        moves=[as_view(m, MoveView) for m in status.moves],
        max_surge=status.max_surge,
        max_unavailable=status.max_unavailable,
        max_failures=report.model.spec.rollout.max_failures,
        canary=None if canary is None else CanaryTrafficView(revision=canary[0], share=canary[1]),
        traffic_by_revision={rev: traffic_view(f) for rev, f in sorted(traffic.items())},
        verdict_waits_for=verdict_waits_for,
        moves_progress=f"{DRAINS_PATH}/{rollout.id}",
        placement=f"{MODELS_PATH}/{status.model}/placement",
    )


def record_view(record: RolloutRecord) -> RolloutRecordView:
    return as_view(
        record,
        RolloutRecordView,
        changes=[as_view(c, SpecChangeView) for c in record.changes],
        changes_summary=describe_changes(record.changes),
        events=[event_view(e) for e in record.events],
    )


class RolloutController(GuardedController):
    path = MODELS_PATH
    tags = ["rollouts"]

    @get(
        "/{name:str}/rollout",
        summary="How the model's rollout is going: its step, replicas by revision, moves",
        description="The rollout under way, or the model's last one; 409 when it never had one.",
        responses={
            409: refusal(ConflictProblem, "The model has had no rollout (invalid-operation)")
        },
    )
    async def status(
        self,
        operations: NamedDependency[Operations],
        traffic: NamedDependency[TrafficSource],
        name: FromPath[str],
    ) -> RolloutView:
        return await _answer(operations, traffic, name)

    @post(
        "/{name:str}/rollout/pause",
        status_code=200,
        summary="Pause the rollout: moves under way finish, no new one starts",
        description="Pausing a paused rollout records nothing (`changed` false); one that "
        "is rolling back or has finished is a 409.",
    )
    async def pause(
        self,
        operations: NamedDependency[Operations],
        traffic: NamedDependency[TrafficSource],
        caller: NamedDependency[Caller],
        name: FromPath[str],
        data: JSONBody[PauseRequest | None] = None,
    ) -> RolloutChange:
        reason = (data or PauseRequest()).reason
        changed = await operations.pause_rollout(caller, name, reason)
        return RolloutChange(changed=changed, rollout=await _answer(operations, traffic, name))

    @post(
        "/{name:str}/rollout/resume",
        status_code=200,
        summary="Resume a paused rollout; a step whose verdict was not reached is promoted",
        description="Resuming a running rollout records nothing (`changed` false); one that "
        "is rolling back or has finished is a 409.",
    )
    async def resume(
        self,
        operations: NamedDependency[Operations],
        traffic: NamedDependency[TrafficSource],
        caller: NamedDependency[Caller],
        name: FromPath[str],
        data: JSONBody[NoBody | None] = None,
    ) -> RolloutChange:
        changed = await operations.resume_rollout(caller, name)
        return RolloutChange(changed=changed, rollout=await _answer(operations, traffic, name))

    @post(
        "/{name:str}/rollout/undo",
        status_code=200,
        summary="Back to the revision before: roll back the rollout under way, or roll the "
        "old revision out again after one that succeeded",
        description="The body's `rollout_id` names the rollout to undo: one that is not the "
        "model's rollout any more (undone or superseded already) is a 409, so a repeated "
        "undo changes nothing. Without it, the model's rollout is undone, unless an undo "
        "started it (a 409: an undo of an undo names it). A rollout rolling back or rolled "
        "back already is a 409.",
    )
    async def undo(
        self,
        operations: NamedDependency[Operations],
        traffic: NamedDependency[TrafficSource],
        caller: NamedDependency[Caller],
        name: FromPath[str],
        data: JSONBody[UndoRequest | None] = None,
    ) -> RolloutChange:
        rollout_id = (data or UndoRequest()).rollout_id
        changed = await operations.undo_rollout(caller, name, rollout_id)
        return RolloutChange(changed=changed, rollout=await _answer(operations, traffic, name))

    @get(
        "/{name:str}/rollouts",
        summary="The model's rollouts, newest first, as the log tells them",
    )
    async def history(
        self,
        operations: NamedDependency[Operations],
        store: NamedDependency[PostgresEventStore],
        name: FromPath[str],
        before: Annotated[
            int | None,
            QueryParameter(
                ge=1, le=MAX_POSITION, description="rollouts started before this log position"
            ),
        ] = None,
        limit: Annotated[
            int, QueryParameter(ge=1, le=MAX_ROLLOUTS_PER_PAGE, description="rollouts")
        ] = ROLLOUTS_PER_PAGE,
    ) -> RolloutHistoryView:
        current = await operations.rollout_id(name)
        events, next_before = await read_rollouts(store.engine, model_stream(name), before, limit)
        return RolloutHistoryView(
            model=name,
            rollouts=[record_view(r) for r in rollout_records(events, current)],
            next_before=next_before,
        )


async def _answer(operations: Operations, traffic: TrafficSource, name: str) -> RolloutView:
    report = await operations.rollout(name)
    groups = traffic_by_revision(report.replicas)
    judged = verdict_groups(report.model, report.replicas)
    figures = await traffic.traffic_of_groups({**groups, **judged}) if groups else {}
    ejected = (await traffic.ejections()).ejected_by if judged else {}
    waits_for = verdict_waits_for(report.model, report.replicas, figures, ejected)
    by_revision = {group: f for group, f in figures.items() if group in groups}
    return rollout_view(report, by_revision, waits_for)
