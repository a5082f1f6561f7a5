"""Stories of an operator forgetting the replicas that ended long ago: what the decision
records, what the fold keeps afterwards (the replicas not ended, the numbers taken), what a
rebuild's rows keep (none of the forgotten), and what operators can still read (their
history, a page that starts after one)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from msgspec.structs import replace

from app.domain.describe import describe
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    EndedReplicasForgotten,
    ModelDeclared,
    ReplicaStopped,
    model_stream,
)
from app.domain.evolve import replay
from app.domain.model_spec import ModelSpec
from app.domain.operation_results import Change
from app.domain.replica_retention import InvalidCutoff, forget_ended
from app.domain.state import ClusterState
from app.services.operations import Caller, Operations
from app.store.fold_view import FoldView
from app.store.interface import AppendRequest, NewEvent
from app.store.memory import InMemoryEventStore
from app.store.projection import all_rows, fold
from tests.support.generators import stream_for
from tests.unit.test_forgetting import K, declared, ended, placed

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
QWEN = ModelSpec(name="qwen", command="sim --port {port}", replicas=0)


def at_minutes(events: list[AnyEvent], after: int = 0) -> list[Recorded]:
    """The events recorded a minute apart, the first at ``T0`` plus ``after + 1`` minutes."""
    return [
        Recorded(
            position=after + n,
            stream=stream_for(event),
            version=after + n,
            event_id=uuid.uuid4(),
            recorded_at=T0 + timedelta(minutes=after + n),
            meta=Meta(actor="alice"),
            event=event,
        )
        for n, event in enumerate(events, start=1)
    ]


def history() -> list[AnyEvent]:
    """llama: K + 5 replicas ended one after the other (the fold forgot the first five),
    then one placed and running; qwen: one ended."""
    qwen_ended = [
        ModelDeclared(model="qwen", spec=QWEN),
        replace(placed(1), replica_id="qwen-1", model="qwen"),
        ReplicaStopped(replica_id="qwen-1"),
    ]
    return [*declared(), *ended(K + 5), placed(K + 6), *qwen_ended]


def end_of(log: list[Recorded], replica_id: str) -> datetime:
    return next(
        r.recorded_at
        for r in log
        if isinstance(r.event, ReplicaStopped) and r.event.replica_id == replica_id
    )


def forgotten_by(log: list[Recorded], before: datetime) -> Recorded:
    event = EndedReplicasForgotten(model="llama", before=before, replicas=0)
    return at_minutes([event], after=len(log))[0]


def test_the_replicas_that_ended_by_the_cutoff_leave_the_fold_and_the_rows_numbers_stay() -> None:
    log = at_minutes(history())
    cutoff = end_of(log, "llama-8")  # five forgotten by the fold already, three it kept
    rebuilt = ClusterState()
    rebuilt.forgotten = []  # as ``projections rebuild`` replays: the rows it keeps

    state = replay([*log, forgotten_by(log, cutoff)])
    replay([*log, forgotten_by(log, cutoff)], rebuilt)

    llama = state.models["llama"]
    kept = [f"llama-{n}" for n in range(9, K + 6)]
    assert sorted(r for r in state.replicas if r.startswith("llama")) == sorted(
        [*kept, f"llama-{K + 6}"]
    )
    assert llama.ended == tuple(kept)
    assert llama.replicas_created == K + 6  # the next placement takes K + 7
    assert llama.forgotten == {"stopped": 8}  # counts by phase still include every one
    assert state.replicas[f"llama-{K + 6}"].ended_at is None  # not ended: never touched
    assert "qwen-1" in state.replicas  # another model's
    rows = {row["id"] for row in all_rows(rebuilt)["replicas"]}
    assert rows == {*kept, f"llama-{K + 6}", "qwen-1"}
    assert {row["replica_id"] for row in all_rows(rebuilt)["shards"]} == rows


def test_a_cutoff_before_every_end_forgets_nothing() -> None:
    log = at_minutes(history())

    state = replay([*log, forgotten_by(log, T0)])

    assert state.replicas == replay(log).replicas


def test_an_append_of_the_forgetting_that_does_not_commit_puts_the_replicas_back() -> None:
    log = at_minutes(history())
    state = replay(log)
    before = state.copy()

    changes, undo = fold(state, [forgotten_by(log, end_of(log, f"llama-{K + 5}"))])
    assert [r for r in state.replicas if r.startswith("llama")] == [f"llama-{K + 6}"]
    undo.restore(state)

    assert state.replicas == before.replicas
    assert state.models == before.models
    # The rows are deleted by ``llmgw_append`` (migration 0020): none is written here.
    assert changes.touched["replicas"] == []
    assert changes.touched["models"] == ["llama"]


def test_the_stream_versions_of_the_replicas_forgotten_go_with_them() -> None:
    log = at_minutes(history())
    view = FoldView()
    view.absorb(log)
    assert "replica-llama-6" in view.versions

    view.absorb([forgotten_by(log, end_of(log, "llama-8"))])

    assert sorted(s for s in view.versions if s.startswith("replica-llama")) == sorted(
        f"replica-llama-{n}" for n in range(9, K + 7)
    )


def test_the_decision_records_one_forgetting_per_model_with_replicas_to_forget() -> None:
    now = T0 + timedelta(days=40)
    cutoff = now - timedelta(days=30)

    changes = forget_ended(cutoff, now, {"qwen": 2, "llama": 1200, "mistral": 0})

    assert changes == [
        Change(
            stream=model_stream(model),
            events=(EndedReplicasForgotten(model=model, before=cutoff, replicas=count),),
        )
        for model, count in [("llama", 1200), ("qwen", 2)]
    ]
    assert forget_ended(cutoff, now, {}) == []
    assert describe(changes[0].events[0]) == (
        "model llama forgot its 1200 replica(s) that ended at or before 2026-11-12 09:00:00 UTC"
    )


@pytest.mark.parametrize(
    ("cutoff", "refusal"),
    [
        (T0 + timedelta(seconds=1), "is in the future"),
        (T0 - timedelta(minutes=59), "is less than 1 hour ago"),
        (datetime(2026, 10, 1), "has no UTC offset"),
    ],
)
def test_a_cutoff_in_the_future_too_recent_or_without_an_offset_is_refused(
    cutoff: datetime, refusal: str
) -> None:
    with pytest.raises(InvalidCutoff, match=refusal) as refused:
        forget_ended(cutoff, T0, {"llama": 3})

    assert "nothing was forgotten" in str(refused.value)


# -- through the operators' service, in memory ---------------------------------------------


async def store_with_history() -> tuple[InMemoryEventStore, Callable[[], datetime], list[str]]:
    """A store holding ``history()``, a minute between events, and the ids of the llama
    replicas in the order they ended."""
    now = [T0]
    store = InMemoryEventStore(clock=lambda: now[0])
    for event in history():
        now[0] += timedelta(minutes=1)
        await store.append_many(
            [AppendRequest(stream_for(event), None, [NewEvent(event)])], Meta(actor="test")
        )
    now[0] += timedelta(days=30)
    return store, lambda: now[0], [f"llama-{n}" for n in range(1, K + 6)]


async def test_an_operator_forgets_the_replicas_ended_before_a_cutoff_and_their_history_stays() -> (
    None
):
    store, clock, llamas = await store_with_history()
    operations = Operations(store, clock=clock)
    ends = {r.id: r.ended_at for r in await operations.replicas(ended=True)}
    cutoff = ends["llama-8"]
    assert cutoff is not None

    forgetting = await operations.forget_ended_replicas(Caller(actor="alice"), cutoff)

    assert (forgetting.replicas, forgetting.models) == (8, {"llama": 8})
    listed = [r.id for r in await operations.replicas()]
    assert listed == [*llamas[8:], f"llama-{K + 6}", "qwen-1"]
    # The log still tells a forgotten replica's story, and a page may start after one.
    assert [type(r.event).__name__ for r in await store.read_about_replica("llama-1")] == [
        "ReplicaPlaced",
        "ShardStarting",
        "ReplicaStopped",
    ]
    assert [r.id for r in await operations.replicas(after="llama-3", limit=2)] == llamas[8:10]
    assert (await operations.model("llama")).phases["stopped"] == K + 5
    # Nothing ended by then is left: asked again, it records nothing.
    again = await operations.forget_ended_replicas(Caller(actor="alice"), cutoff)
    assert again.replicas == 0
    assert (await store.ended_replicas_by_model(cutoff)) == {}


def test_a_cutoff_is_recorded_in_utc_and_one_no_utc_time_can_be_is_refused() -> None:
    east = timezone(timedelta(hours=5, minutes=30))

    [change] = forget_ended(datetime(2026, 10, 1, 5, 30, tzinfo=east), T0, {"llama": 1})
    with pytest.raises(InvalidCutoff, match="is no time in UTC"):
        forget_ended(datetime(1, 1, 1, tzinfo=east), T0, {"llama": 1})

    [forgetting] = change.events
    assert isinstance(forgetting, EndedReplicasForgotten)
    assert forgetting.before == datetime(2026, 10, 1, tzinfo=UTC)
    assert forgetting.before.tzinfo is UTC
