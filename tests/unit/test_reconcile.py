"""Stories of the reconciler: given a log and what agents report, when a pass runs at a time,
then these events and commands."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

from app.domain import agent_reports
from app.domain.adoption_grace import Arrivals
from app.domain.autoscale import DemandSample
from app.domain.decision import Decision, PlannedEvent
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    MODEL_STREAM_PREFIX,
    AnyEvent,
    GpuInfo,
    GpuMarkedUnhealthy,
    GpuRecovered,
    ModelDeclared,
    ModelScaled,
    ModelUnplaceable,
    NodeConnected,
    NodeCordoned,
    NodeDisconnected,
    NodeDrainFinished,
    NodeDrainRequested,
    NodeLost,
    ReplacementServing,
    ReplicaAdopted,
    ReplicaDrainStarted,
    ReplicaFailed,
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
    StrayStopped,
)
from app.domain.evolve import evolve
from app.domain.model_spec import ModelSpec
from app.domain.reconcile import Settings, decide, note_left_routing, overtaken
from app.domain.reports import (
    AgentConnected,
    AgentDisconnected,
    AgentInventory,
    FleetView,
    NodeReport,
    ReportedShard,
    ShardPhaseReport,
    ShardStatusReport,
    observe,
)
from app.domain.state import ClusterState, ReplicaPhase, ShardPhase
from app.domain.traffic import TrafficFigures
from tests.support.generators import stream_for

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
EPOCH = 2


def gpus(n: int, node_id: str = "gpu-1") -> tuple[GpuInfo, ...]:
    """``n`` GPUs of ``node_id``: no two nodes list one UUID (``app.domain.gpu_claims``)."""
    return tuple(
        GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", name="H100", memory_total_mib=81559)
        for i in range(n)
    )


class Cluster:
    """A log being written, and the passes the reconciler makes over it."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.now = T0
        self.started_at = T0
        self.reports: dict[str, NodeReport] = {}
        self.in_flight: dict[str, int] = {}
        self.routing_seen: int | None = None
        self.silent_gateways = 0
        """The lowest routing position the live gateways report (None: unknown)."""
        self.left_routing: dict[str, int] = {}
        """What gateways report in flight, by replica."""
        self.traffic: dict[str, TrafficFigures] = {}
        """What gateways measured, by the groups rollout verdicts ask for."""
        self.ejected: dict[str, int] = {}
        """Replicas the gateways eject, each with how many gateways do."""
        self.demand: dict[str, tuple[DemandSample, ...]] = {}
        """Autoscaled models' demand samples."""
        self.arrivals = Arrivals()
        """What the hub saw of agents arriving."""
        self.versions: dict[str, int] = {}
        """Each stream's version in the log."""
        self.read_versions: dict[str, int] = {}
        """The versions the last pass decided on."""

    def given(
        self, *events: AnyEvent, epoch: int | None = EPOCH, at: datetime | None = None
    ) -> None:
        for event in events:
            stream = stream_for(event)
            self.versions[stream] = self.versions.get(stream, 0) + 1
            evolve(
                self.state,
                Recorded(
                    position=self.state.position + 1,
                    stream=stream,
                    version=self.versions[stream],
                    event_id=uuid.uuid4(),
                    recorded_at=at or self.now,
                    meta=Meta(actor="test", epoch=epoch),
                    event=event,
                ),
            )

    def node(self, node_id: str, n_gpus: int = 8, **labels: str) -> None:
        self.given(
            NodeConnected(
                node_id=node_id,
                address=f"127.0.0.{len(self.state.nodes) + 1}",
                gpus=gpus(n_gpus, node_id),
                labels=labels,
            )
        )
        self.reports.setdefault(node_id, NodeReport(node_id=node_id))

    def model(self, name: str = "llama", **spec: object) -> None:
        self.given(
            ModelDeclared(
                model=name,
                spec=ModelSpec(name=name, command="sim --port {port} --model {model}", **spec),
            )
        )  # type: ignore[arg-type]

    def running(
        self,
        node_id: str,
        replica_id: str,
        port: int,
        *,
        shard: int = 0,
        state: str = "ready",
        pid: int = 4242,
    ) -> None:
        report = self.reports.get(node_id, NodeReport(node_id=node_id))
        shards = dict(report.shards)
        shards[(replica_id, shard)] = ReportedShard(
            replica_id=replica_id,
            shard_index=shard,
            model=replica_id.rsplit("-", 1)[0],
            port=port,
            pid=pid,
            state=state,
        )
        self.reports[node_id] = NodeReport(node_id=node_id, shards=shards)

    def failed_still_running(self, node_id: str, replica_id: str, model: str) -> None:
        """The log placed ``replica_id`` on ``node_id``'s GPU 0 at port 20000 and ended it
        failed, and the node still reports its engine running (on its way out)."""
        self.given(
            ReplicaPlaced(
                replica_id=replica_id,
                model=model,
                number=1,
                shards=(ShardPlacement(index=0, node_id=node_id, gpus=(0,), port=20000),),
            ),
            ReplicaFailed(replica_id=replica_id, reason="engine exited"),
        )
        self.running(node_id, replica_id, 20000)

    def gone(self, node_id: str) -> None:
        self.reports.pop(node_id, None)

    def settings(self, **overrides: float) -> Settings:
        values = {
            "adoption_grace_s": 30.0,
            "lost_timeout_s": 60.0,
            "stability_window_s": 10.0,
            "quiesce_s": 0.0,
        }
        values.update(overrides)
        return Settings(epoch=EPOCH, started_at=self.started_at, **values)  # type: ignore[arg-type]

    def after(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def reconcile(self, **overrides: float) -> Decision:
        decision = self.decided(**overrides)
        # A pass decided on the log as it is holds on it: nothing has overtaken it.
        assert self.appended(decision) is None
        return decision

    def decided(self, **overrides: float) -> Decision:
        """A pass's decision on the log as it is, not appended yet."""
        self.left_routing = note_left_routing(self.left_routing, self.state)
        fleet = FleetView(
            reports=dict(self.reports),
            in_flight=dict(self.in_flight),
            routing_seen=self.routing_seen,
            silent_gateways=self.silent_gateways,
            left_routing=dict(self.left_routing),
            traffic=dict(self.traffic),
            ejected=dict(self.ejected),
            demand=dict(self.demand),
            arrivals=self.arrivals,
        )
        self.read_versions = dict(self.versions)
        return decide(self.state, fleet, self.now, self.settings(**overrides))

    def appended(self, decision: Decision) -> str | None:
        """The events of ``decision`` appended to the log, as the reconciler appends them:
        run by run (consecutive events with the same correlation id and actor), each one
        refused if an operator's change recorded since the pass decided makes it a lost
        race (a model's stream moved on, or ``overtaken``). The runs before it stay
        appended; the stream it was lost on, or None when every run was appended."""
        expected = dict(self.read_versions)
        for _, grouped in itertools.groupby(
            decision.events, key=lambda p: (p.correlation_id, p.actor)
        ):
            run = list(grouped)
            models = sorted({p.stream for p in run if p.stream.startswith(MODEL_STREAM_PREFIX)})
            for stream in models:
                if self.versions.get(stream, 0) != expected.get(stream, 0):
                    return stream
            before, versions = self.state.copy(), dict(self.versions)
            for planned in run:
                self._append(planned)
            lost_on = overtaken(self.state, run)
            if lost_on is not None:
                self.state, self.versions = before, versions
                return lost_on
            expected.update({stream: self.versions[stream] for stream in models})
        return None

    def _append(self, planned: PlannedEvent) -> None:
        self.versions[planned.stream] = self.versions.get(planned.stream, 0) + 1
        evolve(
            self.state,
            Recorded(
                position=self.state.position + 1,
                stream=planned.stream,
                version=self.versions[planned.stream],
                event_id=uuid.uuid4(),
                recorded_at=self.now,
                meta=Meta(
                    actor=planned.actor,
                    epoch=EPOCH,
                    correlation_id=planned.correlation_id,
                ),
                event=planned.event,
            ),
        )

    def serve(self, replica_id: str) -> None:
        """The agent starts the replica's shards and they come up."""
        replica = self.state.replicas[replica_id]
        for shard in replica.shards:
            self.given(
                ShardStarting(
                    replica_id=replica_id,
                    shard_index=shard.index,
                    node_id=shard.node_id,
                    pid=1000 + shard.port,
                ),
                ShardReady(replica_id=replica_id, shard_index=shard.index, node_id=shard.node_id),
            )
            self.running(
                shard.node_id, replica_id, shard.port, shard=shard.index, pid=1000 + shard.port
            )
        self.reconcile()

    def stop_reported(self, replica_id: str) -> None:
        for shard in self.state.replicas[replica_id].shards:
            self.given(
                ShardStopped(replica_id=replica_id, shard_index=shard.index, node_id=shard.node_id)
            )
            report = self.reports.get(shard.node_id)
            if report is not None:
                shards = {k: v for k, v in report.shards.items() if k != (replica_id, shard.index)}
                self.reports[shard.node_id] = NodeReport(node_id=shard.node_id, shards=shards)

    def phase(self, replica_id: str) -> ReplicaPhase:
        return self.state.replicas[replica_id].phase


def kinds(decision: Decision) -> list[str]:
    return [type(p.event).__name__ for p in decision.events]


def of_type(decision: Decision, kind: type) -> list:  # type: ignore[type-arg]
    return [p.event for p in decision.events if isinstance(p.event, kind)]


def commands(decision: Decision) -> list[str]:
    return sorted(c.command.command_id for c in decision.commands)


def placed_ids(decision: Decision) -> list[str]:
    return [e.replica_id for e in of_type(decision, ReplicaPlaced)]


def with_two_nodes_and_a_model(replicas: int = 2, **spec: object) -> Cluster:
    cluster = Cluster()
    cluster.node("gpu-1")
    cluster.node("gpu-2")
    cluster.model(replicas=replicas, **spec)
    cluster.after(31)  # past the adoption grace
    return cluster


# -- placement and scaling ---------------------------------------------------------------


def test_a_declared_model_is_placed_spread_over_nodes_and_started() -> None:
    cluster = with_two_nodes_and_a_model(replicas=2)

    decision = cluster.reconcile()

    placed = of_type(decision, ReplicaPlaced)
    assert [p.replica_id for p in placed] == ["llama-1", "llama-2"]
    assert {p.shards[0].node_id for p in placed} == {"gpu-1", "gpu-2"}
    assert all(p.shards[0].port == 20000 for p in placed)
    assert commands(decision) == ["start-llama-1-0", "start-llama-2-0"]
    start = next(c.command for c in decision.commands if c.command.command_id == "start-llama-1-0")
    assert start.argv[:3] == ("sim", "--port", "20000")


def test_replicas_become_serving_when_every_shard_is_ready() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.given(ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1"))
    cluster.given(ShardReady(replica_id="llama-1", shard_index=0, node_id="gpu-1"))
    cluster.running("gpu-1", "llama-1", 20000)

    assert kinds(cluster.reconcile()) == ["ReplicaServing"]


def test_scaling_down_stops_the_newest_not_yet_serving_first() -> None:
    cluster = with_two_nodes_and_a_model(replicas=3)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    cluster.given(ModelScaled(model="llama", replicas=1, previous=3))

    stopping = of_type(cluster.reconcile(), ReplicaStopping)

    assert [s.replica_id for s in stopping] == ["llama-3", "llama-2"]


def test_an_unplaceable_model_is_recorded_once_per_reason() -> None:
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.model(gpus_per_shard=4)
    cluster.after(31)

    first = of_type(cluster.reconcile(), ModelUnplaceable)
    again = cluster.reconcile()

    assert len(first) == 1
    assert "needs 1 node(s) with 4 healthy free GPU(s)" in first[0].reason
    assert "1 not enough healthy free GPUs" in first[0].reason
    assert again.events == ()


def test_cannot_place_is_recorded_once_per_episode_and_again_after_a_placement_ends_one() -> None:
    """A replica placed ends an episode of "cannot place": the same reason after it is a new
    fact (one fewer replica missing, or more after a scale), recorded again; within one
    episode it is recorded once, whatever the passes."""
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.given(GpuMarkedUnhealthy(node_id="gpu-1", gpu_index=1, reason="XID 79"))
    cluster.model(replicas=2)
    cluster.after(31)

    first = cluster.reconcile()
    assert kinds(first) == ["ReplicaPlaced", "ModelUnplaceable"]
    assert cluster.reconcile().events == ()
    cluster.given(GpuRecovered(node_id="gpu-1", gpu_index=1))
    assert kinds(cluster.reconcile()) == ["ReplicaPlaced"]
    cluster.given(ModelScaled(model="llama", replicas=3, previous=2))
    again = of_type(cluster.reconcile(), ModelUnplaceable)

    [before] = of_type(first, ModelUnplaceable)
    assert [(e.reason, e.missing_replicas) for e in again] == [(before.reason, 1)]
    assert cluster.reconcile().events == ()


# -- startup timeouts and failures ---------------------------------------------------------


def test_two_replicas_stuck_in_starting_past_a_two_minute_timeout_are_timed_out_and_replaced() -> (
    None
):
    cluster = with_two_nodes_and_a_model(replicas=2, startup_timeout_s=120.0)
    cluster.reconcile()
    for replica_id, node in (("llama-1", "gpu-1"), ("llama-2", "gpu-2")):
        cluster.given(ShardStarting(replica_id=replica_id, shard_index=0, node_id=node, pid=7))
        cluster.running(node, replica_id, 20000, state="starting", pid=7)

    cluster.after(119)
    assert of_type(cluster.reconcile(), ReplicaStartupTimedOut) == []

    cluster.after(2)
    decision = cluster.reconcile()
    assert [e.replica_id for e in of_type(decision, ReplicaStartupTimedOut)] == [
        "llama-1",
        "llama-2",
    ]
    assert "stop-llama-1-0" in commands(decision)
    assert "stop-llama-2-0" in commands(decision)
    # The failures put the model in backoff before it is placed again.
    assert cluster.state.models["llama"].failures == 2
    assert placed_ids(decision) == []
    cluster.after(21)
    assert placed_ids(cluster.reconcile()) == ["llama-3", "llama-4"]


def test_a_failed_shard_fails_its_replica_and_the_model_backs_off() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.given(
        ShardFailed(
            replica_id="llama-1", shard_index=0, node_id="gpu-1", error="exit 1", log_tail=("OOM",)
        )
    )

    decision = cluster.reconcile()

    assert [e.reason for e in of_type(decision, ReplicaFailed)] == [
        "shard 0 on gpu-1 failed: exit 1"
    ]
    model = cluster.state.models["llama"]
    assert model.backoff_until == cluster.now + timedelta(seconds=10)
    cluster.after(11)
    assert placed_ids(cluster.reconcile()) == ["llama-2"]


# -- nodes lost and strays -------------------------------------------------------------------


def test_a_node_away_past_the_lost_timeout_loses_its_replicas_and_they_are_replaced() -> None:
    cluster = Cluster()
    cluster.node("gpu-1")
    cluster.node("gpu-2")
    cluster.model(replicas=1)
    cluster.after(31)
    cluster.reconcile()
    cluster.serve("llama-1")
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDisconnected(node_id=node, reason="heartbeat timeout"))
    cluster.gone(node)

    cluster.after(59)
    assert of_type(cluster.reconcile(), NodeLost) == []
    cluster.after(2)
    decision = cluster.reconcile()

    assert kinds(decision)[:2] == ["NodeLost", "ReplicaLost"]
    assert placed_ids(decision) == ["llama-2"]
    assert of_type(decision, ReplicaPlaced)[0].shards[0].node_id != node


def test_a_disconnect_that_could_not_be_recorded_is_recorded_later_as_a_disconnect() -> None:
    """The database was away when gpu-1's connection to this control plane ended, so the
    log still has it connected; the pass that records it says it disconnected, while gpu-2,
    which never said hello here, did not reconnect after the control plane started."""
    cluster = Cluster()
    cluster.node("gpu-1")
    cluster.node("gpu-2")
    inventory = AgentInventory(
        node_id="gpu-1",
        address="127.0.0.1",
        remote_address="127.0.0.1:4000",
        labels={},
        gpus=gpus(8),
        port_range=(20000, 20999),
        agent_version="t",
    )
    fleet = observe(FleetView(), AgentConnected(inventory=inventory), lambda _: None)
    gone = AgentDisconnected(node_id="gpu-1", reason="heartbeat timeout")
    fleet = observe(fleet, gone, lambda _: None)

    cluster.after(31)
    decision = decide(cluster.state, fleet, cluster.now, cluster.settings())

    reasons = {e.node_id: e.reason for e in of_type(decision, NodeDisconnected)}
    assert reasons == {
        "gpu-1": "disconnected (heartbeat timeout) and not back since; recorded late, as the "
        "disconnect could not be recorded when it happened",
        "gpu-2": "did not reconnect after the control plane started",
    }


def test_a_node_that_returns_with_copies_of_replaced_replicas_has_them_stopped_as_strays() -> None:
    cluster = Cluster()
    cluster.node("gpu-1")
    cluster.model(replicas=1)
    cluster.after(31)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.node("gpu-2")
    cluster.given(NodeDisconnected(node_id="gpu-1", reason="network"))
    cluster.gone("gpu-1")
    cluster.after(61)
    cluster.reconcile()  # lost, replaced on gpu-2
    cluster.serve("llama-2")

    cluster.given(NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(8, "gpu-1")))
    cluster.running("gpu-1", "llama-1", 20000, pid=1234)
    decision = cluster.reconcile()

    strays = of_type(decision, StrayStopped)
    assert [(s.replica_id, s.pid) for s in strays] == [("llama-1", 1234)]
    assert strays[0].rule == "replica llama-1 is lost"
    assert commands(decision) == ["stray-llama-1-0-1234"]
    assert cluster.reconcile().events == ()  # recorded once, while the stop is on its way


def test_a_replica_placed_beside_a_stray_still_stopping_takes_neither_its_port_nor_its_gpu() -> (
    None
):
    """The only node comes back after its replica was lost, its engine still running: the
    engine is stopped as a stray, with a grace, and the replica placed in its place in the
    same pass must not take the port and GPU it still holds (the agent would refuse the
    start, port in use, and the replica fail, its model backing off)."""
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.model(replicas=1)
    cluster.after(31)
    cluster.reconcile()
    cluster.serve("llama-1")
    held = cluster.state.replicas["llama-1"].shards[0]
    cluster.given(NodeDisconnected(node_id="gpu-1", reason="network"))
    cluster.gone("gpu-1")
    cluster.after(61)
    cluster.reconcile()  # lost; nowhere to place it meanwhile

    cluster.given(NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(2, "gpu-1")))
    cluster.running("gpu-1", "llama-1", held.port, pid=1234)
    decision = cluster.reconcile()

    assert [s.replica_id for s in of_type(decision, StrayStopped)] == ["llama-1"]
    [placed] = of_type(decision, ReplicaPlaced)
    assert placed.shards[0].port != held.port
    assert set(placed.shards[0].gpus).isdisjoint(held.gpus)


def test_a_port_an_unknown_engine_holds_is_not_placed_on() -> None:
    """An engine the log knows nothing of holds its port until its node stops reporting it."""
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.running("gpu-1", "other-7", 20000, pid=99)
    cluster.model(replicas=1)
    cluster.after(31)

    decision = cluster.reconcile()

    assert commands(decision) == ["start-llama-1-0", "stray-other-7-0-99"]
    assert of_type(decision, ReplicaPlaced)[0].shards[0].port == 20001


# -- adoption after a restart ----------------------------------------------------------------


def restarted_with_two_serving_replicas() -> Cluster:
    """A control plane at epoch 1 placed two replicas that serve; epoch 2 starts now."""
    cluster = Cluster()
    cluster.given(
        NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(8, "gpu-1")),
        NodeConnected(node_id="gpu-2", address="127.0.0.2", gpus=gpus(8, "gpu-2")),
        ModelDeclared(
            model="llama", spec=ModelSpec(name="llama", command="sim --port {port}", replicas=2)
        ),
        ReplicaPlaced(
            replica_id="llama-1",
            model="llama",
            number=1,
            shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(0,), port=20000),),
        ),
        ReplicaPlaced(
            replica_id="llama-2",
            model="llama",
            number=2,
            shards=(ShardPlacement(index=0, node_id="gpu-2", gpus=(0,), port=20000),),
        ),
        ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1"),
        ShardReady(replica_id="llama-1", shard_index=0, node_id="gpu-1"),
        ReplicaServing(replica_id="llama-1"),
        ShardStarting(replica_id="llama-2", shard_index=0, node_id="gpu-2"),
        ShardReady(replica_id="llama-2", shard_index=0, node_id="gpu-2"),
        ReplicaServing(replica_id="llama-2"),
        epoch=1,
    )
    cluster.after(3600)
    cluster.started_at = cluster.now
    return cluster


def test_a_restarted_control_plane_adopts_what_its_agents_report_and_places_nothing() -> None:
    cluster = restarted_with_two_serving_replicas()

    assert cluster.reconcile().events == ()  # nobody has reconnected: wait, do not place

    cluster.reports["gpu-1"] = NodeReport(node_id="gpu-1")
    cluster.running("gpu-1", "llama-1", 20000)
    cluster.reports["gpu-2"] = NodeReport(node_id="gpu-2")
    cluster.running("gpu-2", "llama-2", 20000)
    cluster.after(1)
    decision = cluster.reconcile()

    adopted = of_type(decision, ReplicaAdopted)
    assert [(a.replica_id, a.rule) for a in adopted] == [
        ("llama-1", "matches the log"),
        ("llama-2", "matches the log"),
    ]
    assert placed_ids(decision) == []
    assert decision.commands == ()
    cluster.after(60)
    assert cluster.reconcile().events == ()  # adopted once per epoch


def test_a_restart_that_placed_before_agents_reconnected_does_not_start_a_second_replica() -> None:
    """The log says llama-3 was placed on port 20004 and never came up; the agent reports the
    engine of llama-3 answering on 20000. The running engine wins, port and all."""
    cluster = restarted_with_two_serving_replicas()
    cluster.given(
        ModelScaled(model="llama", replicas=3, previous=2),
        ReplicaPlaced(
            replica_id="llama-3",
            model="llama",
            number=3,
            shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(1,), port=20004),),
        ),
        epoch=1,
    )
    for node, replica in (("gpu-1", "llama-1"), ("gpu-2", "llama-2")):
        cluster.reports[node] = NodeReport(node_id=node)
        cluster.running(node, replica, 20000)
    cluster.running("gpu-1", "llama-3", 20001, pid=5555)

    decision = cluster.reconcile()

    adopted = {a.replica_id: a for a in of_type(decision, ReplicaAdopted)}
    assert adopted["llama-3"].port == 20001
    assert (
        adopted["llama-3"].rule
        == "the log's copy never came up; the running engine takes its place"
    )
    assert placed_ids(decision) == []
    assert not any(c.command.command_id.startswith("start-") for c in decision.commands)
    assert cluster.state.replicas["llama-3"].shards[0].port == 20001


def test_a_second_copy_of_a_replica_that_came_up_elsewhere_is_a_stray() -> None:
    cluster = restarted_with_two_serving_replicas()
    cluster.reports["gpu-1"] = NodeReport(node_id="gpu-1")
    cluster.running("gpu-1", "llama-1", 20000)
    cluster.reports["gpu-2"] = NodeReport(node_id="gpu-2")
    cluster.running("gpu-2", "llama-2", 20000)
    cluster.running("gpu-2", "llama-1", 20001, pid=999)

    decision = cluster.reconcile()

    (stray,) = of_type(decision, StrayStopped)
    assert stray.node_id == "gpu-2"
    assert stray.rule == "placed on gpu-1, reported by gpu-2"
    assert "stray-llama-1-0-999" in commands(decision)


def test_an_engine_on_another_port_than_the_copy_that_came_up_on_that_node_is_a_stray() -> None:
    cluster = restarted_with_two_serving_replicas()
    cluster.reports["gpu-2"] = NodeReport(node_id="gpu-2")
    cluster.running("gpu-2", "llama-2", 20000)
    cluster.reports["gpu-1"] = NodeReport(node_id="gpu-1")
    cluster.running("gpu-1", "llama-1", 20001, pid=999)

    decision = cluster.reconcile()

    (stray,) = of_type(decision, StrayStopped)
    assert stray.node_id == "gpu-1"
    assert stray.rule.startswith("the log's copy came up on gpu-1 port 20000")
    assert "stray-llama-1-0-999" in commands(decision)


def test_the_stop_of_a_second_copy_does_not_fail_the_replica_whose_copy_came_up() -> None:
    """The agent's ``stopped`` for the stray (its port, its pid, the stray stop's command)
    names the same shard as the log's copy. Before, it was recorded against that copy, and
    the replica failed "stopped without being asked to", its model backing off, for a stop
    adoption asked for. Whether the shard still runs is its node's report's to say: an
    agent runs one engine per shard, so once the node no longer lists it, nothing of it
    runs there, and the replica is lost and replaced, not failed."""
    cluster = restarted_with_two_serving_replicas()
    cluster.reports["gpu-2"] = NodeReport(node_id="gpu-2")
    cluster.running("gpu-2", "llama-2", 20000)
    cluster.reports["gpu-1"] = NodeReport(node_id="gpu-1")
    cluster.running("gpu-1", "llama-1", 20001, pid=999)
    assert "stray-llama-1-0-999" in commands(cluster.reconcile())

    stopped = ShardStatusReport(
        node_id="gpu-1",
        phase=ShardPhaseReport(
            replica_id="llama-1", shard_index=0, phase=ShardPhase.STOPPED, pid=999, exit_code=0
        ),
        port=20001,
        command_id="stray-llama-1-0-999",
    )
    cluster.given(*(event for _, event in agent_reports.decide(cluster.state, stopped)))
    cluster.running("gpu-1", "llama-1", 20001, state="stopped", pid=999)
    after_stop = cluster.reconcile()

    assert of_type(after_stop, ReplicaFailed) == []
    assert cluster.state.replicas["llama-1"].shards[0].phase is ShardPhase.READY

    cluster.reports["gpu-1"] = NodeReport(node_id="gpu-1")  # its heartbeat lists nothing
    gone = cluster.reconcile()

    assert [e.reason for e in of_type(gone, ReplicaLost)] == ["shard 0 no longer runs on gpu-1"]
    assert of_type(gone, ReplicaFailed) == []
    assert placed_ids(gone) == ["llama-3"]
    assert cluster.state.models["llama"].failures == 0


def test_a_shard_its_node_lists_failed_loses_its_replica_which_is_replaced() -> None:
    """The engine of llama-1 exited while its agent was away (the agent was killed, the
    engine died with it): the agent found it gone on start-up and lists the shard
    ``failed`` in its hello and every heartbeat after, as its status could reach no one.
    Before, a shard listed at all counted as present, and the log kept llama-1 serving,
    with no engine, for ever."""
    cluster = restarted_with_two_serving_replicas()
    cluster.running("gpu-2", "llama-2", 20000)
    cluster.running("gpu-1", "llama-1", 20000, state="failed", pid=77)

    decision = cluster.reconcile()

    assert [e.reason for e in of_type(decision, ReplicaLost)] == [
        "shard 0 no longer runs on gpu-1: its agent reports it failed"
    ]
    assert placed_ids(decision) == ["llama-3"]


def starting_on_gpu_1() -> Cluster:
    """llama-1 was placed on gpu-1 and is still starting there: its engine never came up."""
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    assert cluster.state.replicas["llama-1"].shards[0].node_id == "gpu-1"
    cluster.given(ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1", pid=77))
    cluster.running("gpu-1", "llama-1", 20000, state="starting", pid=77)
    return cluster


def test_a_node_cannot_take_over_a_replica_placed_on_another_node() -> None:
    """gpu-2 holds a valid certificate and reports llama-1, which is still starting on gpu-1,
    as ready at a port of its choosing. Before, the log's copy "never came up" and gpu-2's
    engine took its place; the gateway then sent prompts to gpu-2's listener."""
    cluster = starting_on_gpu_1()
    cluster.running("gpu-2", "llama-1", 20000, pid=6666)

    decision = cluster.reconcile()

    assert of_type(decision, ReplicaAdopted) == []
    (stray,) = of_type(decision, StrayStopped)
    assert (stray.node_id, stray.replica_id, stray.pid) == ("gpu-2", "llama-1", 6666)
    assert stray.rule == "placed on gpu-1, reported by gpu-2"
    assert [(c.node_id, c.command.command_id) for c in decision.commands] == [
        ("gpu-2", "stray-llama-1-0-6666")
    ]
    shard = cluster.state.replicas["llama-1"].shards[0]
    assert (shard.node_id, shard.port, shard.pid) == ("gpu-1", 20000, 77)
    assert cluster.phase("llama-1") is ReplicaPhase.STARTING


def test_a_cordoned_node_cannot_take_over_a_replica_either() -> None:
    cluster = starting_on_gpu_1()
    cluster.given(NodeCordoned(node_id="gpu-2", reason="maintenance"))
    cluster.running("gpu-2", "llama-1", 20500, pid=6666)

    decision = cluster.reconcile()

    assert of_type(decision, ReplicaAdopted) == []
    assert [s.rule for s in of_type(decision, StrayStopped)] == [
        "placed on gpu-1, reported by gpu-2"
    ]


def test_a_report_at_a_port_outside_the_node_s_range_is_a_stray_even_on_its_own_node() -> None:
    cluster = starting_on_gpu_1()
    cluster.running("gpu-1", "llama-1", 8080, pid=6666)

    decision = cluster.reconcile()

    assert of_type(decision, ReplicaAdopted) == []
    (stray,) = of_type(decision, StrayStopped)
    assert stray.rule == "port 8080 is outside gpu-1's declared port range 20000-20999"
    assert cluster.state.replicas["llama-1"].shards[0].port == 20000


def test_the_real_engine_still_becomes_ready_after_a_rogue_report_was_refused() -> None:
    cluster = starting_on_gpu_1()
    cluster.running("gpu-2", "llama-1", 20000, pid=6666)
    cluster.reconcile()

    cluster.given(ShardReady(replica_id="llama-1", shard_index=0, node_id="gpu-1"))
    cluster.running("gpu-1", "llama-1", 20000, pid=77)
    decision = cluster.reconcile()

    assert kinds(decision).count("ReplicaServing") == 1
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING
    assert cluster.state.replicas["llama-1"].shards[0].node_id == "gpu-1"


def test_a_shard_the_log_expects_and_no_agent_reports_is_lost_after_the_grace() -> None:
    cluster = restarted_with_two_serving_replicas()
    cluster.reports["gpu-1"] = NodeReport(node_id="gpu-1")
    cluster.running("gpu-1", "llama-1", 20000)
    cluster.reports["gpu-2"] = NodeReport(node_id="gpu-2")  # llama-2's engine is gone

    decision = cluster.reconcile()

    assert [e.replica_id for e in of_type(decision, ReplicaLost)] == ["llama-2"]
    assert placed_ids(decision) == ["llama-3"]


# -- drains ----------------------------------------------------------------------------------


def serving_on_two_of_three_nodes() -> Cluster:
    cluster = Cluster()
    for node in ("gpu-1", "gpu-2", "gpu-3"):
        cluster.node(node)
    cluster.model(replicas=2)
    cluster.after(31)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    return cluster


def test_a_drain_moves_the_replica_and_stops_the_original_only_after_the_replacement_served() -> (
    None
):
    cluster = serving_on_two_of_three_nodes()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id="drain-1", grace_s=600))

    decision = cluster.reconcile()
    assert kinds(decision) == ["ReplicaDrainStarted", "ReplicaPlaced"]
    placed = of_type(decision, ReplicaPlaced)[0]
    assert placed.replaces == "llama-1"
    assert placed.shards[0].node_id not in (node,)
    assert {p.correlation_id for p in decision.events} == {"drain-1"}

    cluster.serve("llama-3")
    assert cluster.phase("llama-1") is ReplicaPhase.DRAINING  # serving, but not long enough
    cluster.after(9)
    assert cluster.reconcile().events == ()

    cluster.after(2)
    decision = cluster.reconcile()
    assert kinds(decision) == ["ReplacementServing", "ReplicaStopping"]
    assert "stop-llama-1-0" in commands(decision)

    cluster.stop_reported("llama-1")
    decision = cluster.reconcile()
    assert kinds(decision) == ["ReplicaStopped", "NodeDrainFinished"]
    assert of_type(decision, NodeDrainFinished)[0].outcome == "every replica moved"


def test_a_leader_that_takes_over_a_move_ends_it_only_once_an_agent_reports_the_replacement() -> (
    None
):
    """The leader that saw the replacement come up dies; its successor has heard from no
    agent yet. The replacement served for the window by the log, but nobody watched it for
    most of it: it may have died meanwhile. The original keeps serving until the
    replacement's node says it still runs."""
    cluster = serving_on_two_of_three_nodes()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id="drain-1", grace_s=600))
    cluster.reconcile()
    cluster.serve("llama-3")
    replacement_node = cluster.state.replicas["llama-3"].shards[0].node_id
    cluster.after(1)
    cluster.started_at = cluster.now  # a new leader: no agent has said hello to it
    cluster.reports = {}

    cluster.after(10)
    assert of_type(cluster.reconcile(), ReplacementServing) == []
    assert cluster.phase("llama-1") is ReplicaPhase.DRAINING

    cluster.reports[replacement_node] = NodeReport(node_id=replacement_node)
    cluster.running(replacement_node, "llama-3", cluster.state.replicas["llama-3"].shards[0].port)
    decision = cluster.reconcile()
    assert [e.replacement_id for e in of_type(decision, ReplacementServing)] == ["llama-3"]
    assert cluster.phase("llama-1") is ReplicaPhase.STOPPING


def test_a_replacement_its_node_no_longer_reports_does_not_end_the_move() -> None:
    cluster = serving_on_two_of_three_nodes()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id="drain-1", grace_s=600))
    cluster.reconcile()
    cluster.serve("llama-3")
    replacement_node = cluster.state.replicas["llama-3"].shards[0].node_id
    cluster.given(NodeDisconnected(node_id=replacement_node, reason="network"))
    cluster.gone(replacement_node)

    cluster.after(11)
    decision = cluster.reconcile()

    assert of_type(decision, ReplacementServing) == []
    assert cluster.phase("llama-1") is ReplicaPhase.DRAINING


def test_a_drain_of_a_node_nothing_served_on_says_so_rather_than_every_replica_moved() -> None:
    cluster = serving_on_two_of_three_nodes()
    used = {s.node_id for r in cluster.state.replicas.values() for s in r.shards}
    (empty,) = {"gpu-1", "gpu-2", "gpu-3"} - used
    cluster.given(NodeDrainRequested(node_id=empty, drain_id="drain-1", grace_s=600))

    decision = cluster.reconcile()

    finished = of_type(decision, NodeDrainFinished)
    assert [(f.outcome, f.succeeded) for f in finished] == [
        ("no replica was serving on the node", True)
    ]


def test_a_drain_that_only_stopped_a_replica_not_serving_yet_moved_nothing() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id="d", grace_s=600))
    cluster.reconcile()

    cluster.stop_reported("llama-1")
    decision = cluster.reconcile()

    finished = of_type(decision, NodeDrainFinished)
    assert [(f.outcome, f.succeeded) for f in finished] == [
        ("no replica was serving on the node", True)
    ]


def test_a_flapping_replacement_does_not_stop_the_original() -> None:
    cluster = serving_on_two_of_three_nodes()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id="drain-1", grace_s=600))
    cluster.reconcile()
    cluster.serve("llama-3")
    cluster.after(5)
    replacement_node = cluster.state.replicas["llama-3"].shards[0].node_id
    cluster.given(
        ShardFailed(replica_id="llama-3", shard_index=0, node_id=replacement_node, error="crash")
    )

    decision = cluster.reconcile()

    assert [e.replica_id for e in of_type(decision, ReplicaFailed)] == ["llama-3"]
    assert of_type(decision, ReplacementServing) == []
    assert of_type(decision, ReplicaStopping) == []
    assert cluster.phase("llama-1") is ReplicaPhase.DRAINING
    assert cluster.state.replicas["llama-1"].routable
    cluster.after(11)
    again = cluster.reconcile()  # backoff over: another replacement, for the same original
    assert [p.replaces for p in of_type(again, ReplicaPlaced)] == ["llama-1"]


def test_draining_the_only_capable_node_finishes_at_the_grace_period() -> None:
    cluster = Cluster()
    cluster.node("gpu-1")
    cluster.node("gpu-2", n_gpus=1)
    cluster.model(replicas=1, gpus_per_shard=4)
    cluster.after(31)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.given(NodeDrainRequested(node_id="gpu-1", drain_id="drain-9", grace_s=300))

    decision = cluster.reconcile()
    assert kinds(decision) == ["ReplicaDrainStarted", "ModelUnplaceable"]
    cluster.after(299)
    assert of_type(cluster.reconcile(), ReplicaStopping) == []

    cluster.after(2)
    decision = cluster.reconcile()
    (stopping,) = of_type(decision, ReplicaStopping)
    assert stopping.reason == "drain drain-9: grace ran out before a replacement served"
    cluster.stop_reported("llama-1")
    finished = of_type(cluster.reconcile(), NodeDrainFinished)
    assert finished[0].outcome == "grace ran out; what was left was stopped"


def test_at_most_one_replica_of_a_model_moves_at_a_time() -> None:
    cluster = Cluster()
    for node in ("gpu-1", "gpu-2"):
        cluster.node(node)
    cluster.model(replicas=2)
    cluster.after(31)
    cluster.reconcile()
    # Put both on gpu-1 for the story: drain a node holding two replicas of one model.
    cluster.state.replicas.clear()
    cluster.given(
        ReplicaPlaced(
            replica_id="llama-1",
            model="llama",
            number=1,
            shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(0,), port=20000),),
        ),
        ReplicaPlaced(
            replica_id="llama-2",
            model="llama",
            number=2,
            shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(1,), port=20001),),
        ),
    )
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    cluster.given(NodeDrainRequested(node_id="gpu-1", drain_id="d", grace_s=600))

    started = of_type(cluster.reconcile(), ReplicaDrainStarted)

    assert [s.replica_id for s in started] == ["llama-1"]


def test_a_replica_not_yet_serving_on_a_draining_node_is_stopped_at_once() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id="d", grace_s=600))

    decision = cluster.reconcile()

    assert (
        of_type(decision, ReplicaStopping)[0].reason == "drain d: not serving yet, nothing to move"
    )
    assert placed_ids(decision) == ["llama-2"]


def test_a_stopping_replica_is_stopped_once_its_shards_are_gone() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.given(ModelScaled(model="llama", replicas=0, previous=1))
    cluster.reconcile()
    assert cluster.phase("llama-1") is ReplicaPhase.STOPPING
    cluster.stop_reported("llama-1")

    assert of_type(cluster.reconcile(), ReplicaStopped) == [ReplicaStopped(replica_id="llama-1")]


def test_a_stopping_replica_whose_node_lists_its_shard_failed_is_stopped() -> None:
    """The agent was killed while it stopped llama-1's engine, after the engine exited and
    before it reported ``stopped``: started again, it finds the engine gone and lists the
    shard ``failed`` in its hello. Before, only a shard the node no longer listed counted
    as gone, and the replica stayed stopping for ever."""
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.given(ModelScaled(model="llama", replicas=0, previous=1))
    cluster.reconcile()
    assert cluster.phase("llama-1") is ReplicaPhase.STOPPING
    node_id = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.reports[node_id] = NodeReport(node_id=node_id)
    cluster.running(node_id, "llama-1", 20000, state="failed")

    assert of_type(cluster.reconcile(), ReplicaStopped) == [ReplicaStopped(replica_id="llama-1")]


def test_a_stopping_replica_whose_engine_the_log_never_heard_start_waits_for_its_stop() -> None:
    """The agent started llama-1's engine, and its connection dropped before the status
    reached the log: the log has the shard only placed, and the agent's next hello lists
    the engine. Before, the replica was recorded stopped while the engine ran, and its GPU
    was free to be placed again under it."""
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=1)
    cluster.model(replicas=1)
    cluster.after(31)
    assert commands(cluster.reconcile()) == ["start-llama-1-0"]
    cluster.running("gpu-1", "llama-1", 20000, state="starting", pid=77)  # its hello
    cluster.given(ModelScaled(model="llama", replicas=0, previous=1))

    stopping = cluster.reconcile()
    assert kinds(stopping) == ["ReplicaStopping"]
    assert commands(stopping) == ["stop-llama-1-0"]
    cluster.given(ModelScaled(model="llama", replicas=1, previous=0))
    again = cluster.reconcile()

    assert of_type(again, ReplicaStopped) == []
    assert placed_ids(again) == []  # the node's one GPU still runs llama-1's engine
    assert commands(again) == ["stop-llama-1-0"]
    assert cluster.phase("llama-1") is ReplicaPhase.STOPPING

    cluster.stop_reported("llama-1")  # the agent obeys the stop
    stopped = cluster.reconcile()

    assert kinds(stopped) == ["ReplicaStopped", "ReplicaPlaced"]
    assert placed_ids(stopped) == ["llama-2"]


def test_a_ready_shard_the_log_missed_is_caught_up_from_the_agents_report() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.given(ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1"))
    cluster.running("gpu-1", "llama-1", 20000, state="ready")  # its shard_ready was lost

    decision = cluster.reconcile()

    assert of_type(decision, ShardReady) == [
        ShardReady(replica_id="llama-1", shard_index=0, node_id="gpu-1")
    ]
    assert of_type(decision, ReplicaAdopted) == []  # this leader placed it: nothing to adopt
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING


def test_a_shard_is_adopted_once_per_epoch_even_when_it_turns_ready_afterwards() -> None:
    """After a restart the agent re-checks a re-attached engine: its hello says starting,
    its next heartbeat ready. Before, that made a second replica_adopted."""
    cluster = restarted_with_two_serving_replicas()
    cluster.running("gpu-1", "llama-1", 20000, state="starting")
    cluster.running("gpu-2", "llama-2", 20000)
    first = cluster.reconcile()
    assert [a.replica_id for a in of_type(first, ReplicaAdopted)] == ["llama-1", "llama-2"]
    assert cluster.state.replicas["llama-1"].shards[0].came_up  # the engine that came up

    cluster.running("gpu-1", "llama-1", 20000, state="ready")
    second = cluster.reconcile()

    assert of_type(second, ReplicaAdopted) == []
    assert kinds(second) == ["ShardReady"]
    assert cluster.state.replicas["llama-1"].shards[0].phase.value == "ready"


def test_a_shard_that_stops_unasked_fails_its_replica() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.given(ShardStopped(replica_id="llama-1", shard_index=0, node_id="gpu-1", exit_code=0))

    (failed,) = of_type(cluster.reconcile(), ReplicaFailed)

    assert failed.reason == "shard 0 on gpu-1 stopped without being asked to"


def test_a_stopping_replica_on_a_node_not_back_yet_is_not_taken_for_stopped() -> None:
    cluster = restarted_with_two_serving_replicas()
    cluster.given(ReplicaStopping(replica_id="llama-2", reason="drain d"), epoch=1)
    cluster.reports["gpu-1"] = NodeReport(node_id="gpu-1")
    cluster.running("gpu-1", "llama-1", 20000)  # gpu-2 has not said hello to us yet

    assert of_type(cluster.reconcile(), ReplicaStopped) == []

    cluster.reports["gpu-2"] = NodeReport(node_id="gpu-2")  # back, and the engine is gone
    assert of_type(cluster.reconcile(), ReplicaStopped) == [ReplicaStopped(replica_id="llama-2")]


# -- stopping a replica taken out of routing once it is idle ---------------------------------


def scaled_down_while_serving(**settings: float) -> Cluster:
    """llama-1 serves, then the model is scaled to 0: it leaves routing (stopping)."""
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.given(ModelScaled(model="llama", replicas=0, previous=1))
    cluster.reconcile(**settings)
    assert cluster.phase("llama-1") is ReplicaPhase.STOPPING
    return cluster


def test_a_replica_out_of_routing_keeps_running_while_a_gateway_reports_requests_on_it() -> None:
    cluster = scaled_down_while_serving(quiesce_s=2.0)
    cluster.in_flight = {"llama-1": 3, "llama-2": 0}

    cluster.after(1)
    assert commands(cluster.reconcile(quiesce_s=2.0)) == []  # quiescing
    cluster.after(10)
    assert commands(cluster.reconcile(quiesce_s=2.0)) == []  # still busy

    cluster.in_flight = {}
    assert commands(cluster.reconcile(quiesce_s=2.0)) == ["stop-llama-1-0"]


def test_an_idle_replica_out_of_routing_is_stopped_once_the_quiesce_time_has_passed() -> None:
    cluster = scaled_down_while_serving(quiesce_s=2.0)
    cluster.in_flight = {"llama-1": 0, "other-1": 5}

    cluster.after(1.5)
    assert commands(cluster.reconcile(quiesce_s=2.0)) == []
    cluster.after(0.5)
    assert commands(cluster.reconcile(quiesce_s=2.0)) == ["stop-llama-1-0"]


def test_an_idle_replica_stops_before_the_quiesce_time_once_every_gateway_routes_without_it() -> (
    None
):
    cluster = scaled_down_while_serving(quiesce_s=2.0)
    cluster.after(0.2)
    assert commands(cluster.reconcile(quiesce_s=2.0)) == []  # the next pass sees it stopping
    left = cluster.left_routing["llama-1"]
    assert left == cluster.state.position  # where this leader first saw it stopping

    cluster.after(0.3)
    cluster.routing_seen = left - 1  # one gateway still routes by a table with it
    assert commands(cluster.reconcile(quiesce_s=2.0)) == []
    cluster.routing_seen = left
    cluster.in_flight = {"llama-1": 1}  # every gateway routes without it; one is still busy
    assert commands(cluster.reconcile(quiesce_s=2.0)) == []
    cluster.in_flight = {}
    assert commands(cluster.reconcile(quiesce_s=2.0)) == ["stop-llama-1-0"]


def test_a_silent_gateway_keeps_a_replica_out_of_routing_running_until_the_idle_timeout() -> None:
    cluster = scaled_down_while_serving(quiesce_s=2.0, drain_idle_timeout_s=60.0)
    cluster.after(0.2)
    cluster.reconcile(quiesce_s=2.0, drain_idle_timeout_s=60.0)
    # The live gateways all route without it and have nothing open on it, but one gateway
    # has gone silent: it may still be streaming an answer from it.
    cluster.routing_seen = cluster.left_routing["llama-1"]
    cluster.silent_gateways = 1

    cluster.after(10)
    assert commands(cluster.reconcile(quiesce_s=2.0, drain_idle_timeout_s=60.0)) == []
    cluster.silent_gateways = 0  # it reported again (or was silent long enough to be gone)
    decision = cluster.reconcile(quiesce_s=2.0, drain_idle_timeout_s=60.0)
    assert commands(decision) == ["stop-llama-1-0"]


def test_a_silent_gateway_holds_a_replica_no_longer_than_the_idle_timeout() -> None:
    cluster = scaled_down_while_serving(quiesce_s=2.0, drain_idle_timeout_s=60.0)
    cluster.silent_gateways = 1

    cluster.after(59.9)
    assert commands(cluster.reconcile(quiesce_s=2.0, drain_idle_timeout_s=60.0)) == []
    cluster.after(0.1)
    decision = cluster.reconcile(quiesce_s=2.0, drain_idle_timeout_s=60.0)
    assert commands(decision) == ["stop-llama-1-0"]


def test_without_word_of_the_gateways_routing_the_quiesce_time_is_waited_out() -> None:
    cluster = scaled_down_while_serving(quiesce_s=2.0)
    cluster.routing_seen = None  # no live gateway, or one that does not say

    cluster.after(1.9)
    assert commands(cluster.reconcile(quiesce_s=2.0)) == []
    cluster.after(0.1)
    assert commands(cluster.reconcile(quiesce_s=2.0)) == ["stop-llama-1-0"]


def test_a_leader_that_starts_takes_a_stopping_replica_as_leaving_where_it_first_sees_it() -> None:
    cluster = scaled_down_while_serving(quiesce_s=2.0)
    earlier = cluster.state.position  # the replica left routing at or before it
    cluster.left_routing = {}  # a new leader: nothing in its memory
    cluster.given(ModelScaled(model="llama", replicas=0, previous=0))  # the log moves on
    cluster.routing_seen = earlier  # gateways caught up with the leaving, not with the rest

    cluster.after(0.5)
    assert commands(cluster.reconcile(quiesce_s=2.0)) == []  # not known to be enough
    assert cluster.left_routing["llama-1"] > earlier
    cluster.routing_seen = cluster.left_routing["llama-1"]
    assert commands(cluster.reconcile(quiesce_s=2.0)) == ["stop-llama-1-0"]


def test_a_replica_that_stopped_is_forgotten_by_the_leaving_memory() -> None:
    cluster = scaled_down_while_serving()
    cluster.in_flight = {"llama-1": 1}
    cluster.reconcile()
    assert set(cluster.left_routing) == {"llama-1"}
    cluster.stop_reported("llama-1")
    cluster.reconcile()
    assert cluster.phase("llama-1") is not ReplicaPhase.STOPPING
    assert note_left_routing(cluster.left_routing, cluster.state) == {}


def test_requests_reported_forever_stop_holding_a_replica_after_the_idle_timeout() -> None:
    cluster = scaled_down_while_serving(quiesce_s=2.0, drain_idle_timeout_s=60.0)
    cluster.in_flight = {"llama-1": 1}

    cluster.after(59.9)
    assert commands(cluster.reconcile(quiesce_s=2.0, drain_idle_timeout_s=60.0)) == []
    cluster.after(0.1)
    decision = cluster.reconcile(quiesce_s=2.0, drain_idle_timeout_s=60.0)
    assert commands(decision) == ["stop-llama-1-0"]


# -- shards their agents stopped on purpose --------------------------------------------------

SHUTDOWN = "agent shutting down"


def stopped_by_their_agents_and_restarted() -> Cluster:
    """llama-1 and llama-2 served; both agents stopped their engines on purpose and left,
    and the control plane started again an hour later (epoch 2, nobody reconnected yet)."""
    cluster = restarted_with_two_serving_replicas()
    cluster.after(-3600)
    for replica, node in (("llama-1", "gpu-1"), ("llama-2", "gpu-2")):
        cluster.given(
            ShardStopped(replica_id=replica, shard_index=0, node_id=node, reason=SHUTDOWN),
            epoch=1,
        )
    cluster.given(
        NodeDisconnected(node_id="gpu-1", reason="closed 1001"),
        NodeDisconnected(node_id="gpu-2", reason="closed 1001"),
        epoch=1,
    )
    cluster.after(3600)
    cluster.started_at = cluster.now
    return cluster


def test_a_replica_whose_agent_stopped_its_shard_on_purpose_waits_placed_out_of_routing() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.given(
        ShardStopped(replica_id="llama-1", shard_index=0, node_id="gpu-1", reason=SHUTDOWN)
    )
    cluster.running("gpu-1", "llama-1", 20000, state="stopped")

    decision = cluster.reconcile()

    replica = cluster.state.replicas["llama-1"]
    assert (replica.phase, replica.routable) == (ReplicaPhase.PLACED, False)
    assert replica.shards[0].stop_reason == SHUTDOWN
    assert decision.events == (), "neither failed, nor lost, nor replaced"
    cluster.gone("gpu-1")
    cluster.given(NodeDisconnected(node_id="gpu-1", reason="closed 1001"))
    cluster.after(600)  # far past the startup timeout: the node being away is not a startup
    assert cluster.reconcile(lost_timeout_s=3600).events == ()


def test_replicas_stopped_by_their_agents_start_again_under_their_own_names() -> None:
    cluster = stopped_by_their_agents_and_restarted()

    for node in ("gpu-1", "gpu-2"):
        cluster.given(NodeConnected(node_id=node, address="127.0.0.1", gpus=gpus(8, node)))
        cluster.reports[node] = NodeReport(node_id=node)  # no shards: the engines are gone
    cluster.after(1)
    decision = cluster.reconcile()

    assert of_type(decision, ReplicaLost) == []
    assert of_type(decision, ReplicaStartupTimedOut) == []
    assert placed_ids(decision) == []
    assert commands(decision) == ["start-llama-1-0", "start-llama-2-0"]
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    assert cluster.phase("llama-1") is cluster.phase("llama-2") is ReplicaPhase.SERVING
    assert of_type(cluster.reconcile(), ReplicaAdopted) == [], "this leader started them"


def test_agents_still_arriving_past_the_least_grace_keep_a_node_from_being_given_up() -> None:
    cluster = stopped_by_their_agents_and_restarted()
    cluster.given(NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(8, "gpu-1")))
    cluster.reports["gpu-1"] = NodeReport(node_id="gpu-1")

    for _ in range(10):  # a storm: hellos and handshakes keep arriving past the 30 s
        cluster.after(9)
        cluster.arrivals = Arrivals(last_hello_at=cluster.now, connections_opening=40)
        decision = cluster.reconcile()
        assert of_type(decision, ReplicaLost) == []
        assert of_type(decision, NodeDisconnected) == []
        assert placed_ids(decision) == []

    cluster.arrivals = Arrivals(last_hello_at=cluster.now)
    cluster.after(10)  # then nothing more for the quiet period: gpu-2 is given up
    decision = cluster.reconcile()

    assert [e.replica_id for e in of_type(decision, ReplicaLost)] == ["llama-2"]
    assert placed_ids(decision) == ["llama-3"]


def test_a_replica_stopped_by_its_agent_is_lost_with_its_node_and_replaced() -> None:
    cluster = stopped_by_their_agents_and_restarted()
    cluster.given(NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(8, "gpu-1")))
    cluster.reports["gpu-1"] = NodeReport(node_id="gpu-1")

    cluster.after(31)  # past the grace; gpu-2 has been away for an hour
    decision = cluster.reconcile()

    assert [e.replica_id for e in of_type(decision, ReplicaLost)] == ["llama-2"]
    assert placed_ids(decision) == ["llama-3"]
    assert "start-llama-1-0" in commands(decision)


def test_a_draining_replica_whose_agent_stops_its_shard_is_stopped_not_restarted() -> None:
    cluster = serving_on_two_of_three_nodes()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id="drain-1", grace_s=600))
    cluster.reconcile()
    assert cluster.phase("llama-1") is ReplicaPhase.DRAINING
    cluster.given(ShardStopped(replica_id="llama-1", shard_index=0, node_id=node, reason=SHUTDOWN))
    cluster.running(node, "llama-1", 20000, state="stopped")

    decision = cluster.reconcile()

    assert kinds(decision)[:2] == ["ReplicaStopping", "ReplicaStopped"]
    assert "start-llama-1-0" not in commands(decision)
    assert of_type(decision, ReplicaFailed) == []


def test_a_drain_whose_replica_ended_without_a_replacement_does_not_say_it_moved_it() -> None:
    cluster = serving_on_two_of_three_nodes()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id="drain-1", grace_s=600))
    cluster.reconcile()
    cluster.given(ShardStopped(replica_id="llama-1", shard_index=0, node_id=node, reason=SHUTDOWN))
    cluster.running(node, "llama-1", 20000, state="stopped")

    (finished,) = of_type(cluster.reconcile(), NodeDrainFinished)

    assert finished.outcome.startswith("0 moved; 1 ended without a replacement: llama-1 (")
    assert SHUTDOWN in finished.outcome


def test_a_model_scaled_to_zero_while_a_replica_is_moved_stops_that_one_with_the_rest() -> None:
    cluster = serving_on_two_of_three_nodes()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id="drain-1", grace_s=3600))
    cluster.reconcile()  # llama-1 draining, llama-3 placed to replace it
    cluster.given(ModelScaled(model="llama", replicas=0, previous=2))

    stopping = of_type(cluster.reconcile(), ReplicaStopping)

    assert sorted((s.replica_id, s.reason) for s in stopping) == [
        ("llama-1", "scaled down to 0"),
        ("llama-2", "scaled down to 0"),
        ("llama-3", "scaled down to 0"),
    ]
    for replica_id in ("llama-1", "llama-2", "llama-3"):
        cluster.stop_reported(replica_id)
    (finished,) = of_type(cluster.reconcile(), NodeDrainFinished)
    # The model asked for none: llama-1 was not needed, and the drain says so, succeeded.
    assert (finished.outcome, finished.succeeded) == (
        "every replica moved or was not needed: 0 moved; 1 stopped with its model at its "
        "count without it: llama-1 (scaled down to 0)",
        True,
    )


def test_a_restarted_replica_that_never_comes_up_still_times_out() -> None:
    cluster = stopped_by_their_agents_and_restarted()
    for node in ("gpu-1", "gpu-2"):
        cluster.given(NodeConnected(node_id=node, address="127.0.0.1", gpus=gpus(8, node)))
        cluster.reports[node] = NodeReport(node_id=node)
    cluster.after(1)
    cluster.reconcile()  # start commands go out; the agents never answer them

    cluster.after(601)
    timed_out = of_type(cluster.reconcile(), ReplicaStartupTimedOut)

    assert sorted(e.replica_id for e in timed_out) == ["llama-1", "llama-2"]
