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
    ReplicaAdopted,
    ReplicaDrainStarted,
    ReplicaPlaced,
    ReplicaStopping,
    ShardStarting,
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


def test_an_engine_an_earlier_leader_started_outside_the_range_is_stopped_with_its_replica() -> (
    None
):
    """The log's copy (its node, its port) runs, though the log has it only placed: not a
    stray, its replica's own engine, stopped with it by plan. Its replica stays stopping
    until the engine is gone: before, the log had it stopped in the same pass, and its
    replacement was started on the node's one GPU under the engine still running there."""
    cluster = _placed_at_21000()
    _connected(cluster, NEW_RANGE)
    cluster.running("gpu-1", "llama-1", 21000, state="starting")

    decision = cluster.reconcile()

    assert [s.reason for s in of_type(decision, ReplicaStopping)] == [OUT_OF_RANGE]
    assert of_type(decision, StrayStopped) == []
    assert of_type(decision, ReplicaAdopted) == []
    assert commands(decision) == ["stop-llama-1-0"]
    assert _replacement_port(decision) == []  # its engine holds the node's one GPU
    assert cluster.phase("llama-1") is ReplicaPhase.STOPPING

    cluster.stop_reported("llama-1")  # the agent obeys the stop
    ended = cluster.reconcile()

    assert kinds(ended) == ["ReplicaStopped", "ReplicaPlaced"]
    assert _replacement_port(ended) == [21200]
    assert commands(ended) == ["start-llama-2-0"]


def _serving_at_21000() -> Cluster:
    """The replica of ``_placed_at_21000`` serving there, its agent away (engines keep
    running while their agent restarts)."""
    cluster = Cluster()
    _connected(cluster, OLD_RANGE)
    cluster.model(replicas=1)
    cluster.after(31)
    cluster.reconcile()
    cluster.serve("llama-1")
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING
    cluster.given(NodeDisconnected(node_id="gpu-1", reason="agent restarted"))
    cluster.gone("gpu-1")
    cluster.after(5)
    return cluster


def test_a_serving_engine_outside_the_nodes_new_range_is_stopped_and_replaced_not_failed() -> None:
    """Before, adoption took the engine for a stray: stopped as one (``stray_stopped`` on
    the node), its replica failed with "stopped without being asked to", and the model
    backed off before its replacement."""
    cluster = _serving_at_21000()
    _connected(cluster, NEW_RANGE)
    cluster.running("gpu-1", "llama-1", 21000, pid=22000)

    decision = cluster.reconcile()

    stopping = of_type(decision, ReplicaStopping)
    assert [(s.replica_id, s.reason, s.surplus) for s in stopping] == [
        ("llama-1", OUT_OF_RANGE, False)
    ]
    assert of_type(decision, StrayStopped) == []
    assert of_type(decision, ReplicaAdopted) == []
    assert commands(decision) == ["stop-llama-1-0"]
    assert _replacement_port(decision) == []  # its engine holds the node's one GPU

    cluster.stop_reported("llama-1")  # the agent obeys the stop
    ended = cluster.reconcile()

    assert kinds(ended) == ["ReplicaStopped", "ReplicaPlaced"]
    assert _replacement_port(ended) == [21200]
    assert commands(ended) == ["start-llama-2-0"]
    replica = cluster.state.replicas["llama-1"]
    assert (replica.phase, replica.end_reason) == (ReplicaPhase.STOPPED, OUT_OF_RANGE)
    model = cluster.state.models["llama"]
    assert (model.failures, model.backoff_until) == (0, None)
    assert cluster.state.nodes["gpu-1"].stray_stops == ()


def test_a_starting_engine_outside_the_nodes_new_range_is_stopped_too() -> None:
    cluster = Cluster()
    _connected(cluster, OLD_RANGE)
    cluster.model(replicas=1)
    cluster.after(31)
    cluster.reconcile()
    cluster.given(ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1", pid=7))
    _connected(cluster, NEW_RANGE)
    cluster.running("gpu-1", "llama-1", 21000, state="starting", pid=7)

    decision = cluster.reconcile()

    assert [s.reason for s in of_type(decision, ReplicaStopping)] == [OUT_OF_RANGE]
    assert of_type(decision, StrayStopped) == []


def test_a_draining_replica_outside_the_nodes_new_range_is_stopped_not_failed() -> None:
    cluster = _serving_at_21000()
    cluster.given(ReplicaDrainStarted(replica_id="llama-1", drain_id="d-1"))
    _connected(cluster, NEW_RANGE)
    cluster.running("gpu-1", "llama-1", 21000, pid=22000)

    decision = cluster.reconcile()

    assert [s.reason for s in of_type(decision, ReplicaStopping)] == [OUT_OF_RANGE]
    assert of_type(decision, StrayStopped) == []
    cluster.stop_reported("llama-1")
    cluster.reconcile()
    assert cluster.phase("llama-1") is ReplicaPhase.STOPPED
    assert cluster.state.models["llama"].failures == 0


def test_an_engine_outside_the_range_at_another_port_than_the_logs_is_still_a_stray() -> None:
    """Not the log's copy: nobody placed it there."""
    cluster = _serving_at_21000()
    _connected(cluster, (21000, 21099))
    cluster.running("gpu-1", "llama-1", 21150, pid=6666)

    decision = cluster.reconcile()

    assert [s.rule for s in of_type(decision, StrayStopped)] == [
        "port 21150 is outside gpu-1's declared port range 21000-21099"
    ]
    assert of_type(decision, ReplicaStopping) == []


def test_another_node_cannot_get_a_replica_stopped_by_reporting_it_outside_its_range() -> None:
    """gpu-2's range excludes 21000, and it names llama-1 (placed on gpu-1) at 21000: a
    stray on gpu-2; llama-1 serves on, judged by gpu-1's range and report alone."""
    cluster = _serving_at_21000()
    _connected(cluster, OLD_RANGE)
    cluster.running("gpu-1", "llama-1", 21000, pid=22000)
    cluster.given(
        NodeConnected(node_id="gpu-2", address="127.0.0.2", gpus=gpus(1), port_range=NEW_RANGE)
    )
    cluster.running("gpu-2", "llama-1", 21000, pid=6666)

    decision = cluster.reconcile()

    assert of_type(decision, ReplicaStopping) == []
    assert [(s.node_id, s.rule) for s in of_type(decision, StrayStopped)] == [
        ("gpu-2", "placed on gpu-1, reported by gpu-2")
    ]
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING
