"""A routing table written the way the control plane writes it: events appended to the log.

``serve_replica`` records what an agent and the reconciler record when a replica comes up
on a node (placed, shard starting, shard ready, serving), so the replica appears in the
``routing_table`` view pointing at an engine that really listens on ``port`` (a simulator
the test started); ``start_replica`` records one placed, or starting, that serves not yet.
``stop_replica`` records the reconciler taking it out of routing, and
``fail_replica`` a replica placed whose engine failed as it started.
"""

from __future__ import annotations

from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    ModelScaled,
    NodeConnected,
    NodeRegistered,
    ReplicaFailed,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStopping,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    model_stream,
    node_stream,
    replica_stream,
)
from app.domain.model_spec import DEFAULT_APIS, AutoscalePolicy, ModelSpec, RoutingSettings
from app.domain.revisions import FIRST_REVISION
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore

RECONCILER = Meta(actor="reconciler")
OPERATOR = Meta(actor="alice")


async def _append(store: PostgresEventStore, stream: str, meta: Meta, *events: AnyEvent) -> None:
    await store.append_many([AppendRequest(stream, None, [NewEvent(e) for e in events])], meta)


async def declare_model(
    store: PostgresEventStore,
    model: str,
    replicas: int = 1,
    *,
    autoscale: AutoscalePolicy | None = None,
    apis: tuple[str, ...] = DEFAULT_APIS,
    routing: RoutingSettings | None = None,
) -> None:
    """Record ``model`` declared (again, when it is already: its spec changed)."""
    spec = ModelSpec(
        name=model,
        command="sim --port {port} --model {model}",
        replicas=replicas,
        autoscale=autoscale,
        apis=apis,
        routing=routing or RoutingSettings(),
    )
    await _append(store, model_stream(model), OPERATOR, ModelDeclared(model=model, spec=spec))


async def connect_node(
    store: PostgresEventStore, node_id: str, address: str, *, connected_from: str | None = None
) -> None:
    """Record ``node_id`` registered and connected, advertising ``address``; its agent's
    connection came from ``connected_from`` (``host:port``), by default from ``address``."""
    agent = Meta(actor=f"agent:{node_id}")
    if connected_from is None:
        connected_from = f"[{address}]:44300" if ":" in address else f"{address}:44300"
    await _append(
        store,
        node_stream(node_id),
        agent,
        NodeRegistered(node_id=node_id, address=address),
        NodeConnected(node_id=node_id, address=address, remote_address=connected_from),
    )


async def serve_replica(
    store: PostgresEventStore,
    model: str,
    number: int,
    node_id: str,
    port: int,
    *,
    revision: int = FIRST_REVISION,
) -> str:
    """Record replica ``<model>-<number>`` of ``revision`` serving on ``node_id`` at
    ``port``; its id."""
    replica_id = f"{model}-{number}"
    stream = replica_stream(replica_id)
    placement = ShardPlacement(index=0, node_id=node_id, gpus=(number,), port=port)
    placed = ReplicaPlaced(
        replica_id=replica_id,
        model=model,
        number=number,
        shards=(placement,),
        reason="test",
        revision=revision,
    )
    await _append(store, stream, RECONCILER, placed)
    agent = Meta(actor=f"agent:{node_id}")
    await _append(
        store,
        stream,
        agent,
        ShardStarting(replica_id=replica_id, shard_index=0, node_id=node_id, pid=None),
        ShardReady(replica_id=replica_id, shard_index=0, node_id=node_id),
    )
    await _append(store, stream, RECONCILER, ReplicaServing(replica_id=replica_id))
    return replica_id


async def start_replica(
    store: PostgresEventStore,
    model: str,
    number: int,
    node_id: str,
    port: int,
    *,
    shard_started: bool = True,
) -> str:
    """Record replica ``<model>-<number>`` placed on ``node_id`` at ``port`` and, with
    ``shard_started``, its engine starting there (loading its weights), not serving yet;
    its id."""
    replica_id = f"{model}-{number}"
    stream = replica_stream(replica_id)
    placement = ShardPlacement(index=0, node_id=node_id, gpus=(number,), port=port)
    placed = ReplicaPlaced(
        replica_id=replica_id, model=model, number=number, shards=(placement,), reason="test"
    )
    await _append(store, stream, RECONCILER, placed)
    if shard_started:
        starting = ShardStarting(replica_id=replica_id, shard_index=0, node_id=node_id, pid=None)
        await _append(store, stream, Meta(actor=f"agent:{node_id}"), starting)
    return replica_id


async def scale_to_zero(store: PostgresEventStore, model: str, replica_ids: list[str]) -> None:
    """The operator scales ``model`` to 0 and the reconciler takes its replicas out of
    routing (stopping)."""
    previous = store.state.models[model].desired
    scaled = ModelScaled(model=model, replicas=0, previous=previous)
    await _append(store, model_stream(model), OPERATOR, scaled)
    for replica_id in replica_ids:
        await stop_replica(store, replica_id, reason="scaled down to 0")


async def stop_replica(store: PostgresEventStore, replica_id: str, reason: str) -> None:
    stopping = ReplicaStopping(replica_id=replica_id, reason=reason)
    await _append(store, replica_stream(replica_id), RECONCILER, stopping)


async def fail_replica(
    store: PostgresEventStore, model: str, number: int, node_id: str, port: int, reason: str
) -> str:
    """Record replica ``<model>-<number>`` placed on ``node_id`` and failed as it started,
    for ``reason`` (the model's failure backoff starts); its id."""
    replica_id = f"{model}-{number}"
    placement = ShardPlacement(index=0, node_id=node_id, gpus=(number,), port=port)
    placed = ReplicaPlaced(
        replica_id=replica_id, model=model, number=number, shards=(placement,), reason="test"
    )
    failed = ReplicaFailed(replica_id=replica_id, reason=reason)
    await _append(store, replica_stream(replica_id), RECONCILER, placed, failed)
    return replica_id
