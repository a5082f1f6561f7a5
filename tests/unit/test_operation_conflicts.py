"""Stories of two operators changing one thing at the same moment, on the in-memory store:
the one whose change lost the race is refused (409 ``conflict``) with what it met, whose
change and what it did, and nothing of it is recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    ApiKeyCreated,
    ModelDeclared,
    NodeDrainRequested,
    ReplicaPlaced,
    ReplicaServing,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    model_stream,
    replica_stream,
)
from app.domain.model_spec import ModelSpec
from app.domain.node_operations import NodeDrain
from app.domain.operation_results import NoRoomToDrain
from app.services.agent_reports import ReportRecorder
from app.services.conflicts import ChangeConflict, conflict_met
from app.services.operations import Caller, NewKey, Operations
from app.store.errors import ConcurrencyError
from app.store.interface import AppendRequest, NewEvent, StillHolds
from app.store.memory import InMemoryEventStore
from tests.unit.test_services_in_memory import hello

ALICE = Caller(actor="alice", request_id="req-alice")
BOB = Caller(actor="bob", request_id="req-bob")


class SlowWritingStore(InMemoryEventStore):
    """The in-memory store whose appends take a turn of the loop to reach the log, as
    PostgreSQL's do: another request decides on the same log meanwhile."""

    async def append_many(
        self,
        requests: Sequence[AppendRequest],
        meta: Meta,
        *,
        still_holds: StillHolds | None = None,
    ) -> list[Recorded]:
        await asyncio.sleep(0)
        return await super().append_many(requests, meta, still_holds=still_holds)


async def one_replica_on_each_of_two_nodes_and_room_for_one_on_a_third(
    store: InMemoryEventStore,
) -> None:
    """gpu-1, gpu-2 and gpu-3 with two GPUs each; llama's replicas take two: llama-1 on
    gpu-1, llama-2 on gpu-2, and gpu-3 has room for one of them."""
    for node in ("gpu-1", "gpu-2", "gpu-3"):
        await ReportRecorder(store).handle(hello(node))
    spec = ModelSpec(name="llama", command="sim --port {port}", replicas=2, gpus_per_shard=2)
    reconciler = Meta(actor="reconciler")
    await store.append(
        model_stream("llama"), None, [NewEvent(ModelDeclared(model="llama", spec=spec))], reconciler
    )
    for n in (1, 2):
        replica_id = f"llama-{n}"
        shard = ShardPlacement(index=0, node_id=f"gpu-{n}", gpus=(0, 1), port=20000)
        serving = [
            ReplicaPlaced(replica_id=replica_id, model="llama", number=n, shards=(shard,)),
            ShardStarting(replica_id=replica_id, shard_index=0, node_id=f"gpu-{n}", pid=7),
            ShardReady(replica_id=replica_id, shard_index=0, node_id=f"gpu-{n}"),
            ReplicaServing(replica_id=replica_id),
        ]
        await store.append(
            replica_stream(replica_id), None, [NewEvent(e) for e in serving], reconciler
        )


async def test_the_scale_that_lost_the_race_names_the_scale_it_met_and_records_nothing() -> None:
    store = SlowWritingStore()
    operations = Operations(store)
    await operations.apply_model(ALICE, ModelSpec(name="llama", command="sim --port {port}"))
    before = len(await store.read_all())

    answers = await asyncio.gather(
        operations.scale(ALICE, "llama", 3),
        operations.scale(BOB, "llama", 5),
        return_exceptions=True,
    )

    [won] = [a for a in answers if a is True]
    [lost] = [a for a in answers if isinstance(a, BaseException)]
    assert won is True
    assert isinstance(lost, ChangeConflict)
    [met] = lost.met
    assert (met.meta.actor, met.position) == ("alice", before + 1)
    assert str(lost) == (
        "another change came first: model llama scaled from 1 to 3 replica(s) (by alice, "
        f"position {before + 1}); nothing was written: send it again to "
        "decide on the cluster as it is now"
    )
    assert len(await store.read_all()) == before + 1
    assert (await operations.current()).models["llama"].spec.replicas == 3


async def test_a_conflict_names_the_newest_changes_it_met_and_counts_the_earlier() -> None:
    store = InMemoryEventStore()
    operations = Operations(store)
    await operations.apply_model(ALICE, ModelSpec(name="llama", command="sim --port {port}"))
    version = store.known_version("model-llama")
    for count in (2, 3, 4, 5):
        await operations.scale(BOB, "llama", count)
    lost = ConcurrencyError("model-llama", version, version + 4)
    conflict = await conflict_met(store, lost)

    assert [r.meta.actor for r in conflict.met] == ["bob"] * 3
    assert str(conflict).startswith(
        "4 other changes came first, the newest 3: model llama scaled from 2 to 3 replica(s) "
        "(by bob, position "
    )


async def test_two_drains_that_require_room_for_one_at_once_record_only_one() -> None:
    store = SlowWritingStore()
    operations = Operations(store)
    await one_replica_on_each_of_two_nodes_and_room_for_one_on_a_third(store)

    answers = await asyncio.gather(
        operations.drain_node(ALICE, "gpu-1", 600, require_room=True),
        operations.drain_node(BOB, "gpu-2", 600, require_room=True),
        return_exceptions=True,
    )

    [accepted] = [a for a in answers if isinstance(a, NodeDrain)]
    [refused] = [a for a in answers if isinstance(a, BaseException)]
    assert isinstance(refused, ChangeConflict), refused
    [met] = refused.met
    assert isinstance(met.event, NodeDrainRequested)
    assert met.event.drain_id == accepted.drain_id
    requested = [r for r in await store.read_all() if isinstance(r.event, NodeDrainRequested)]
    assert len(requested) == 1
    # Sent again, it is decided beside the first drain, as one after the other would be.
    other = "gpu-2" if met.event.node_id == "gpu-1" else "gpu-1"
    with pytest.raises(NoRoomToDrain):
        await operations.drain_node(BOB, other, 600, require_room=True)


async def test_two_drains_at_once_that_do_not_require_room_are_both_recorded() -> None:
    store = SlowWritingStore()
    operations = Operations(store)
    await one_replica_on_each_of_two_nodes_and_room_for_one_on_a_third(store)

    await asyncio.gather(
        operations.drain_node(ALICE, "gpu-1", 600), operations.drain_node(BOB, "gpu-2", 600)
    )

    requested = [r for r in await store.read_all() if isinstance(r.event, NodeDrainRequested)]
    assert len(requested) == 2


async def test_two_control_planes_creating_a_key_of_one_name_at_once_record_one() -> None:
    # Each control plane serving the admin API makes its own creations one at a time; a
    # leader and a standby share only the log.
    store = SlowWritingStore()
    leader, standby = Operations(store), Operations(store)

    answers = await asyncio.gather(
        leader.create_key(ALICE, "ci", ["*"]),
        standby.create_key(BOB, "ci", ["*"]),
        return_exceptions=True,
    )

    [created] = [a for a in answers if isinstance(a, NewKey)]
    [refused] = [a for a in answers if isinstance(a, BaseException)]
    assert isinstance(refused, ChangeConflict), refused
    [met] = refused.met
    assert isinstance(met.event, ApiKeyCreated)
    assert met.event.key_id == created.record.id
    keys = [r for r in await store.read_all() if isinstance(r.event, ApiKeyCreated)]
    assert len(keys) == 1
