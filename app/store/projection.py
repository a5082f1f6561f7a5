"""From ``ClusterState`` to table rows.

The projector folds events with the domain's ``evolve`` and then writes, for every entity
an event touched, the row that entity now maps to (or deletes it). The same row functions
produce the expected tables in ``projections rebuild --verify``, so the SQL tables and the
in-memory state are two renderings of one fold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from app.domain.envelope import Recorded
from app.domain.events import EndedReplicasForgotten, GpuInfo, subjects
from app.domain.evolve import evolve
from app.domain.gpu_cordons import cordon_of
from app.domain.state import (
    ApiKey,
    CertificateRevocation,
    ClusterState,
    Model,
    Node,
    Replica,
    revocation_key,
)

Row = dict[str, Any]


class Touched(msgspec.Struct):
    """Keys of the entities a batch of events may have changed."""

    models: set[str] = msgspec.field(default_factory=set)
    nodes: set[str] = msgspec.field(default_factory=set)
    replicas: set[str] = msgspec.field(default_factory=set)
    keys: set[str] = msgspec.field(default_factory=set)
    revocations: set[str] = msgspec.field(default_factory=set)
    """Revocations have no table, but an undone fold must put them back too: a node's
    whole-node revocation and a certificate's, filed as ``revocation_key`` files them."""

    def add(self, recorded: Recorded, state: ClusterState) -> None:
        # Touching an entity the event did not change costs nothing: only entities that
        # differ from the undo record get their rows written (``changes_for``).
        about = subjects(recorded.event)
        if about.model is not None:
            self.models.add(about.model)
        if about.node is not None:
            self.nodes.add(about.node)
            self.revocations.add(revocation_key(None, about.node))  # a whole node's
        if about.replica is not None:
            self.replicas.add(about.replica)
            replica = state.replicas.get(about.replica)
            if replica is not None:  # its model counts failures and replica numbers
                self.models.add(replica.model)
        if about.key is not None:
            self.keys.add(about.key)
        if isinstance(recorded.event, EndedReplicasForgotten):
            # The replicas it makes the fold forget, for an undo to put back: those of a
            # model the state did not know when they ended are not among its ``ended``. Their
            # rows are deleted by ``llmgw_append`` itself, with those of the replicas the fold
            # forgot before (migration 0020): none is written here.
            model = recorded.event.model
            self.replicas.update(
                r.id for r in state.replicas.values() if r.model == model and r.ended_at
            )
        if about.certificate is not None:
            self.revocations.add(revocation_key(about.certificate, None))


class RowChanges(msgspec.Struct):
    """The rows of every touched entity, to replace what the tables hold for those keys."""

    touched: dict[str, list[str]]
    rows: dict[str, list[Row]]


def model_row(model: Model) -> Row:
    spec = model.spec
    canary = model.canary
    return {
        "name": model.name,
        "engine": spec.engine,
        "command": spec.command,
        "gpus_per_shard": spec.gpus_per_shard,
        "gpu_memory_gib": float(spec.gpu_memory_gib),
        "shards_per_replica": spec.shards_per_replica,
        "desired_replicas": model.desired,
        "removed": model.removed,
        "weight": float(spec.routing.weight),
        "target_waiting": spec.routing.target_waiting,
        "kv_ceiling": float(spec.routing.kv_ceiling),
        "spec": msgspec.to_builtins(spec),
        "replicas_created": model.replicas_created,
        "unplaceable_reason": model.unplaceable_reason,
        "tuned_summary": model.tuned_summary,
        "declared_at": model.declared_at,
        "failures": model.failures,
        "backoff_until": model.backoff_until,
        "revision": model.revision,
        # While a canary step runs: its revision and the share of requests it gets.
        "canary_revision": canary[0] if canary else None,
        "canary_traffic": float(canary[1]) if canary else None,
    }


def node_row(node: Node) -> Row:
    return {
        "id": node.id,
        "address": node.address,
        "remote_address": node.remote_address,
        "labels": dict(node.labels),
        "gpus": _gpu_rows(node),
        "gpu_count": len(node.gpus),
        "healthy_gpu_count": sum(1 for gpu in node.gpus if gpu.healthy),
        "agent_version": node.agent_version,
        "port_lo": node.port_range[0],
        "port_hi": node.port_range[1],
        "connected": node.connected,
        "lost": node.lost,
        "cordoned": node.cordoned,
        "cordon_reason": node.cordon_reason,
        "drain_id": node.drain_id,
        "drain_grace_s": node.drain_grace_s,
        "drain_requested_at": node.drain_requested_at,
        "registered_at": node.registered_at,
        "last_change_at": node.last_change_at,
    }


class GpuRow(GpuInfo, frozen=True, kw_only=True):
    """A GPU of the ``nodes`` table's ``gpus`` column: as its node lists it, with its
    operator's cordon. Rows written before GPUs could be cordoned lack the cordon's keys,
    and read as not cordoned."""

    cordoned: bool = False
    cordon_reason: str | None = None
    cordoned_by: str | None = None


def _gpu_rows(node: Node) -> list[Any]:
    rows: list[Any] = []
    for gpu in node.gpus:
        cordon = cordon_of(node, gpu)
        row = GpuRow(
            **msgspec.structs.asdict(gpu),
            cordoned=cordon is not None,
            cordon_reason=cordon.reason if cordon is not None else None,
            cordoned_by=cordon.by if cordon is not None else None,
        )
        rows.append(msgspec.to_builtins(row))
    return rows


def replica_row(replica: Replica) -> Row:
    routing = replica.routing
    return {
        "id": replica.id,
        "model": replica.model,
        "number": replica.number,
        "phase": replica.phase.value,
        "routable": replica.routable,
        "placed_at": replica.placed_at,
        "reason": replica.reason,
        "replaces": replica.replaces,
        "starting_since": replica.starting_since,
        "serving_since": replica.serving_since,
        "drain_id": replica.drain_id,
        "drain_started_at": replica.drain_started_at,
        "replacement_id": replica.replacement_id,
        "ended_at": replica.ended_at,
        "end_reason": replica.end_reason,
        "weight": float(routing.weight) if routing else None,
        "target_waiting": routing.target_waiting if routing else None,
        "kv_ceiling": float(routing.kv_ceiling) if routing else None,
        "revision": replica.revision,
    }


def shard_rows(replica: Replica) -> list[Row]:
    return [
        {
            "replica_id": replica.id,
            "shard_index": shard.index,
            "node_id": shard.node_id,
            "gpus": list(shard.gpus),
            "port": shard.port,
            "phase": shard.phase.value,
            "pid": shard.pid,
            "came_up": shard.came_up,
            "error": shard.error,
            "exit_code": shard.exit_code,
            "log_tail": list(shard.log_tail),
        }
        for shard in replica.shards
    ]


def key_row(key: ApiKey) -> Row:
    return {
        "id": key.id,
        "name": key.name,
        "prefix": key.prefix,
        "secret_hash": key.secret_hash,
        "models": list(key.models),
        "rpm": key.rpm,
        "tpm": key.tpm,
        "created_at": key.created_at,
        "created_by": key.created_by,
        "revoked_at": key.revoked_at,
        "revoked_by": key.revoked_by,
        "expires_at": key.expires_at,
    }


def all_rows(state: ClusterState) -> dict[str, list[Row]]:
    """Every projection row the state maps to, keyed by table name: with the replicas the
    fold forgot as they were then, when it kept them (``state.forgotten``)."""
    replicas = {r.id: r for r in state.forgotten or ()}
    replicas.update(state.replicas)
    return {
        "models": [model_row(m) for m in state.models.values()],
        "nodes": [node_row(n) for n in state.nodes.values()],
        "replicas": [replica_row(r) for r in replicas.values()],
        "shards": [row for r in replicas.values() for row in shard_rows(r)],
        "api_keys": [key_row(k) for k in state.keys.values()],
    }


def fold(state: ClusterState, batch: Sequence[Recorded]) -> tuple[RowChanges, Undo]:
    """Evolve ``state`` by ``batch``; return the row changes that mirror it, and what undoes
    it (for an append that does not commit)."""
    touched = Touched()
    for recorded in batch:
        touched.add(recorded, state)
    undo = Undo.take(state, touched)
    for recorded in batch:
        evolve(state, recorded)
    return changes_for(state, undo), undo


def changes_for(state: ClusterState, before: Undo) -> RowChanges:
    """Rows of the entities that changed. Entities are frozen and replaced when an event
    changes them, so an entity still identical to its undo record needs no row written."""
    models = _changed(state.models, before.models)
    nodes = _changed(state.nodes, before.nodes)
    replicas = [
        state.replicas[k] for k in _changed(state.replicas, before.replicas) if k in state.replicas
    ]
    # A replica the fold forgot keeps the rows it had then, as a rebuild writes them: one the
    # batch changed (or placed) before forgetting it gets them written as the fold last held
    # it; one forgotten as it was is not touched.
    forgotten = {r.id: r for r in state.forgotten or ()}
    replicas += [
        replica
        for replica_id, replica in sorted(forgotten.items())
        if replica_id not in state.replicas and before.replicas.get(replica_id) is not replica
    ]
    replica_ids = [r.id for r in replicas]
    keys = _changed(state.keys, before.keys)
    return RowChanges(
        touched={"models": models, "nodes": nodes, "replicas": replica_ids, "api_keys": keys},
        rows={
            "models": [model_row(state.models[k]) for k in models if k in state.models],
            "nodes": [node_row(state.nodes[k]) for k in nodes if k in state.nodes],
            "replicas": [replica_row(r) for r in replicas],
            "shards": [row for r in replicas for row in shard_rows(r)],
            "api_keys": [key_row(state.keys[k]) for k in keys if k in state.keys],
        },
    )


def _changed(now: dict[str, Any], before: dict[str, Any]) -> list[str]:
    return sorted(key for key, old in before.items() if now.get(key) is not old)


class Undo(msgspec.Struct):
    """The entities a batch is about to touch, as they were: restoring it undoes a fold
    whose append did not commit."""

    position: int
    models: dict[str, Model | None]
    nodes: dict[str, Node | None]
    replicas: dict[str, Replica | None]
    keys: dict[str, ApiKey | None]
    revocations: dict[str, CertificateRevocation | None]

    @classmethod
    def take(cls, state: ClusterState, touched: Touched) -> Undo:
        models = {k: state.models.get(k) for k in touched.models}
        # An end can make the fold forget the replica of the model that ended first: the
        # replicas each touched model keeps as ended are saved too (a few ids per model).
        kept = {i for m in models.values() if m is not None for i in m.ended}
        return cls(
            position=state.position,
            models=models,
            nodes={k: state.nodes.get(k) for k in touched.nodes},
            replicas={k: state.replicas.get(k) for k in touched.replicas | kept},
            keys={k: state.keys.get(k) for k in touched.keys},
            revocations={k: state.revocations.get(k) for k in touched.revocations},
        )

    def restore(self, state: ClusterState) -> None:
        state.position = self.position
        _restore(state.models, self.models)
        _restore(state.nodes, self.nodes)
        _restore(state.replicas, self.replicas)
        _restore(state.keys, self.keys)
        _restore(state.revocations, self.revocations)


def _restore(entities: dict[str, Any], saved: dict[str, Any]) -> None:
    for key, value in saved.items():
        if value is None:
            entities.pop(key, None)
        else:
            entities[key] = value
