"""Stories of the fold, and the property that an incremental projection equals a replay."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import get_type_hints

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.domain.changes import GpuChanges, ModelChanges, NodeChanges, ReplicaChanges, ShardChanges
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    ApiKeyCreated,
    ApiKeyRevoked,
    CertificateRevoked,
    EndedReplicasForgotten,
    GpuInfo,
    GpuMarkedUnhealthy,
    GpuRecovered,
    IdentityRejected,
    ModelDeclared,
    ModelRemoved,
    ModelScaled,
    ModelTuned,
    NodeConnected,
    NodeDrainRequested,
    NodeUncordoned,
    ReplicaDrainStarted,
    ReplicaLost,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStartupTimedOut,
    ReplicaStopped,
    ReplicaStopping,
    ShardFailed,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    ShardStopped,
)
from app.domain.evolve import replay
from app.domain.model_spec import ModelSpec
from app.domain.state import (
    ENDED_PHASES,
    ClusterState,
    Model,
    Node,
    Replica,
    ReplicaPhase,
    Shard,
    ShardPhase,
)
from app.store.projection import Row, all_rows, fold
from app.store.tables import PROJECTION_TABLES
from tests.support.generators import events, histories, stream_for

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def log_of(*items: AnyEvent, actor: str = "alice") -> list[Recorded]:
    return [
        Recorded(
            position=n,
            stream=stream_for(event),
            version=n,
            event_id=uuid.uuid4(),
            recorded_at=T0 + timedelta(seconds=n),
            meta=Meta(actor=actor),
            event=event,
        )
        for n, event in enumerate(items, start=1)
    ]


SPEC = ModelSpec(name="llama", command="sim --port {port}", replicas=2)
GPU = GpuInfo(index=0, uuid="GPU-0", name="H100", memory_total_mib=81559)
PLACED = ReplicaPlaced(
    replica_id="llama-1",
    model="llama",
    number=1,
    shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(0,), port=20000),),
)


def test_a_replica_goes_from_placed_to_serving_to_stopped() -> None:
    state = replay(
        log_of(
            ModelDeclared(model="llama", spec=SPEC),
            PLACED,
            ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1", pid=101),
            ShardReady(replica_id="llama-1", shard_index=0, node_id="gpu-1"),
            ReplicaServing(replica_id="llama-1"),
        )
    )
    replica = state.replicas["llama-1"]
    assert replica.phase is ReplicaPhase.SERVING
    assert replica.routable
    assert replica.starting_since == T0 + timedelta(seconds=3)
    assert replica.shards[0].phase is ShardPhase.READY
    assert state.models["llama"].replicas_created == 1

    later = replay(
        log_of(
            ReplicaDrainStarted(replica_id="llama-1", drain_id="d-1"),
            ReplicaStopping(replica_id="llama-1", reason="drain d-1"),
            ReplicaStopped(replica_id="llama-1"),
        ),
        state,
    )
    assert later.replicas["llama-1"].phase is ReplicaPhase.STOPPED
    assert not later.replicas["llama-1"].routable


def test_a_timed_out_replica_keeps_its_log_tail_and_says_why() -> None:
    state = replay(
        log_of(
            ModelDeclared(model="llama", spec=SPEC),
            PLACED,
            ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1"),
            ShardFailed(
                replica_id="llama-1",
                shard_index=0,
                node_id="gpu-1",
                error="exit 1",
                log_tail=("CUDA OOM",),
            ),
            ReplicaStartupTimedOut(replica_id="llama-1", timeout_s=120, waited_s=121),
        )
    )
    replica = state.replicas["llama-1"]
    assert replica.phase is ReplicaPhase.TIMED_OUT
    assert replica.end_reason == "timed out starting after 121s (limit 120s)"
    assert replica.shards[0].log_tail == ("CUDA OOM",)


def test_an_engine_stopped_before_it_was_ready_leaves_its_log_tail_on_the_shard() -> None:
    state = replay(
        log_of(
            ModelDeclared(model="llama", spec=SPEC),
            PLACED,
            ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1"),
            ReplicaStartupTimedOut(replica_id="llama-1", timeout_s=120, waited_s=121),
            ShardStopped(
                replica_id="llama-1", shard_index=0, node_id="gpu-1", log_tail=("loading",)
            ),
        )
    )

    assert state.replicas["llama-1"].shards[0].phase is ShardPhase.STOPPED
    assert state.replicas["llama-1"].shards[0].log_tail == ("loading",)


def test_a_stop_without_a_log_tail_keeps_the_one_a_failure_reported() -> None:
    state = replay(
        log_of(
            ModelDeclared(model="llama", spec=SPEC),
            PLACED,
            ShardFailed(
                replica_id="llama-1",
                shard_index=0,
                node_id="gpu-1",
                error="exit 1",
                log_tail=("CUDA OOM",),
            ),
            ShardStopped(replica_id="llama-1", shard_index=0, node_id="gpu-1"),
        )
    )

    assert state.replicas["llama-1"].shards[0].log_tail == ("CUDA OOM",)


SERVING = (
    ModelDeclared(model="llama", spec=SPEC),
    PLACED,
    ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1", pid=101),
    ShardReady(replica_id="llama-1", shard_index=0, node_id="gpu-1"),
    ReplicaServing(replica_id="llama-1"),
)


def test_a_lost_replica_s_shards_say_lost_not_ready_in_the_state_and_the_projection() -> None:
    state = replay(
        log_of(*SERVING, ReplicaLost(replica_id="llama-1", reason="node gpu-1 lost after 61s"))
    )

    shard = state.replicas["llama-1"].shards[0]
    assert shard.phase is ShardPhase.LOST
    assert shard.pid == 101, "the last pid it had is kept, for the record"
    (row,) = all_rows(state)["shards"]
    assert row["phase"] == "lost"


def test_a_shard_its_agent_stopped_on_purpose_takes_its_replica_back_to_placed() -> None:
    stop = ShardStopped(
        replica_id="llama-1", shard_index=0, node_id="gpu-1", reason="agent shutting down"
    )
    state = replay(log_of(*SERVING, stop))

    replica = state.replicas["llama-1"]
    assert (replica.phase, replica.routable, replica.serving_since) == (
        ReplicaPhase.PLACED,
        False,
        None,
    )
    assert replica.shards[0].phase is ShardPhase.STOPPED
    assert replica.shards[0].stop_reason == "agent shutting down"
    assert replica.agent_stopped_at == T0 + timedelta(seconds=6)

    again = replay(
        log_of(
            ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1", pid=202),
            ShardReady(replica_id="llama-1", shard_index=0, node_id="gpu-1"),
            ReplicaServing(replica_id="llama-1"),
        ),
        state,
    )
    replica = again.replicas["llama-1"]
    assert (replica.phase, replica.routable, replica.agent_stopped_at) == (
        ReplicaPhase.SERVING,
        True,
        None,
    )
    assert replica.shards[0].stop_reason is None


def test_replica_numbers_are_never_reused_even_after_a_model_is_removed() -> None:
    state = replay(
        log_of(
            ModelDeclared(model="llama", spec=SPEC),
            PLACED,
            ModelRemoved(model="llama"),
            ModelDeclared(model="llama", spec=SPEC),
        )
    )
    assert state.models["llama"].replicas_created == 1
    assert not state.models["llama"].removed


def test_scaling_tuning_and_removal_change_what_the_model_asks_for() -> None:
    state = replay(
        log_of(
            ModelDeclared(model="llama", spec=SPEC),
            ModelScaled(model="llama", replicas=5, previous=2),
            ModelTuned(model="llama", weight=2.5, target_waiting=8, kv_ceiling=0.9),
        )
    )
    model = state.models["llama"]
    assert model.desired == 5
    assert model.spec.routing.target_waiting == 8
    assert replay(log_of(ModelRemoved(model="llama")), state).models["llama"].desired == 0


def test_nodes_drain_and_gpus_fail_and_recover() -> None:
    connected = NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=(GPU,))
    state = replay(
        log_of(
            connected,
            GpuMarkedUnhealthy(node_id="gpu-1", gpu_index=0, reason="XID 79", xid=79),
            NodeDrainRequested(node_id="gpu-1", drain_id="d-1", grace_s=600),
        )
    )
    node = state.nodes["gpu-1"]
    assert node.connected
    assert node.cordoned
    assert node.drain_id == "d-1"
    assert node.gpus[0].unhealthy_reason == "XID 79"

    state = replay(
        log_of(GpuRecovered(node_id="gpu-1", gpu_index=0), NodeUncordoned(node_id="gpu-1")), state
    )
    assert state.nodes["gpu-1"].gpus[0].healthy
    assert not state.nodes["gpu-1"].cordoned


def test_a_rejected_identity_changes_nothing() -> None:
    state = replay(
        log_of(
            IdentityRejected(
                claimed_node_id="gpu-2",
                certificate_subject="CN=gpu-1,OU=node",
                remote_address="127.0.0.9",
                reason="certificate is for gpu-1",
            )
        )
    )
    assert state.nodes == {}


def test_keys_remember_who_created_and_revoked_them() -> None:
    created = log_of(
        ApiKeyCreated(key_id="k1", name="ci", prefix="llmgw_ab", secret_hash="h", models=("llama",))
    )
    state = replay(created)
    state = replay(log_of(ApiKeyRevoked(key_id="k1"), actor="bob"), state)
    key = state.keys["k1"]
    assert key.created_by == "alice"
    assert key.revoked_by == "bob"


@settings(max_examples=60, deadline=None)
@given(histories(st.lists(st.lists(events(), min_size=1, max_size=5), max_size=15)))
def test_an_incremental_projection_equals_a_replay(batches: list[list[AnyEvent]]) -> None:
    """Replicas the fold forgets keep the rows they had (the replay keeps them aside)."""
    tables: dict[str, dict[str, Row]] = {t.name: {} for t in PROJECTION_TABLES}
    state = ClusterState()
    log: list[Recorded] = []
    for batch in batches:
        recorded = log_of(*batch)
        recorded = [
            Recorded(
                position=len(log) + n,
                stream=r.stream,
                version=r.version,
                event_id=r.event_id,
                recorded_at=r.recorded_at,
                meta=r.meta,
                event=r.event,
            )
            for n, r in enumerate(recorded, start=1)
        ]
        log += recorded
        changes, _ = fold(state, recorded)
        for forgetting in (r.event for r in recorded):
            if isinstance(forgetting, EndedReplicasForgotten):  # as llmgw_append deletes them
                _delete_forgotten_rows(tables, forgetting)
        for table, keys in changes.touched.items():
            for key in keys:
                tables[table].pop(key, None)
        for owner in changes.touched["replicas"]:
            tables["shards"] = {
                k: v for k, v in tables["shards"].items() if v["replica_id"] != owner
            }
        for table, rows in changes.rows.items():
            for row in rows:
                tables[table][_key(table, row)] = row

    replayed = ClusterState()
    replayed.forgotten = []
    rebuilt = all_rows(replay(log, replayed))
    assert {t: sorted(map(repr, rows.values())) for t, rows in tables.items()} == {
        t: sorted(map(repr, rows)) for t, rows in rebuilt.items()
    }


def _delete_forgotten_rows(
    tables: dict[str, dict[str, Row]], event: EndedReplicasForgotten
) -> None:
    """What ``llmgw_append`` deletes for ``event`` (migration 0020): the rows of the model's
    replicas that ended at or before its cutoff, with their shards."""
    before = event.before if event.before.tzinfo else event.before.replace(tzinfo=UTC)
    ended = {p.value for p in ENDED_PHASES}
    gone = {
        key
        for key, row in tables["replicas"].items()
        if row["model"] == event.model
        and row["phase"] in ended
        and row["ended_at"] is not None
        and row["ended_at"] <= before
    }
    tables["replicas"] = {k: v for k, v in tables["replicas"].items() if k not in gone}
    tables["shards"] = {k: v for k, v in tables["shards"].items() if v["replica_id"] not in gone}


def _parts(state: ClusterState) -> tuple[object, ...]:
    return (
        state.position,
        dict(state.nodes),
        dict(state.models),
        dict(state.replicas),
        dict(state.keys),
        dict(state.revocations),
    )


@settings(max_examples=40, deadline=None)
@given(
    histories(st.lists(st.lists(events(), min_size=1, max_size=5), max_size=8)),
    st.lists(events(), min_size=1, max_size=5),
)
@example([], [CertificateRevoked(node_id="gpu-1", reason="its key leaked")])
@example([], [CertificateRevoked(serial="0a1b", reason="")])
def test_a_fold_undone_leaves_the_state_as_it_was(
    batches: list[list[AnyEvent]], batch: list[AnyEvent]
) -> None:
    """What an append that does not commit leaves: the state before it, every part of it."""
    history = log_of(*(event for events in batches for event in events))
    state = replay(history)
    before = _parts(state)

    later = [msgspec.structs.replace(r, position=len(history) + r.position) for r in log_of(*batch)]
    _, undo = fold(state, later)
    undo.restore(state)

    assert _parts(state) == before


def _key(table: str, row: Row) -> str:
    if table == "shards":
        return f"{row['replica_id']}/{row['shard_index']}"
    return str(row["name"] if table == "models" else row["id"])


def test_every_event_type_has_a_handler_in_the_fold() -> None:
    from app.domain.events import EVENT_TYPES
    from app.domain.evolve import _HANDLERS

    assert set(_HANDLERS) == set(EVENT_TYPES.values())


@pytest.mark.parametrize(
    ("changes", "entity", "identity"),
    [
        (ShardChanges, Shard, {"index"}),
        (ReplicaChanges, Replica, {"id", "model", "number", "placed_at"}),
        (ModelChanges, Model, {"name", "declared_at"}),
        (NodeChanges, Node, {"id", "registered_at"}),
        (GpuChanges, GpuInfo, {"index", "uuid", "name", "memory_total_mib"}),
    ],
)
def test_what_the_fold_may_change_is_every_field_of_an_entity_but_its_identity(
    changes: type, entity: type[msgspec.Struct], identity: set[str]
) -> None:
    assert set(get_type_hints(changes)) == set(entity.__struct_fields__) - identity
