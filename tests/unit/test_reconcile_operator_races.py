"""Stories of an operator's change recorded between a reconciler pass's decision and its
append (through this control plane or another): the pass decided without it, and must not
undo it. Each story decides a pass, lands the operator's change, then appends the pass as
the reconciler would; the operator's intent must hold after the next pass."""

from __future__ import annotations

from datetime import timedelta

import pytest
from msgspec.structs import replace

from app.domain import autoscale
from app.domain import keys as key_decisions
from app.domain import model_operations as model_decisions
from app.domain import node_operations as node_decisions
from app.domain.events import (
    GpuMarkedUnhealthy,
    ModelScaled,
    ModelUnplaceable,
    NodeDrainFinished,
    ReplicaDrainStarted,
    ReplicaPlaced,
    ReplicaStopping,
    model_stream,
    node_stream,
    replica_stream,
)
from app.domain.operation_results import InvalidOperation
from app.domain.state import ACTIVE_PHASES, ReplicaPhase
from tests.unit.test_autoscale import POLICY
from tests.unit.test_reconcile import (
    T0,
    Cluster,
    of_type,
    placed_ids,
    with_two_nodes_and_a_model,
)


def active_on(cluster: Cluster, node_id: str) -> list[str]:
    return sorted(
        r.id
        for r in cluster.state.replicas.values()
        if r.phase in ACTIVE_PHASES and any(s.node_id == node_id for s in r.shards)
    )


def placed_on(cluster: Cluster, replica_id: str) -> str:
    return cluster.state.replicas[replica_id].shards[0].node_id


def test_a_replica_decided_for_a_node_cordoned_meanwhile_is_placed_elsewhere() -> None:
    # Given a pass that places a model's replica on gpu-1 ...
    cluster = with_two_nodes_and_a_model(replicas=1)
    stale = cluster.decided()
    [placement] = of_type(stale, ReplicaPlaced)
    node = placement.shards[0].node_id
    # ... when an operator cordons that node before the pass appends ...
    cluster.given(*node_decisions.cordon(cluster.state, node, "disk replacement").events)

    # ... then the pass loses the race, and the next one places the replica elsewhere.
    assert cluster.appended(stale) == node_stream(node)
    assert placed_ids(cluster.reconcile()) == ["llama-1"]
    assert active_on(cluster, node) == []
    assert placed_on(cluster, "llama-1") != node


def test_a_replica_decided_for_a_node_drained_meanwhile_is_placed_elsewhere() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    stale = cluster.decided()
    node = of_type(stale, ReplicaPlaced)[0].shards[0].node_id
    drain = node_decisions.drain_node(cluster.state, node, "drain-1", grace_s=60.0)
    cluster.given(*drain.events)

    assert cluster.appended(stale) == node_stream(node)
    cluster.reconcile()
    assert active_on(cluster, node) == []
    assert cluster.state.nodes[node].drain_began_with == ()


def test_a_scale_down_recorded_while_a_pass_places_for_the_higher_count_holds() -> None:
    # Given one replica serving, and a pass placing a second for a count of two ...
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.given(*model_decisions.scale(cluster.state, "llama", 2).events)
    stale = cluster.decided()
    assert placed_ids(stale) == ["llama-2"]
    # ... when the operator scales back to one before it appends ...
    cluster.given(*model_decisions.scale(cluster.state, "llama", 1).events)

    # ... then no second replica is ever placed, started and stopped again.
    assert cluster.appended(stale) == model_stream("llama")
    decision = cluster.reconcile()
    assert decision.events == ()
    assert "llama-2" not in cluster.state.replicas
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING


def test_a_stale_scale_up_of_the_autoscaler_does_not_override_an_operators_lower_max() -> None:
    # Given an autoscaled model whose demand calls for more replicas ...
    policy = replace(POLICY, min_replicas=1, max_replicas=4)
    cluster = with_two_nodes_and_a_model(replicas=1, autoscale=policy)
    cluster.reconcile()
    cluster.serve("llama-1")
    busy = tuple(
        autoscale.DemandSample(cluster.now - timedelta(seconds=s), 40.0) for s in range(60, -1, -1)
    )
    cluster.demand = {"llama": busy}
    stale = cluster.decided()
    [scaled] = of_type(stale, ModelScaled)
    assert scaled.replicas > 1
    # ... when the operator lowers its max to one before the pass appends ...
    lowered = replace(policy, max_replicas=1)
    cluster.given(*model_decisions.set_autoscale(cluster.state, "llama", lowered).events)

    # ... then the autoscaler's count decided on the old bound is not recorded.
    assert cluster.appended(stale) == model_stream("llama")
    assert cluster.state.models["llama"].spec.replicas == 1
    cluster.reconcile()
    assert cluster.state.models["llama"].spec.replicas == 1
    assert sorted(r.id for r in cluster.state.replicas.values()) == ["llama-1"]


def test_a_replica_decided_for_a_model_removed_meanwhile_is_never_placed() -> None:
    cluster = with_two_nodes_and_a_model(replicas=2)
    stale = cluster.decided()
    assert stale.commands
    cluster.given(*model_decisions.remove(cluster.state, "llama").events)

    assert cluster.appended(stale) == model_stream("llama")
    decision = cluster.reconcile()
    assert decision.events == ()
    assert decision.commands == ()
    assert cluster.state.replicas == {}


def test_a_replica_drain_recorded_while_a_pass_stops_it_for_a_scale_down_leaves_the_count() -> None:
    # The scale-down was the operator's word before the drain: the replica stops, and no
    # replacement is placed past the count.
    cluster = with_two_nodes_and_a_model(replicas=2)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    cluster.given(*model_decisions.scale(cluster.state, "llama", 1).events)
    stale = cluster.decided()
    [stopping] = of_type(stale, ReplicaStopping)
    cluster.given(
        *node_decisions.drain_replica(cluster.state, stopping.replica_id, "drain-1").events
    )

    assert cluster.appended(stale) is None
    cluster.reconcile()
    assert cluster.phase(stopping.replica_id) is ReplicaPhase.STOPPING
    counting = [r for r in cluster.state.replicas.values() if r.phase is ReplicaPhase.SERVING]
    assert len(counting) == 1
    assert of_type(cluster.reconcile(), ReplicaPlaced) == []


def test_a_replica_drain_recorded_while_a_pass_moves_it_off_an_unhealthy_gpu_stands() -> None:
    # Given a pass that moves llama-1 off its GPU, which turned unhealthy ...
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    [shard] = cluster.state.replicas["llama-1"].shards
    cluster.given(
        GpuMarkedUnhealthy(node_id=shard.node_id, gpu_index=shard.gpus[0], reason="XID 48")
    )
    stale = cluster.decided()
    [move] = of_type(stale, ReplicaDrainStarted)
    assert move.replica_id == "llama-1"
    # ... when an operator drains that replica before the pass appends ...
    cluster.given(*node_decisions.drain_replica(cluster.state, "llama-1", "drain-9").events)

    # ... then the move is not appended: the operator's drain moves it, and no other.
    assert cluster.appended(stale) == replica_stream("llama-1")
    assert cluster.state.replicas["llama-1"].drain_id == "drain-9"
    assert cluster.state.models["llama"].moves["llama-1"].move_id == "drain-9"
    again = cluster.reconcile()
    assert of_type(again, ReplicaDrainStarted) == []
    assert [e.replaces for e in of_type(again, ReplicaPlaced)] == ["llama-1"]
    assert {p.correlation_id for p in again.events} == {"drain-9"}


def test_a_second_drain_of_a_draining_replica_leaves_it_to_the_first() -> None:
    # What the log holds of such a race from before it was refused replays the same way.
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.given(*node_decisions.drain_replica(cluster.state, "llama-1", "drain-9").events)
    started_at = cluster.state.replicas["llama-1"].drain_started_at
    cluster.after(5)

    cluster.given(ReplicaDrainStarted(replica_id="llama-1", drain_id="gpu-move-llama-1-x"))

    replica = cluster.state.replicas["llama-1"]
    assert (replica.drain_id, replica.drain_started_at) == ("drain-9", started_at)
    assert cluster.state.models["llama"].moves["llama-1"].move_id == "drain-9"


def test_a_key_revoked_while_a_pass_decides_stays_revoked() -> None:
    # A pass writes no key's stream and decides on no key: there is no race to lose.
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.given(
        *key_decisions.create(
            cluster.state,
            name="ci",
            models=["llama"],
            rpm=None,
            tpm=None,
            key_id="k-0badf00d",
            prefix="0badf00d",
            secret_hash=key_decisions.hash_key(key_decisions.format_key("0badf00d", "s" * 43)),
            now=T0,
            expires_at=None,
        ).events
    )
    stale = cluster.decided()
    cluster.given(*key_decisions.revoke(cluster.state, "k-0badf00d").events)

    assert cluster.appended(stale) is None
    assert placed_ids(stale) == ["llama-1"]
    assert cluster.state.keys["k-0badf00d"].revoked_at is not None


def test_a_scale_up_recorded_while_a_pass_stops_a_surplus_replica_keeps_it_serving() -> None:
    # Given two replicas serving, and a pass stopping one for a scale-down to one ...
    cluster = with_two_nodes_and_a_model(replicas=2)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    cluster.given(*model_decisions.scale(cluster.state, "llama", 1).events)
    stale = cluster.decided()
    [stopping] = of_type(stale, ReplicaStopping)
    assert stopping.surplus
    # ... when the operator scales back to two before it appends ...
    cluster.given(*model_decisions.scale(cluster.state, "llama", 2).events)

    # ... then the pass loses the race: both replicas keep serving, none is replaced.
    assert cluster.appended(stale) == model_stream("llama")
    decision = cluster.reconcile()
    assert decision.events == ()
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING
    assert cluster.phase("llama-2") is ReplicaPhase.SERVING


def test_a_scale_up_recorded_while_a_pass_stops_a_moved_replica_as_surplus_keeps_it() -> None:
    # Given a replica being moved, and a pass stopping it with no replacement, its model
    # scaled down to the one other replica ...
    cluster = with_two_nodes_and_a_model(replicas=2)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    cluster.given(*node_decisions.drain_replica(cluster.state, "llama-1", "drain-1").events)
    cluster.given(*model_decisions.scale(cluster.state, "llama", 1).events)
    stale = cluster.decided()
    [stopping] = of_type(stale, ReplicaStopping)
    assert (stopping.replica_id, stopping.surplus) == ("llama-1", True)
    # ... when the operator scales back to two before it appends ...
    cluster.given(*model_decisions.scale(cluster.state, "llama", 2).events)

    # ... then the moved replica serves on until a replacement serves in its place.
    assert cluster.appended(stale) == model_stream("llama")
    [replacement] = of_type(cluster.reconcile(), ReplicaPlaced)
    assert replacement.replaces == "llama-1"
    assert cluster.phase("llama-1") is ReplicaPhase.DRAINING
    assert cluster.phase("llama-2") is ReplicaPhase.SERVING


def test_a_moved_replica_the_count_leaves_no_room_for_stops_while_another_is_replaced() -> None:
    # Two replicas being moved, the model scaled down so that it misses one: the pass
    # replaces one and stops the other as surplus. Nothing raced it, and its run stands:
    # the moved replica still waiting for its replacement makes the count.
    cluster = with_two_nodes_and_a_model(replicas=3)
    cluster.reconcile()
    for replica_id in ("llama-1", "llama-2", "llama-3"):
        cluster.serve(replica_id)
    cluster.given(*node_decisions.drain_replica(cluster.state, "llama-1", "drain-1").events)
    cluster.given(*node_decisions.drain_replica(cluster.state, "llama-2", "drain-2").events)
    cluster.given(*model_decisions.scale(cluster.state, "llama", 2).events)

    decision = cluster.reconcile()
    assert [(s.replica_id, s.surplus) for s in of_type(decision, ReplicaStopping)] == [
        ("llama-2", True)
    ]
    [replacement] = of_type(decision, ReplicaPlaced)
    assert replacement.replaces == "llama-1"


def test_an_operator_acting_on_a_node_whose_drain_a_pass_finishes_keeps_the_last_word() -> None:
    # A drain's finish races no operator's change of its node: until it is recorded, the
    # node still drains, and an uncordon, a new drain or a cordon is refused with nothing
    # recorded (a draining node is cordoned by its drain). Once it is, the node stays
    # cordoned until the operator says otherwise.
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    empty = "gpu-2" if placed_on(cluster, "llama-1") == "gpu-1" else "gpu-1"
    cluster.given(*node_decisions.drain_node(cluster.state, empty, "drain-1", grace_s=60.0).events)
    stale = cluster.decided()
    [finished] = of_type(stale, NodeDrainFinished)
    assert (finished.drain_id, finished.succeeded) == ("drain-1", True)

    with pytest.raises(InvalidOperation, match="draining"):
        node_decisions.uncordon(cluster.state, empty)
    with pytest.raises(InvalidOperation, match="already draining"):
        node_decisions.drain_node(cluster.state, empty, "drain-2", grace_s=60.0)
    with pytest.raises(InvalidOperation, match="already cordoned by its drain"):
        node_decisions.cordon(cluster.state, empty, "disk replacement")

    assert cluster.appended(stale) is None
    assert cluster.state.nodes[empty].cordoned
    assert cluster.state.nodes[empty].drain_id is None
    cluster.given(*node_decisions.uncordon(cluster.state, empty).events)
    cluster.reconcile()
    assert not cluster.state.nodes[empty].cordoned


def test_a_model_found_unplaceable_just_before_an_uncordon_is_placed_by_the_next_pass() -> None:
    # The pass's "unplaceable" stands for a moment: the uncordon's append wakes the
    # reconciler (it runs a pass on every append), and that pass places the replica.
    cluster = with_two_nodes_and_a_model(replicas=1)
    for node in ("gpu-1", "gpu-2"):
        cluster.given(*node_decisions.cordon(cluster.state, node, "disk replacement").events)
    stale = cluster.decided()
    [unplaceable] = of_type(stale, ModelUnplaceable)
    assert "cordoned" in unplaceable.reason
    cluster.given(*node_decisions.uncordon(cluster.state, "gpu-1").events)

    assert cluster.appended(stale) is None
    assert cluster.state.models["llama"].unplaceable_reason == unplaceable.reason
    assert placed_ids(cluster.reconcile()) == ["llama-1"]
    assert placed_on(cluster, "llama-1") == "gpu-1"
    assert cluster.state.models["llama"].unplaceable_reason is None
