"""Stories of an operator calling a drain off (``POST /admin/v1/drains/{id}/cancel``, what
``llmgw-cli drain-cancel`` asks), on the in-memory store: what is recorded and as whose,
what a repeat and a drain that ended otherwise get, and how the drain's progress reads."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import msgspec
import pytest

from app.domain.drain import NODE_DRAIN_COMPLETE
from app.domain.drain_progress import DrainState
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    ModelDeclared,
    NodeDrainCancelled,
    NodeDrainFinished,
    ReplicaDrainCancelled,
    ReplicaPlaced,
    ReplicaServing,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    node_stream,
    replica_stream,
)
from app.domain.model_spec import ModelSpec
from app.domain.operation_results import InvalidOperation, UnknownDrain
from app.domain.state import ReplicaPhase
from app.services.agent_reports import ReportRecorder
from app.services.operations import Caller, Operations
from app.store.interface import NewEvent
from app.store.memory import InMemoryEventStore
from tests.unit.test_services_in_memory import hello

ALICE = Caller(actor="alice", request_id="req-1")
BOB = Caller(actor="bob", request_id="req-2")
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
RECONCILER = Meta(actor="reconciler")


async def node_draining() -> tuple[InMemoryEventStore, Operations, str]:
    store = InMemoryEventStore()
    operations = Operations(store, clock=lambda: T0)
    await ReportRecorder(store).handle(hello("gpu-1"))
    drain_id = (await operations.drain_node(ALICE, "gpu-1", 600)).drain_id
    return store, operations, drain_id


async def finished(store: InMemoryEventStore, drain_id: str, outcome: str, ok: bool) -> None:
    """The reconciler's pass finishes the drain."""
    done = NodeDrainFinished(node_id="gpu-1", drain_id=drain_id, outcome=outcome, succeeded=ok)
    meta = Meta(actor="reconciler", correlation_id=drain_id)
    await store.append(node_stream("gpu-1"), None, [NewEvent(done)], meta)


async def serving_replica(store: InMemoryEventStore) -> None:
    """Node gpu-1 connected, and replica llama-1 of model llama serving on it."""
    await ReportRecorder(store).handle(hello("gpu-1"))
    spec = ModelSpec(name="llama", command="sim --port {port}", replicas=1)
    shard = ShardPlacement(index=0, node_id="gpu-1", gpus=(0,), port=20001)
    await store.append(
        "model-llama", None, [NewEvent(ModelDeclared(model="llama", spec=spec))], RECONCILER
    )
    serving = [
        ReplicaPlaced(replica_id="llama-1", model="llama", number=1, shards=(shard,)),
        ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1", pid=7),
        ShardReady(replica_id="llama-1", shard_index=0, node_id="gpu-1"),
        ReplicaServing(replica_id="llama-1"),
    ]
    await store.append(replica_stream("llama-1"), None, [NewEvent(e) for e in serving], RECONCILER)


async def test_a_node_drain_s_cancellation_is_recorded_as_the_operator_s_and_a_repeat_is_not() -> (
    None
):
    store, operations, drain_id = await node_draining()

    assert await operations.cancel_drain(BOB, drain_id) is True
    assert await operations.cancel_drain(BOB, drain_id) is False

    [recorded] = [r for r in await store.read_all() if isinstance(r.event, NodeDrainCancelled)]
    assert recorded.event == NodeDrainCancelled(node_id="gpu-1", drain_id=drain_id)
    assert (recorded.meta.actor, recorded.meta.correlation_id) == ("bob", drain_id)
    progress = await operations.drain(drain_id)
    assert progress.state is DrainState.RUNNING  # until the reconciler's pass finishes it


async def test_a_node_drain_finished_as_cancelled_reads_so_and_a_late_repeat_changes_nothing() -> (
    None
):
    store, operations, drain_id = await node_draining()
    await operations.cancel_drain(BOB, drain_id)
    await finished(store, drain_id, "cancelled by bob", ok=False)

    progress = await operations.drain(drain_id)

    assert (progress.state, progress.finished) == (DrainState.CANCELLED, True)
    assert progress.outcome == "cancelled by bob"
    assert await operations.cancel_drain(ALICE, drain_id) is False
    assert (await operations.current()).nodes["gpu-1"].cordoned


async def test_a_drain_that_ended_otherwise_is_refused_with_how_it_ended() -> None:
    store, operations, drain_id = await node_draining()
    await finished(store, drain_id, NODE_DRAIN_COMPLETE, ok=True)
    before = len(await store.read_all())

    with pytest.raises(InvalidOperation) as refused:
        await operations.cancel_drain(BOB, drain_id)

    assert str(refused.value) == (
        f"drain {drain_id} cannot be cancelled: it succeeded: every replica moved "
        f"(llmgw-cli drain-progress {drain_id})"
    )
    assert len(await store.read_all()) == before
    assert (await operations.drain(drain_id)).state is DrainState.SUCCEEDED


async def test_an_unknown_drain_and_an_id_that_is_not_a_drain_s_are_unknown() -> None:
    _, operations, _ = await node_draining()
    carol = Caller(actor="carol", request_id="req-apply")
    await operations.apply_model(carol, ModelSpec(name="qwen", command="sim --port {port}"))

    with pytest.raises(UnknownDrain):
        await operations.cancel_drain(BOB, "drain-ffffffff")
    with pytest.raises(UnknownDrain):
        await operations.cancel_drain(BOB, "req-apply")  # a model's change, not a drain


async def test_a_rollout_s_id_is_refused_saying_how_to_steer_the_rollout() -> None:
    _, operations, _ = await node_draining()
    spec = ModelSpec(name="qwen", command="sim --port {port}", replicas=1)
    await operations.apply_model(ALICE, spec)
    await operations.apply_model(ALICE, msgspec.structs.replace(spec, command="sim2 --port {port}"))
    rollout_id = await operations.rollout_id("qwen")
    assert rollout_id is not None

    with pytest.raises(InvalidOperation) as refused:
        await operations.cancel_drain(BOB, rollout_id)

    assert str(refused.value) == (
        f"{rollout_id} is a rollout of model qwen, not a drain: its moves end with it; pause "
        "it (llmgw-cli rollout pause qwen) or undo it (llmgw-cli rollout undo qwen)"
    )


async def test_a_replica_drain_is_called_off_at_once_and_its_replica_serves_on() -> None:
    store = InMemoryEventStore()
    operations = Operations(store, clock=lambda: T0)
    await serving_replica(store)
    drain_id = await operations.drain_replica(ALICE, "llama-1")

    assert await operations.cancel_drain(BOB, drain_id) is True

    replica = await operations.replica("llama-1")
    assert (replica.phase, replica.drain_id) == (ReplicaPhase.SERVING, None)
    [called_off] = [r for r in await store.read_all() if isinstance(r.event, ReplicaDrainCancelled)]
    assert (called_off.meta.actor, called_off.meta.correlation_id) == ("bob", drain_id)
    progress = await operations.drain(drain_id)
    assert (progress.state, progress.outcome) == (DrainState.CANCELLED, "cancelled by bob")
    assert await operations.cancel_drain(BOB, drain_id) is False


class SlowReadingStore(InMemoryEventStore):
    """The in-memory store whose answers to a read of a drain's events take a turn of the
    loop to arrive, as PostgreSQL's do: another request's cancellation can land meanwhile."""

    async def read_correlated(
        self, correlation_id: str, limit: int = 1000, *, newest: bool = False
    ) -> list[Recorded]:
        answer = await super().read_correlated(correlation_id, limit, newest=newest)
        await asyncio.sleep(0)
        return answer


async def test_two_cancels_of_a_replica_drain_at_once_record_one_the_other_changes_nothing() -> (
    None
):
    store = SlowReadingStore()
    operations = Operations(store, clock=lambda: T0)
    await serving_replica(store)
    drain_id = await operations.drain_replica(ALICE, "llama-1")

    answers = await asyncio.gather(
        operations.cancel_drain(ALICE, drain_id), operations.cancel_drain(BOB, drain_id)
    )

    assert sorted(answers) == [False, True]  # as one after the other: the second is a repeat
    called_off = [r for r in await store.read_all() if isinstance(r.event, ReplicaDrainCancelled)]
    assert len(called_off) == 1


async def test_two_cancels_of_a_node_drain_at_once_record_one_the_other_changes_nothing() -> None:
    store = SlowReadingStore()
    operations = Operations(store, clock=lambda: T0)
    await ReportRecorder(store).handle(hello("gpu-1"))
    drain_id = (await operations.drain_node(ALICE, "gpu-1", 600)).drain_id

    answers = await asyncio.gather(
        operations.cancel_drain(ALICE, drain_id), operations.cancel_drain(BOB, drain_id)
    )

    assert sorted(answers) == [False, True]
    cancelled = [r for r in await store.read_all() if isinstance(r.event, NodeDrainCancelled)]
    assert len(cancelled) == 1
