"""A fleet's replica history as the reconciler and the agents record it: replicas that came
up and ended, more of them than the fold keeps, and replicas serving now."""

from __future__ import annotations

from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    ReplicaFailed,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStopped,
    ShardPlacement,
    ShardReady,
    ShardStarting,
)
from app.domain.model_spec import ModelSpec
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import stream_of


def declared(model: str) -> ModelDeclared:
    spec = ModelSpec(name=model, command="sim --port {port}", replicas=0)
    return ModelDeclared(model=model, spec=spec)


def placed_and_up(model: str, number: int, node_id: str) -> list[AnyEvent]:
    """Replica ``<model>-<number>`` placed on GPU 0 of ``node_id``, and its engine up."""
    replica_id = f"{model}-{number}"
    shard = ShardPlacement(index=0, node_id=node_id, gpus=(0,), port=20000 + number)
    return [
        ReplicaPlaced(replica_id=replica_id, model=model, number=number, shards=(shard,)),
        ShardStarting(replica_id=replica_id, shard_index=0, node_id=node_id, pid=number),
        ShardReady(replica_id=replica_id, shard_index=0, node_id=node_id),
    ]


def serving(model: str, number: int, node_id: str) -> list[AnyEvent]:
    return [*placed_and_up(model, number, node_id), ReplicaServing(replica_id=f"{model}-{number}")]


def ended(model: str, number: int, node_id: str) -> list[AnyEvent]:
    """A replica that came up and ended: odd numbers failed, even ones were stopped."""
    replica_id = f"{model}-{number}"
    end: AnyEvent = (
        ReplicaFailed(replica_id=replica_id, reason="engine exited")
        if number % 2
        else ReplicaStopped(replica_id=replica_id)
    )
    return [*placed_and_up(model, number, node_id), end]


async def record_at_once(store: PostgresEventStore, events: list[AnyEvent]) -> None:
    """Append ``events`` in one append, each to its own stream, as the reconciler."""
    await store.append_many(
        [AppendRequest(stream_of(e), None, [NewEvent(e)]) for e in events],
        Meta(actor="reconciler"),
    )
