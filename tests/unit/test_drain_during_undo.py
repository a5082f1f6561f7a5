"""Stories of a node drained while a rollout is being undone, on a fixed clock, with agents
that carry out the commands they are sent when the story says so (in the order sent, as
an agent does on its one connection) and report what their engines do.

A drain says it is finished (``node_drain_finished``, what ``GET /admin/v1/drains/{id}``
and ``llmgw-cli drain --wait`` report) only once nothing of any replica is left on the
node: not a replica the log has there, and not an engine its agent is starting or runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from msgspec.structs import replace

from app.domain import node_operations as node_ops
from app.domain import rollout_operations as rollouts
from app.domain.agent_reports import shard_reported
from app.domain.commands import StartShard, StopShard
from app.domain.decision import Decision
from app.domain.drain import NODE_DRAIN_COMPLETE, NODE_DRAIN_NOTHING_SERVED
from app.domain.events import NodeDrainFinished, ReplicaPlaced
from app.domain.model_spec import RolloutPolicy
from app.domain.reports import (
    FleetView,
    ReportedShard,
    ShardPhaseReport,
    command_sent,
    command_settled,
)
from app.domain.state import ACTIVE_PHASES, ReplicaPhase, RolloutState, ShardPhase
from tests.unit.test_reconcile import Cluster, of_type
from tests.unit.test_rollouts import revise

ShardKey = tuple[str, int]


@dataclass
class Agents:
    """The agents of ``cluster``'s nodes: each keeps the commands sent to it, in order,
    until told to carry them out; its engines come up at once."""

    cluster: Cluster
    inbox: dict[str, list[StartShard | StopShard]] = field(default_factory=dict)
    engines: dict[str, dict[ShardKey, int]] = field(default_factory=dict)
    """Each node's running engines, with their ports."""

    def reconcile(self) -> Decision:
        """A pass; the commands it sends wait in their nodes' inboxes, awaited (as the
        reconciler's shell has the live view await them) until carried out."""
        decision = self.cluster.reconcile()
        for planned in decision.commands:
            self.inbox.setdefault(planned.node_id, []).append(planned.command)
            self._awaited(planned.node_id, planned.command.command_id, awaited=True)
        return decision

    def carry_out(self, *node_ids: str) -> None:
        """Those nodes' agents carry out every command waiting for them, in order."""
        for node_id in node_ids or tuple(self.inbox):
            waiting, self.inbox[node_id] = self.inbox.get(node_id, []), []
            for command in waiting:
                self._carry_out(node_id, command)  # reported, then answered
                self._awaited(node_id, command.command_id, awaited=False)

    def _awaited(self, node_id: str, command_id: str, *, awaited: bool) -> None:
        view = FleetView(reports=self.cluster.reports)
        if awaited:
            view = command_sent(view, node_id, command_id, self.cluster.now)
        else:
            view = command_settled(view, node_id, command_id)
        self.cluster.reports = dict(view.reports)

    def _carry_out(self, node_id: str, command: StartShard | StopShard) -> None:
        engines = self.engines.setdefault(node_id, {})
        key = (command.replica_id, command.shard_index)
        if isinstance(command, StartShard):
            if key not in engines:
                engines[key] = command.port
                self._report(node_id, key, ShardPhase.STARTING, command.port)
                self._report(node_id, key, ShardPhase.READY, command.port)
        elif key in engines:  # a stop of a shard that does not run is only answered
            self._report(node_id, key, ShardPhase.STOPPED, engines.pop(key))

    def _report(self, node_id: str, key: ShardKey, phase: ShardPhase, port: int) -> None:
        report = ShardPhaseReport(
            replica_id=key[0],
            shard_index=key[1],
            phase=phase,  # type: ignore[arg-type]
            pid=1000 + port,
        )
        for _, event in shard_reported(self.cluster.state, node_id, report, port=port):
            self.cluster.given(event)
        running = {
            k: ReportedShard(
                replica_id=k[0],
                shard_index=k[1],
                model="llama",
                port=p,
                pid=1000 + p,
                state="ready",
            )
            for k, p in self.engines.get(node_id, {}).items()
        }
        report = self.cluster.reports[node_id]
        self.cluster.reports[node_id] = replace(report, shards=running)

    def on(self, node_id: str) -> list[str]:
        """What of any replica is on the node: engines running or about to start."""
        starting = [c.replica_id for c in self.inbox.get(node_id, []) if isinstance(c, StartShard)]
        return sorted({*(k[0] for k in self.engines.get(node_id, {})), *starting})


def on_node(cluster: Cluster, node_id: str) -> list[str]:
    """The replicas the log has on the node."""
    return sorted(
        r.id
        for r in cluster.state.replicas.values()
        if r.phase in ACTIVE_PHASES and node_id in r.node_ids
    )


def rolled_out_to_one() -> tuple[Cluster, Agents]:
    """Two replicas of revision 1, llama-1 on gpu-1 and llama-2 on gpu-2; revision 2's
    rollout has placed llama-3 on gpu-3 to replace llama-1, and llama-3 serves (llama-1
    still serves too, until llama-3 has served for the stability window)."""
    cluster = Cluster()
    for node_id in ("gpu-1", "gpu-2", "gpu-3"):
        cluster.node(node_id)
    cluster.model(replicas=2, rollout=RolloutPolicy())
    cluster.after(31)
    agents = Agents(cluster)
    agents.reconcile()
    agents.carry_out()
    revise(cluster)
    agents.reconcile()  # the step starts
    agents.reconcile()  # llama-1 draining, llama-3 placed at revision 2
    agents.carry_out()
    agents.reconcile()  # llama-3 serves
    assert {r.id: (r.node_ids, r.revision, r.phase) for r in cluster.state.replicas.values()} == {
        "llama-1": (("gpu-1",), 1, ReplicaPhase.DRAINING),
        "llama-2": (("gpu-2",), 1, ReplicaPhase.SERVING),
        "llama-3": (("gpu-3",), 2, ReplicaPhase.SERVING),
    }
    return cluster, agents


def undone_after_one_move() -> tuple[Cluster, Agents]:
    """``rolled_out_to_one``, once llama-1 has stopped, replaced by llama-3: an operator
    undoes the rollout, and the pass that reads it moves llama-3 back to revision 1,
    placing llama-4 on gpu-1, where llama-1 was. Its start is on its way to gpu-1."""
    cluster, agents = rolled_out_to_one()
    cluster.after(11)
    agents.reconcile()  # llama-1 leaves routing: its move is over
    agents.carry_out()  # its engine stops
    cluster.given(*rollouts.undo(cluster.state, "llama").events)
    placed = of_type(agents.reconcile(), ReplicaPlaced)
    assert [(p.replica_id, p.revision, p.shards[0].node_id) for p in placed] == [
        ("llama-4", 1, "gpu-1")
    ]
    assert cluster.phase("llama-1") is ReplicaPhase.STOPPED
    assert cluster.phase("llama-3") is ReplicaPhase.DRAINING
    return cluster, agents


def test_a_drain_does_not_finish_while_the_start_of_an_undo_s_replica_is_on_its_way_there() -> None:
    cluster, agents = undone_after_one_move()
    # llama-4's start is still on its way to gpu-1 when the operator drains gpu-1.
    cluster.given(*node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 600).events)

    for _ in range(3):  # passes in a row, before gpu-1's agent has read its commands
        finished = of_type(agents.reconcile(), NodeDrainFinished)
        assert finished == [], f"finished with {agents.on('gpu-1')} on gpu-1"
    assert on_node(cluster, "gpu-1") == ["llama-4"]
    assert cluster.phase("llama-4") is ReplicaPhase.STOPPING

    agents.carry_out("gpu-1")  # the start: llama-4's engine comes up on gpu-1
    assert agents.on("gpu-1") == ["llama-4"]
    assert of_type(agents.reconcile(), NodeDrainFinished) == []  # it is told to stop
    agents.carry_out("gpu-1")
    assert agents.on("gpu-1") == []
    (finished,) = of_type(agents.reconcile(), NodeDrainFinished)

    assert finished.outcome == NODE_DRAIN_NOTHING_SERVED
    assert cluster.phase("llama-4") is ReplicaPhase.STOPPED
    assert on_node(cluster, "gpu-1") == []


def test_a_start_the_node_never_answers_keeps_its_drain_open_only_for_the_startup_timeout() -> None:
    cluster, agents = undone_after_one_move()
    sent_at = cluster.now  # llama-4's start, on its way to gpu-1
    cluster.given(*node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 3600).events)
    timeout = timedelta(seconds=cluster.state.models["llama"].spec.startup_timeout_s)

    # gpu-1's agent stays connected but never answers (wedged, or hostile); the others
    # carry out what they are sent. A pass a minute, for up to three startup timeouts.
    finished: list[NodeDrainFinished] = []
    while not finished and cluster.now - sent_at <= 3 * timeout:
        finished = of_type(agents.reconcile(), NodeDrainFinished)
        agents.carry_out("gpu-2", "gpu-3")
        if not finished:
            assert cluster.phase("llama-4") is ReplicaPhase.STOPPING
            cluster.after(60)

    assert finished, f"the drain of gpu-1 is still open after {cluster.now - sent_at}"
    # Not before the start has gone unanswered for longer than an engine may take to start;
    # not because the drain's grace (an hour) ran out.
    assert timeout < cluster.now - sent_at < timeout + timedelta(seconds=120)
    assert finished[0].outcome == NODE_DRAIN_NOTHING_SERVED
    assert cluster.phase("llama-4") is ReplicaPhase.STOPPED
    assert on_node(cluster, "gpu-1") == []


def drained_until_finished(cluster: Cluster, agents: Agents, node_id: str) -> NodeDrainFinished:
    """Passes, with the agents carrying out what each sent and the stability window
    passing between them, until the node's drain finishes. Checks on every pass that nothing
    is placed on the node, and that the drain does not finish with anything left there."""
    for _ in range(30):
        decision = agents.reconcile()
        for placed in of_type(decision, ReplicaPlaced):
            assert node_id not in [s.node_id for s in placed.shards]
        finished = of_type(decision, NodeDrainFinished)
        if finished:
            assert (on_node(cluster, node_id), agents.on(node_id)) == ([], [])
            return finished[0]
        agents.carry_out()
        cluster.after(11)
    raise AssertionError(f"the drain of {node_id} did not finish: {on_node(cluster, node_id)}")


def test_a_drain_during_an_undo_waits_for_the_rollback_s_move_then_moves_its_replica() -> None:
    cluster, agents = undone_after_one_move()
    cluster.given(*node_ops.drain_node(cluster.state, "gpu-2", "drain-1", 3600).events)
    agents.reconcile()
    assert cluster.phase("llama-2") is ReplicaPhase.SERVING  # the model's one move: llama-3's

    finished = drained_until_finished(cluster, agents, "gpu-2")

    assert finished.outcome == NODE_DRAIN_COMPLETE
    moved = cluster.state.replicas["llama-2"]
    assert (moved.phase, moved.drain_id) == (ReplicaPhase.STOPPED, "drain-1")
    replacement = cluster.state.replicas[moved.replacement_id or ""]
    assert (replacement.phase, replacement.revision) == (ReplicaPhase.SERVING, 1)
    rollout = cluster.state.models["llama"].rollout
    assert rollout is not None
    assert rollout.state is RolloutState.ROLLED_BACK
    assert {r.revision for r in cluster.state.replicas.values() if r.phase in ACTIVE_PHASES} == {1}


def serving(cluster: Cluster) -> list[str]:
    """The model's replicas that serve requests now."""
    return sorted(
        r.id
        for r in cluster.state.replicas.values()
        if r.phase in (ReplicaPhase.SERVING, ReplicaPhase.DRAINING) and r.routable
    )


def test_a_drain_of_a_replica_whose_move_the_undo_called_off_succeeds_once_it_is_gone() -> None:
    cluster, agents = rolled_out_to_one()
    cluster.given(*node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 3600).events)
    cluster.given(*rollouts.undo(cluster.state, "llama").events)

    finished: list[NodeDrainFinished] = []
    for _ in range(30):
        finished = of_type(agents.reconcile(), NodeDrainFinished)
        assert len(serving(cluster)) >= 2, f"the model serves only {serving(cluster)}"
        if finished:
            break
        agents.carry_out()
        cluster.after(11)

    # Called off, llama-1 serves again and the drain moves it; but the model has its two
    # replicas (llama-2, and llama-3 until the rollback replaces it) without it, so it
    # stops with no replacement: the node was emptied and the model kept its count.
    assert finished, f"the drain of gpu-1 did not finish: {on_node(cluster, 'gpu-1')}"
    assert finished[0].outcome == (
        "every replica moved or was not needed: 0 moved; 1 stopped with its model at its "
        "count without it: llama-1 (scaled down to 2)"
    )
    assert finished[0].succeeded is True
    assert (on_node(cluster, "gpu-1"), agents.on("gpu-1")) == ([], [])
    stopped = cluster.state.replicas["llama-1"]
    assert (stopped.phase, stopped.surplus) == (ReplicaPhase.STOPPED, True)
