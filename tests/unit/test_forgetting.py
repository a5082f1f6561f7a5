"""Stories of a fold that forgets: each model keeps its last ``ENDED_KEPT_PER_MODEL`` ended
replicas, and the one that ended first goes when one more ends. What the fold forgot stays in
the log and in the projection, and nothing the cluster decides needs it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    NodeConnected,
    ReplicaFailed,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStopped,
    ShardPlacement,
    ShardStarting,
    ShardStopped,
    StrayStopped,
)
from app.domain.evolve import replay
from app.domain.model_spec import ModelSpec
from app.domain.operation_results import InvalidOperation
from app.domain.replica_listing import UnknownPageStart
from app.domain.state import ENDED_KEPT_PER_MODEL, ClusterState, Replica, ReplicaPhase
from app.services.operations import Caller, Operations
from app.store.interface import AppendRequest, NewEvent
from app.store.memory import InMemoryEventStore
from app.store.projection import fold
from tests.support.generators import stream_for
from tests.unit.test_reconcile import Cluster, commands, gpus, of_type

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
K = ENDED_KEPT_PER_MODEL
SPEC = ModelSpec(name="llama", command="sim --port {port}", replicas=0)


def placed(number: int) -> ReplicaPlaced:
    return ReplicaPlaced(
        replica_id=f"llama-{number}",
        model="llama",
        number=number,
        shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(0,), port=20000 + number),),
    )


def ended(count: int, first: int = 1) -> list[AnyEvent]:
    """``count`` replicas of llama placed, started and stopped, one after the other."""
    events: list[AnyEvent] = []
    for number in range(first, first + count):
        replica_id = f"llama-{number}"
        events += [
            placed(number),
            ShardStarting(replica_id=replica_id, shard_index=0, node_id="gpu-1", pid=number),
            ReplicaStopped(replica_id=replica_id),
        ]
    return events


def log_of(events: list[AnyEvent], after: int = 0) -> list[Recorded]:
    return [
        Recorded(
            position=after + n,
            stream=stream_for(event),
            version=after + n,
            event_id=uuid.uuid4(),
            recorded_at=T0 + timedelta(seconds=after + n),
            meta=Meta(actor="test", epoch=1),
            event=event,
        )
        for n, event in enumerate(events, start=1)
    ]


def declared() -> list[AnyEvent]:
    return [
        NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(8)),
        ModelDeclared(model="llama", spec=SPEC),
    ]


def test_a_model_keeps_its_last_ended_replicas_and_forgets_the_one_that_ended_first() -> None:
    state = replay(log_of([*declared(), *ended(K + 1)]))

    model = state.models["llama"]
    assert "llama-1" not in state.replicas
    assert model.ended == tuple(f"llama-{n}" for n in range(2, K + 2))
    assert set(state.replicas) == set(model.ended)
    assert model.forgotten == {"stopped": 1}
    assert model.replicas_created == K + 1  # numbers are never reused


def test_the_fold_stays_the_size_of_the_cluster_however_long_the_history() -> None:
    state = replay(log_of([*declared(), *ended(10 * K), placed(10 * K + 1)]))

    assert len(state.replicas) == K + 1
    assert state.replicas[f"llama-{10 * K + 1}"].phase is ReplicaPhase.PLACED
    assert state.models["llama"].forgotten == {"stopped": 9 * K}


def test_events_about_a_forgotten_replica_change_nothing() -> None:
    history = log_of([*declared(), *ended(K + 1)])
    state = replay(history)
    before = state.copy()

    late = [
        ShardStopped(replica_id="llama-1", shard_index=0, node_id="gpu-1", exit_code=0),
        ReplicaFailed(replica_id="llama-1", reason="late"),
        ReplicaServing(replica_id="llama-1"),
    ]
    replay(log_of(late, after=len(history)), state)

    assert state.replicas == before.replicas
    assert state.models == before.models


def test_a_replica_said_to_serve_after_it_ended_stays_ended_and_is_forgotten_in_turn() -> None:
    # No decision records a serve after an end, but a log may say it: the replica stays
    # ended, so it is forgotten when its turn comes like any other.
    state = replay(
        log_of([*declared(), *ended(1), ReplicaServing(replica_id="llama-1"), *ended(K, first=2)])
    )

    assert "llama-1" not in state.replicas
    assert "llama-1" not in state.models["llama"].ended
    assert state.models["llama"].forgotten == {"stopped": 1}


def test_a_model_declared_again_after_its_removal_still_forgets_its_oldest() -> None:
    from app.domain.events import ModelRemoved

    state = replay(
        log_of(
            [
                *declared(),
                *ended(K),
                ModelRemoved(model="llama"),
                ModelDeclared(model="llama", spec=SPEC),
                *ended(1, first=K + 1),
            ]
        )
    )

    assert "llama-1" not in state.replicas
    assert state.models["llama"].forgotten == {"stopped": 1}


def test_an_append_that_does_not_commit_puts_a_forgotten_replica_back() -> None:
    history = log_of([*declared(), *ended(K)])
    state = replay(history)
    before = state.copy()

    changes, undo = fold(state, log_of(ended(1, first=K + 1), after=len(history)))
    assert "llama-1" not in state.replicas
    undo.restore(state)

    assert state.replicas == before.replicas
    assert state.models == before.models
    assert state.position == before.position
    # The rows of the replica the fold forgot are left as they are: not touched, not deleted.
    assert "llama-1" not in changes.touched["replicas"]
    assert f"llama-{K + 1}" in changes.touched["replicas"]


def test_a_forgotten_replica_s_engine_still_running_is_a_stray_stopped_and_recorded_once() -> None:
    cluster = Cluster()
    cluster.node("gpu-1")
    cluster.given(ModelDeclared(model="llama", spec=SPEC), *ended(K + 1))
    cluster.after(31)
    cluster.running("gpu-1", "llama-1", 20001, pid=1234)  # forgotten
    cluster.running("gpu-1", "llama-2", 20002, pid=2345)  # ended, still kept

    decision = cluster.reconcile()

    strays = of_type(decision, StrayStopped)
    assert [(s.replica_id, s.rule) for s in strays] == [
        ("llama-1", "the log knows no such replica")
    ]
    assert commands(decision) == ["stop-llama-2-0", "stray-llama-1-0-1234"]
    again = cluster.reconcile()
    assert again.events == ()  # recorded once, while the stop is on its way
    assert commands(again) == ["stop-llama-2-0", "stray-llama-1-0-1234"]


def test_placement_after_forgetting_takes_the_next_number() -> None:
    cluster = Cluster()
    cluster.node("gpu-1")
    cluster.given(ModelDeclared(model="llama", spec=SPEC), *ended(K + 1))
    cluster.after(31)
    cluster.model(replicas=1)

    decision = cluster.reconcile()

    assert [e.replica_id for e in of_type(decision, ReplicaPlaced)] == [f"llama-{K + 2}"]


# -- what operators read -----------------------------------------------------------------


async def forgotten_in_memory() -> tuple[InMemoryEventStore, Replica]:
    """A store whose fold forgot llama-1, and llama-1 as the fold had it before."""
    store = InMemoryEventStore(clock=lambda: T0)
    meta = Meta(actor="test", epoch=1)
    for event in [*declared(), *ended(K)]:
        await store.append_many([AppendRequest(stream_for(event), None, [NewEvent(event)])], meta)
    kept = store.state.replicas["llama-1"]
    for event in ended(1, first=K + 1):
        await store.append_many([AppendRequest(stream_for(event), None, [NewEvent(event)])], meta)
    assert "llama-1" not in store.state.replicas
    return store, kept


async def test_a_forgotten_replica_reads_as_it_did_before_it_was_forgotten() -> None:
    store, kept = await forgotten_in_memory()
    operations = Operations(store, clock=lambda: T0)

    assert await operations.replica("llama-1") == kept
    listed = await operations.replicas(model="llama", phase=ReplicaPhase.STOPPED)
    assert [r.id for r in listed] == [f"llama-{n}" for n in range(1, K + 2)]
    assert listed[0] == kept
    assert [r.id for r in await operations.replicas(node_id="gpu-1")][:2] == [
        "llama-1",
        "llama-2",
    ]
    status = await operations.model("llama")
    assert status.phases == {"stopped": K + 1}


async def test_pages_of_replicas_list_the_forgotten_ones_once_in_order_in_memory_too() -> None:
    store, _ = await forgotten_in_memory()
    operations = Operations(store, clock=lambda: T0)
    whole = await operations.replicas()

    for limit in (1, 2, K + 1):
        paged: list[Replica] = []
        while page := await operations.replicas(after=paged[-1].id if paged else None, limit=limit):
            paged += page
        assert paged == whole
    assert await operations.replicas(ended=False) == []
    with pytest.raises(UnknownPageStart, match="no replica \\(by id\\) to list the replicas"):
        await operations.replicas(after="llama-999")


async def test_a_forgotten_replica_is_refused_with_the_words_it_was_refused_with_before() -> None:
    store, _ = await forgotten_in_memory()
    operations = Operations(store, clock=lambda: T0)

    with pytest.raises(
        InvalidOperation, match=r"llama-1 cannot be drained: it has ended \(stopped"
    ):
        await operations.drain_replica(Caller(actor="alice"), "llama-1")


def test_a_snapshot_keeps_what_the_fold_remembers_of_its_ended_replicas() -> None:
    from app.store import snapshot_format

    state = replay(log_of([*declared(), *ended(K + 1)]))
    decoded, _ = snapshot_format.decode(state.position, snapshot_format.encode(state, {}))

    assert decoded.models == state.models
    assert decoded.replicas == state.replicas
    tail = log_of(ended(1, first=K + 2), after=state.position)
    assert replay(tail, decoded).replicas == replay(tail, state).replicas
    assert isinstance(decoded, ClusterState)


async def test_a_forgotten_replica_s_stream_has_no_version_but_an_append_continues_it() -> None:
    store, _ = await forgotten_in_memory()
    assert store.known_version("replica-llama-1") == 0
    assert store.known_version("replica-llama-2") == 3

    late = ShardStopped(replica_id="llama-1", shard_index=0, node_id="gpu-1", exit_code=0)
    (recorded,) = await store.append("replica-llama-1", None, [NewEvent(late)], Meta(actor="t"))

    assert recorded.version == 4
    assert await store.stream_version("replica-llama-1") == 4
    assert "llama-1" not in store.state.replicas
