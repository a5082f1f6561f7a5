"""Stories of a node whose agent comes back with another port range: a replica placed at a
port the node no longer accepts can never start there (its agent refuses the start, and
answers the same start again with the refusal it remembers), so it is stopped and a
replacement is placed within the range, with no backoff: nothing failed."""

from __future__ import annotations

from app.domain import agent_reports
from app.domain.decision import Decision
from app.domain.events import (
    NodeConnected,
    NodeDisconnected,
    ReplicaPlaced,
    ReplicaStopping,
    ShardStopped,
    StrayStopped,
)
from app.domain.reports import CommandAnswered, NodeReport
from app.domain.state import ReplicaPhase
from tests.unit.test_reconcile import Cluster, commands, gpus, kinds, of_type

OLD_RANGE = (21000, 21099)
NEW_RANGE = (21200, 21299)
OUT_OF_RANGE = "port 21000 is outside gpu-1's port range 21200-21299"


def _connected(cluster: Cluster, port_range: tuple[int, int]) -> None:
    cluster.given(
        NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(1), port_range=port_range)
    )
    cluster.reports.setdefault("gpu-1", NodeReport(node_id="gpu-1"))  # its hello


def _placed_at_21000(*, after_grace: bool = True) -> Cluster:
    """One single-GPU node with the range 21000-21099, and a replica placed on it at 21000."""
    cluster = Cluster()
    _connected(cluster, OLD_RANGE)
    cluster.model(replicas=1)
    cluster.after(31)  # past the adoption grace
    placed = of_type(cluster.reconcile(), ReplicaPlaced)
    assert [s.port for p in placed for s in p.shards] == [21000]
    cluster.given(NodeDisconnected(node_id="gpu-1", reason="agent restarted"))
    cluster.gone("gpu-1")
    cluster.after(5)
    return cluster


def _replacement_port(decision: Decision) -> list[int]:
    return [s.port for p in of_type(decision, ReplicaPlaced) for s in p.shards]


def test_a_replica_placed_outside_the_nodes_new_range_is_replaced_within_it() -> None:
    cluster = _placed_at_21000()
    _connected(cluster, NEW_RANGE)

    decision = cluster.reconcile()

    stopping = of_type(decision, ReplicaStopping)
    assert [(s.replica_id, s.reason, s.surplus) for s in stopping] == [
        ("llama-1", OUT_OF_RANGE, False)
    ]
    assert cluster.phase("llama-1") is ReplicaPhase.STOPPED
    assert cluster.state.replicas["llama-1"].end_reason == OUT_OF_RANGE
    assert _replacement_port(decision) == [21200]
    assert commands(decision) == ["start-llama-2-0"]
    model = cluster.state.models["llama"]
    assert (model.failures, model.backoff_until) == (0, None)


def test_a_replica_its_agent_stopped_is_replaced_when_it_comes_back_with_another_range() -> None:
    cluster = _placed_at_21000()
    cluster.given(
        ShardStopped(
            replica_id="llama-1", shard_index=0, node_id="gpu-1", reason="agent shutting down"
        )
    )
    _connected(cluster, NEW_RANGE)

    decision = cluster.reconcile()

    assert [s.reason for s in of_type(decision, ReplicaStopping)] == [OUT_OF_RANGE]
    assert _replacement_port(decision) == [21200]


def test_a_start_the_node_refuses_for_its_new_range_is_stopped_and_replaced_not_failed() -> None:
    """A start decided on the old range reaches the agent back with the new one, which
    refuses it before any pass saw its hello. The refusal leaves the replica to this rule:
    failed, it would count against the model's backoff and delay the replacement."""
    cluster = _placed_at_21000()
    _connected(cluster, NEW_RANGE)
    refused = CommandAnswered(
        node_id="gpu-1",
        command_id="start-llama-1-0",
        ok=False,
        error="port 21000 is outside this node's port range 21200-21299",
        sent=True,
    )
    for _, event in agent_reports.decide(cluster.state, refused):
        cluster.given(event)

    decision = cluster.reconcile()

    assert [s.reason for s in of_type(decision, ReplicaStopping)] == [OUT_OF_RANGE]
    assert cluster.state.replicas["llama-1"].end_reason == OUT_OF_RANGE
    assert _replacement_port(decision) == [21200]
    model = cluster.state.models["llama"]
    assert (model.failures, model.backoff_until) == (0, None)


def test_during_the_adoption_grace_the_replica_is_stopped_and_replaced_after_it() -> None:
    cluster = _placed_at_21000()
    # A control plane that just started, waiting for a node the log knows to say hello.
    cluster.started_at = cluster.now
    cluster.given(NodeConnected(node_id="gpu-2", address="127.0.0.2", gpus=gpus(1)))
    _connected(cluster, NEW_RANGE)

    during = cluster.reconcile()

    assert [s.reason for s in of_type(during, ReplicaStopping)] == [OUT_OF_RANGE]
    assert of_type(during, ReplicaPlaced) == []
    assert commands(during) == []
    cluster.after(31)
    assert _replacement_port(cluster.reconcile()) == [21200]


def test_a_replica_placed_within_the_nodes_range_is_started_again() -> None:
    cluster = _placed_at_21000()
    _connected(cluster, (21000, 21299))

    decision = cluster.reconcile()

    assert kinds(decision) == []
    assert commands(decision) == ["start-llama-1-0"]


def test_a_node_that_did_not_say_hello_to_this_control_plane_is_not_judged() -> None:
    cluster = _placed_at_21000()
    _connected(cluster, NEW_RANGE)
    cluster.gone("gpu-1")  # connected in the log, but not heard from by this control plane

    assert of_type(cluster.reconcile(), ReplicaStopping) == []
    assert cluster.phase("llama-1") is ReplicaPhase.PLACED


def test_a_running_shard_outside_the_range_is_left_to_adoption() -> None:
    cluster = _placed_at_21000()
    _connected(cluster, NEW_RANGE)
    cluster.running("gpu-1", "llama-1", 21000, state="starting")

    decision = cluster.reconcile()

    assert of_type(decision, ReplicaStopping) == []
    assert [s.rule for s in of_type(decision, StrayStopped)] == [
        "port 21000 is outside gpu-1's declared port range 21200-21299"
    ]
