"""Stories of an operator's rollouts on the in-memory store: what pause, resume and undo
record and with which correlation id, and the rollouts read back from the model's stream
(``rollout_records``) as the history endpoint tells them."""

from __future__ import annotations

from datetime import UTC, datetime

from msgspec.structs import replace

from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    RolloutFinished,
    RolloutStepStarted,
    event_type,
    model_stream,
)
from app.domain.model_spec import ModelSpec
from app.domain.rollout_history import ROLLOUT_EVENT_PREFIX, rollout_records
from app.domain.state import RolloutState
from app.services.operations import Caller, Operations
from app.store.interface import NewEvent
from app.store.memory import InMemoryEventStore

ALICE = Caller(actor="alice", request_id="req-1")
BOB = Caller(actor="bob", request_id="req-2")
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
SPEC = ModelSpec(name="llama", command="sim --port {port}", replicas=2)


async def declared(*commands: str) -> tuple[InMemoryEventStore, Operations]:
    """``llama`` declared, then declared again with each of ``commands`` (a revision each)."""
    store = InMemoryEventStore()
    operations = Operations(store, clock=lambda: T0)
    for command in ("sim --port {port}", *commands):
        await operations.apply_model(ALICE, replace(SPEC, command=command))
    return store, operations


async def as_the_history_reads_it(store: InMemoryEventStore) -> list[Recorded]:
    """The model's rollout events and declarations, as ``read_rollouts`` selects them."""
    return [
        r
        for r in await store.read_stream(model_stream("llama"))
        if event_type(r.event).startswith(ROLLOUT_EVENT_PREFIX)
        or event_type(r.event) == "model_declared"
    ]


async def reconciler_records(store: InMemoryEventStore, *events: AnyEvent) -> None:
    version = store.known_version(model_stream("llama"))
    meta = Meta(actor="reconciler", correlation_id="rollout-llama-r2")
    await store.append(model_stream("llama"), version, [NewEvent(e) for e in events], meta)


async def test_pause_resume_and_undo_are_recorded_as_the_operator_s_steps_of_the_rollout() -> None:
    store, operations = await declared("sim --port {port} --v2")

    assert await operations.pause_rollout(BOB, "llama", "dashboards look odd")
    assert not await operations.pause_rollout(BOB, "llama", "again")
    assert await operations.resume_rollout(BOB, "llama")
    assert await operations.undo_rollout(BOB, "llama")

    steered = [r for r in await store.read_stream(model_stream("llama")) if r.meta.actor == "bob"]
    assert [event_type(r.event) for r in steered] == [
        "rollout_paused",
        "rollout_resumed",
        "rollout_rolled_back",
    ]
    assert {(r.meta.correlation_id, r.meta.causation_id) for r in steered} == {
        ("rollout-llama-r2", "req-2")
    }
    report = await operations.rollout("llama")
    assert (report.status.rollout.state, report.model.revision) == (RolloutState.ROLLING_BACK, 1)


async def test_an_undo_after_success_starts_a_rollout_under_its_own_id() -> None:
    store, operations = await declared("sim --port {port} --v2")
    await reconciler_records(
        store,
        RolloutStepStarted(model="llama", rollout_id="rollout-llama-r2", step=0, replicas=2),
        RolloutFinished(
            model="llama", rollout_id="rollout-llama-r2", succeeded=True, outcome="all on 2"
        ),
    )

    assert await operations.undo_rollout(BOB, "llama")

    *_, declaration, started = await store.read_stream(model_stream("llama"))
    assert [event_type(declaration.event), event_type(started.event)] == [
        "model_declared",
        "rollout_started",
    ]
    assert {declaration.meta.correlation_id, started.meta.correlation_id} == {"rollout-llama-r3"}
    assert {declaration.meta.causation_id, started.meta.causation_id} == {"req-2"}
    report = await operations.rollout("llama")
    assert (report.status.rollout.id, report.model.revision) == ("rollout-llama-r3", 3)
    assert report.model.spec.command == "sim --port {port}"


async def test_the_history_groups_each_rollout_s_events_newest_first_with_what_it_changed() -> None:
    store, operations = await declared("sim --port {port} --v2")
    await reconciler_records(
        store,
        RolloutStepStarted(model="llama", rollout_id="rollout-llama-r2", step=0, replicas=2),
        RolloutFinished(
            model="llama", rollout_id="rollout-llama-r2", succeeded=True, outcome="all on 2"
        ),
    )
    await operations.apply_model(BOB, replace(SPEC, command="sim --port {port} --v3"))
    await operations.pause_rollout(ALICE, "llama", "")
    await operations.apply_model(ALICE, replace(SPEC, command="sim --port {port} --v4"))

    records = rollout_records(await as_the_history_reads_it(store), "rollout-llama-r4")

    assert [(r.rollout_id, r.state, r.started_by) for r in records] == [
        ("rollout-llama-r4", "running", "alice"),
        ("rollout-llama-r3", "superseded", "bob"),
        ("rollout-llama-r2", "succeeded", "alice"),
    ]
    newest, superseded, succeeded = records
    assert [(c.field, c.old, c.new) for c in newest.changes] == [
        ("command", "sim --port {port} --v3", "sim --port {port} --v4")
    ]
    assert superseded.outcome == "superseded by revision 4, declared while it ran"
    assert [event_type(r.event) for r in superseded.events] == ["rollout_started", "rollout_paused"]
    assert (succeeded.outcome, succeeded.finished_at is not None) == ("all on 2", True)
    assert [event_type(r.event) for r in succeeded.events] == [
        "rollout_started",
        "rollout_step_started",
        "rollout_finished",
    ]


async def test_a_history_of_a_model_without_rollouts_is_empty() -> None:
    store, _ = await declared()

    assert rollout_records(await as_the_history_reads_it(store), None) == []
