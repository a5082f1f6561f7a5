"""A rollout of 1,000 replicas driven through the pure reconcile decision, for
``benchmarks/reconcile.py``.

The fleet is the script's (1,000 nodes of 8 GPUs, 4,000 replicas of 40 models) plus one
model, ``big``, of 1,000 single-GPU replicas, one on every node (GPU 4): 5,000 replicas
serving, 3,000 GPUs free for the surge. Its revision changes (a new command) with a policy
of one canary step (10 replicas, 5 % of the traffic, held 60 s) and then every replica.
From there, round after round until ``RolloutFinished`` (or a bound on the passes):

1. one pass, ``decide(state, fleet, now, settings)``: the only thing timed (and, apart,
   ``traffic_wanted``, which the service runs before each pass), followed by one pass
   over the fleet as it was before the revision changed, when nothing is to be done:
   the steady pass, timed the same way, so that both are measured over the same seconds
   of a machine whose load comes and goes;
2. its events are folded into the state, as the store does once they are appended;
3. the simulated agents carry out its commands: a started shard reports ``starting`` at
   once and ``ready`` a round later; a stopped shard reports ``stopped`` and leaves its
   node's report;
4. the clock moves on ``TICK_S``.

While a step holds, the gateways' figures are good ones (the canary as fast as the others,
no errors), so the step is promoted. Every round checks that as many replicas of the
model serve as it desires (``max_unavailable`` is 0).
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta

import msgspec
from msgspec.structs import replace

from app.domain.commands import StartShard
from app.domain.decision import Decision
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    ReplicaPlaced,
    ReplicaServing,
    RolloutFinished,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    ShardStopped,
)
from app.domain.evolve import evolve
from app.domain.model_operations import apply_model
from app.domain.model_spec import CanaryStep, ModelSpec, RolloutPolicy
from app.domain.reconcile import Settings, decide
from app.domain.reports import FleetView, NodeReport, ReportedShard
from app.domain.rollout_reads import canary_group, stable_group, traffic_wanted
from app.domain.state import ClusterState, ReplicaPhase
from app.domain.traffic import TrafficFigures

MODEL = "big"
GPU = 4
"""The GPU of every node that the model's replicas take (the script's fleet uses 0-3)."""
TICK_S = 5.0
"""Time between passes. In production a pass that decided something wakes the next at
once and one that did not waits for the interval (1 s) or a change; the figures depend on
what the state holds, not on the clock, and 5 s keeps a surge of 1 to a countable number
of passes (each move: placed, starting, ready, serving, the 10 s stability window,
stopping, stopped)."""
CANARY = CanaryStep(replicas=10, traffic=0.05, hold_s=60.0)
NEW_COMMAND = "vllm serve big --port {port} --revision 2"
EPOCH = 1


class RolloutRun(msgspec.Struct, frozen=True, kw_only=True):
    """One rollout, or its first ``passes`` passes when it did not finish within them."""

    max_surge: int
    passes: int
    finished: bool
    replaced: int
    """Replicas of the new revision serving at the end."""
    max_moves: int
    """The most moves of the rollout under way after a pass."""
    events: int
    commands: int
    pass_ms: list[float]
    steady_ms: list[float]
    """A steady pass timed after each pass of the rollout."""
    traffic_wanted_ms: list[float]
    """``traffic_wanted`` on the passes a step held (on the others it finds no rollout
    holding and returns at once)."""
    simulated_s: float
    """The rollout's time on the simulated clock."""
    wall_s: float


def _recorded(position: int, event: AnyEvent, at: datetime, correlation: str | None) -> Recorded:
    return Recorded(
        position=position,
        stream="s",
        version=1,
        event_id=uuid.UUID(int=position),
        recorded_at=at,
        meta=Meta(actor="bench", epoch=EPOCH, correlation_id=correlation),
        event=event,
    )


def with_model(state: ClusterState, view: FleetView, replicas: int, at: datetime) -> FleetView:
    """Declare ``MODEL`` in ``state`` with ``replicas`` serving replicas, one per node on
    ``GPU``; the fleet view with their shards reported ready."""
    nodes = sorted(state.nodes)
    if replicas > len(nodes):
        raise ValueError(f"{replicas} replicas of {MODEL} need as many nodes, not {len(nodes)}")

    def fold(event: AnyEvent) -> None:
        evolve(state, _recorded(state.position + 1, event, at, None))

    spec = ModelSpec(name=MODEL, command="vllm serve big --port {port}", replicas=replicas)
    fold(ModelDeclared(model=MODEL, spec=spec))
    reports = dict(view.reports)
    port = 20000 + GPU
    for n, node in enumerate(nodes[:replicas]):
        replica_id, pid = f"{MODEL}-{n + 1}", 90_000 + n
        shard = ShardPlacement(index=0, node_id=node, gpus=(GPU,), port=port)
        fold(ReplicaPlaced(replica_id=replica_id, model=MODEL, number=n + 1, shards=(shard,)))
        fold(ShardStarting(replica_id=replica_id, shard_index=0, node_id=node, pid=pid))
        fold(ShardReady(replica_id=replica_id, shard_index=0, node_id=node))
        fold(ReplicaServing(replica_id=replica_id))
        shards = dict(reports[node].shards)
        shards[(replica_id, 0)] = ReportedShard(
            replica_id=replica_id, shard_index=0, model=MODEL, port=port, pid=pid, state="ready"
        )
        reports[node] = replace(reports[node], shards=shards)
    return replace(view, reports=reports)


def good_figures(requests: int) -> TrafficFigures:
    """What the gateways measured of a healthy group: no errors, the same latencies."""
    return TrafficFigures(
        window_s=60.0,
        gateways=4,
        requests=requests,
        errors=0,
        cancelled=0,
        error_rate=0.0,
        ttft_p95_ms=180.0,
        ttft_samples=requests,
        tpot_p95_ms=21.0,
        tpot_samples=requests,
        latency_p95_ms=2300.0,
        latency_samples=requests,
    )


class Simulation:
    """A log being written by the passes and by agents that do what the passes ask."""

    def __init__(
        self, state: ClusterState, view: FleetView, now: datetime, settings: Settings
    ) -> None:
        self.state = state.copy()
        self.reports = dict(view.reports)
        self.now = now
        self.settings = settings
        self._coming_up: list[tuple[str, int, str]] = []
        """Shards that reported ``starting`` this round: ``ready`` the next."""

    def fold(self, event: AnyEvent, correlation: str | None = None) -> None:
        evolve(self.state, _recorded(self.state.position + 1, event, self.now, correlation))

    def revise(self, max_surge: int) -> str:
        """The new revision of ``MODEL`` declared, with ``max_surge``; the rollout's id."""
        spec = self.state.models[MODEL].spec
        policy = RolloutPolicy(max_surge=max_surge, steps=(CANARY,))
        change = apply_model(self.state, replace(spec, command=NEW_COMMAND, rollout=policy))
        for event in change.events:
            self.fold(event)
        rollout = self.state.models[MODEL].rollout
        assert rollout is not None, "the revision should start a rollout"
        assert rollout.under_way, "the revision should start a rollout"
        return rollout.id

    def view(self, traffic: dict[str, TrafficFigures]) -> FleetView:
        return FleetView(reports=self.reports, traffic=traffic)

    def apply(self, decision: Decision) -> None:
        """The decision's events recorded, then the agents' answers to its commands."""
        for planned in decision.events:
            self.fold(planned.event, planned.correlation_id)
        for replica_id, index, node in self._coming_up:
            self.fold(ShardReady(replica_id=replica_id, shard_index=index, node_id=node))
            self._report(node, replica_id, index, "ready")
        self._coming_up = []
        for sent in decision.commands:
            command, node = sent.command, sent.node_id
            if isinstance(command, StartShard):
                pid = 100_000 + self.state.position
                self.fold(
                    ShardStarting(
                        replica_id=command.replica_id,
                        shard_index=command.shard_index,
                        node_id=node,
                        pid=pid,
                    )
                )
                self._report(node, command.replica_id, command.shard_index, "starting", pid)
                self._coming_up.append((command.replica_id, command.shard_index, node))
            else:
                self.fold(
                    ShardStopped(
                        replica_id=command.replica_id, shard_index=command.shard_index, node_id=node
                    )
                )
                self._report(node, command.replica_id, command.shard_index, None)

    def _report(
        self, node: str, replica_id: str, index: int, state: str | None, pid: int | None = None
    ) -> None:
        report = self.reports[node]
        shards = dict(report.shards)
        key = (replica_id, index)
        if state is None:
            shards.pop(key, None)
        else:
            known = shards.get(key)
            port = self.state.replicas[replica_id].shards[index].port
            shards[key] = ReportedShard(
                replica_id=replica_id,
                shard_index=index,
                model=MODEL,
                port=port,
                pid=known.pid if known and pid is None else pid,
                state=state,
            )
        self.reports[node] = NodeReport(node_id=node, shards=shards, greeting=report.greeting)

    def serving(self, rollout_id: str) -> tuple[int, int, int]:
        """``(available, of the new revision, moves under way)``: available counts a move's
        original and its serving replacement once."""
        model = self.state.models[MODEL]
        replicas = [r for r in self.state.replicas.values() if r.model == MODEL]
        live = [r for r in replicas if r.phase in (ReplicaPhase.SERVING, ReplicaPhase.DRAINING)]
        doubled = {r.replaces for r in live if r.phase is ReplicaPhase.SERVING and r.replaces}
        available = sum(
            1 for r in live if not (r.phase is ReplicaPhase.DRAINING and r.id in doubled)
        )
        new = sum(
            1 for r in replicas if r.phase is ReplicaPhase.SERVING and r.revision == model.revision
        )
        moves = sum(
            1 for r in live if r.drain_id == rollout_id and r.phase is ReplicaPhase.DRAINING
        )
        return available, new, moves


def run_rollout(
    state: ClusterState,
    view: FleetView,
    now: datetime,
    settings: Settings,
    max_surge: int,
    max_passes: int,
) -> RolloutRun:
    """Drive a rollout of ``MODEL`` with ``max_surge`` until it finishes, or for
    ``max_passes`` passes (0: no bound)."""
    steady_fleet = FleetView(reports=dict(view.reports))
    steady_ms: list[float] = []
    sim = Simulation(state, view, now, settings)
    desired = sim.state.models[MODEL].desired
    rollout_id = sim.revise(max_surge)
    pass_ms: list[float] = []
    wanted_ms: list[float] = []
    events = commands = max_moves = replaced = 0
    finished = False
    started = time.perf_counter()
    while not finished and (max_passes <= 0 or len(pass_ms) < max_passes):
        begun = time.perf_counter()
        wanted = traffic_wanted(sim.state)
        took = (time.perf_counter() - begun) * 1000
        traffic = {}
        if wanted:
            wanted_ms.append(took)
            traffic = {
                canary_group(MODEL): good_figures(200),
                stable_group(MODEL): good_figures(4000),
            }
        fleet = sim.view(traffic)
        begun = time.perf_counter()
        decision = decide(sim.state, fleet, sim.now, settings)
        pass_ms.append((time.perf_counter() - begun) * 1000)
        begun = time.perf_counter()
        decide(state, steady_fleet, now, settings)
        steady_ms.append((time.perf_counter() - begun) * 1000)
        events += len(decision.events)
        commands += len(decision.commands)
        finished = any(isinstance(p.event, RolloutFinished) for p in decision.events)
        sim.apply(decision)
        available, replaced, moves = sim.serving(rollout_id)
        assert available >= desired, f"only {available} of {desired} serve after a pass"
        max_moves = max(max_moves, moves)
        sim.now += timedelta(seconds=TICK_S)
    wall = time.perf_counter() - started
    if finished:
        rollout = sim.state.models[MODEL].rollout
        assert rollout is not None, "the model should have its rollout"
        assert rollout.state.value == "succeeded", f"the rollout ended: {rollout.outcome}"
        assert replaced == desired, f"{replaced} of {desired} run the new revision"
    return RolloutRun(
        max_surge=max_surge,
        passes=len(pass_ms),
        finished=finished,
        replaced=replaced,
        max_moves=max_moves,
        events=events,
        commands=commands,
        pass_ms=pass_ms,
        steady_ms=steady_ms,
        traffic_wanted_ms=wanted_ms,
        simulated_s=(sim.now - now).total_seconds(),
        wall_s=round(wall, 1),
    )
