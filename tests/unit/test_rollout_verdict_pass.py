"""A rollout's verdict in a reconciler pass, on the in-memory store with two control planes
over one log: the leader reconciles, and an operator's word reaches the log through the
other, so the leader learns of it only when its pass catches up."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import msgspec
import pytest

from app.domain import rollout_operations as rollouts
from app.domain.envelope import Meta, Recorded
from app.domain.events import AnyEvent, GpuInfo, event_type
from app.domain.evolve import evolve
from app.domain.model_spec import CanaryStep
from app.domain.reconcile import Settings
from app.domain.reports import AgentConnected, AgentInventory, GatewaysInFlight, NodeReport
from app.domain.rollout import PROMOTE
from app.domain.rollout_reads import canary_group, stable_group
from app.domain.state import ClusterState, Rollout, RolloutState
from app.domain.traffic import TrafficFigures
from app.services.agent_reports import LiveView, ReportRecorder
from app.services.operations import Caller, Operations
from app.services.reconciler import Reconciler
from app.store.folded import FoldedEventStore
from app.store.gateway_reports import Ejections
from app.store.interface import AppendRequest, NewEvent
from app.store.memory import InMemoryEventStore
from tests.unit.test_rollouts import figures, revise, serving, step
from tests.unit.test_services_in_memory import Agents

ALICE = Caller(actor="alice", request_id="req-1")
HOLD_S = 60.0


class Gateways:
    """What the gateways report: nothing in flight, and good figures of any group asked
    for; it remembers the groups each read asked for."""

    def __init__(self) -> None:
        self.asked: list[set[str]] = []
        self.ejected: dict[str, int] = {}

    async def read_gateways(self) -> GatewaysInFlight:
        return GatewaysInFlight(in_flight={}, routing_seen=None, live=1)

    async def read_queued(self) -> dict[str, int]:
        return {}

    async def traffic_of_groups(
        self, groups: Mapping[str, Collection[str]]
    ) -> dict[str, TrafficFigures]:
        self.asked.append(set(groups))
        return {group: figures(500) for group in groups}

    async def ejections(self) -> Ejections:
        return Ejections(gateways=2, ejected_by=dict(self.ejected))


def rollout_of(store: FoldedEventStore) -> Rollout:
    rollout = store.state.models["llama"].rollout
    assert rollout is not None
    return rollout


def hello(report: NodeReport) -> AgentConnected:
    inventory = AgentInventory(
        node_id=report.node_id,
        address="127.0.0.1",
        remote_address="127.0.0.1:40000",
        labels={},
        gpus=tuple(
            GpuInfo(index=i, uuid=f"GPU-{i}", name="H100", memory_total_mib=81559) for i in range(8)
        ),
        port_range=(20000, 20999),
        agent_version="t",
    )
    return AgentConnected(inventory=inventory, shards=tuple(report.shards.values()))


@dataclass(frozen=True)
class Leader:
    """A leader's reconciler over a log written by the story's passes, and its gateways."""

    store: InMemoryEventStore
    reconciler: Reconciler
    gateways: Gateways
    clock: list[datetime]
    """The time now, for the store and the reconciler: ``clock[0] += ...`` moves it on."""
    hellos: tuple[AgentConnected, ...]
    """What the agents said on connecting: a control plane that takes over hears it too."""


async def a_leader_over(
    monkeypatch: pytest.MonkeyPatch, *, paused: bool, into_hold_s: float = HOLD_S + 1
) -> tuple[Leader, FoldedEventStore, datetime]:
    """A leader over the log of a canary step whose hold ran out (while an operator had the
    rollout paused, when ``paused``), or ``into_hold_s`` into it, with the log's other
    reader and the time now."""
    written: list[tuple[str, AnyEvent, datetime]] = []

    def evolve_and_keep(state: ClusterState, recorded: Recorded) -> None:
        written.append((recorded.stream, recorded.event, recorded.recorded_at))
        evolve(state, recorded)

    monkeypatch.setattr("tests.unit.test_reconcile.evolve", evolve_and_keep)
    cluster = serving(steps=(CanaryStep(replicas=1, traffic=0.25, hold_s=HOLD_S),))
    revise(cluster)
    for _ in range(10):
        rollout = cluster.state.models["llama"].rollout
        if rollout is not None and rollout.holding_since is not None:
            break
        step(cluster)
    assert rollout is not None
    assert rollout.holding_since is not None
    if paused:
        cluster.given(*rollouts.pause(cluster.state, "llama", "looking at the dashboards").events)
    cluster.after(into_hold_s)
    now = cluster.now
    monkeypatch.undo()
    at = [now]
    leader_store = InMemoryEventStore(clock=lambda: at[0])
    for stream, event, recorded_at in written:
        at[0] = recorded_at
        await leader_store.append_many(
            [AppendRequest(stream, None, [NewEvent(event)])],
            Meta(actor="test", epoch=1),
        )
    at[0] = now
    other_store = FoldedEventStore(leader_store.recorder, clock=lambda: now)
    hellos = tuple(hello(report) for report in cluster.reports.values())
    view = LiveView(ReportRecorder(leader_store))
    for said in hellos:
        await view.handle(said)
    gateways = Gateways()
    settings = Settings(epoch=1, started_at=now - timedelta(hours=1), adoption_grace_ended=True)
    leader = Reconciler(
        leader_store,
        Agents(connected={"gpu-1", "gpu-2"}),
        view,
        settings,
        clock=lambda: at[0],
        in_flight=gateways,
    )
    return Leader(leader_store, leader, gateways, at, hellos), other_store, now


async def test_a_resume_through_another_control_plane_is_judged_on_the_gateways_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a canary step whose hold ran out while an operator had the rollout paused, on a
    # log that two control planes read: the leader, and the one the operator uses ...
    leader, other_store, now = await a_leader_over(monkeypatch, paused=True)
    await leader.reconciler.run_pass()
    assert rollout_of(leader.store).state is RolloutState.PAUSED

    # When the operator resumes through the other control plane, and the leader's pass
    # (woken by that append) runs ...
    assert await Operations(other_store, clock=lambda: now).resume_rollout(ALICE, "llama")
    await leader.reconciler.run_pass()

    # ... then the step is judged on what the gateways measured of both sides, not taken
    # for a step no gateway saw a request of.
    rollout = rollout_of(leader.store)
    assert (rollout.verdict or "").startswith(f"{PROMOTE}: "), rollout.verdict
    assert {canary_group("llama"), stable_group("llama")} in leader.gateways.asked
    assert (rollout.state, rollout.step) == (RolloutState.RUNNING, 1)


async def test_a_canary_the_gateways_eject_is_rolled_back_by_the_leader_s_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a canary step whose hold ran out, with good figures on both sides, while the
    # gateways eject the canary (and a replica of a model the verdict does not read) ...
    leader, _, _ = await a_leader_over(monkeypatch, paused=False)
    state = leader.store.state
    [canary] = [r.id for r in state.replicas.values() if r.revision == 2]
    leader.gateways.ejected = {canary: 2, "mistral-1": 1}

    # When the leader's pass judges the step ...
    await leader.reconciler.run_pass()

    # ... then the ejections count against the canary: rolled back, saying why.
    rollout = rollout_of(leader.store)
    assert rollout.state is RolloutState.ROLLING_BACK
    assert rollout.verdict == (
        f"roll_back: the gateways ejected the new revision's replica(s) {canary} "
        "(by 2 gateway(s)) during the hold for failing requests in a row, and none of the others"
    )


async def test_a_canary_ejected_during_its_hold_and_back_in_rotation_is_rolled_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a canary step half way through its hold, on a pass of which the gateways eject
    # the canary for failing ...
    leader, _, _ = await a_leader_over(monkeypatch, paused=False, into_hold_s=HOLD_S / 2)
    [canary] = [r.id for r in leader.store.state.replicas.values() if r.revision == 2]
    leader.gateways.ejected = {canary: 1}
    await leader.reconciler.run_pass()
    assert rollout_of(leader.store).verdict is None

    # When it is back in rotation (good figures, no ejection) as the hold ends ...
    leader.gateways.ejected = {}
    leader.clock[0] += timedelta(seconds=HOLD_S)
    await leader.reconciler.run_pass()

    # ... then its ejection during the hold still counts against it.
    rollout = rollout_of(leader.store)
    assert rollout.state is RolloutState.ROLLING_BACK
    assert rollout.verdict == (
        f"roll_back: the gateways ejected the new revision's replica(s) {canary} "
        "(by 1 gateway(s)) during the hold for failing requests in a row, and none of the others"
    )


async def test_a_canary_ejected_while_its_hold_is_paused_is_rolled_back_once_resumed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a canary step half way through its hold, paused by an operator, on a pass of
    # which the gateways eject the canary for failing ...
    leader, other_store, _ = await a_leader_over(monkeypatch, paused=True, into_hold_s=HOLD_S / 2)
    [canary] = [r.id for r in leader.store.state.replicas.values() if r.revision == 2]
    start = await leader.store.recorder.last_position()
    leader.gateways.ejected = {canary: 1}
    await leader.reconciler.run_pass()

    # ... the log records the ejection, and nothing is judged while paused: not even the
    # gateways' figures a verdict reads are asked for.
    assert await ejections_recorded(leader.store, start) == [(canary, 1)]
    rollout = rollout_of(leader.store)
    assert (rollout.state, rollout.verdict) == (RolloutState.PAUSED, None)

    # When the canary is back in rotation (good figures, no ejection) as the hold runs out,
    # still paused ...
    leader.gateways.ejected = {}
    leader.clock[0] += timedelta(seconds=HOLD_S)
    await leader.reconciler.run_pass()
    rollout = rollout_of(leader.store)
    assert (rollout.state, rollout.verdict) == (RolloutState.PAUSED, None)
    assert leader.gateways.asked == []

    # ... and the operator resumes through the other control plane ...
    assert await Operations(other_store, clock=lambda: leader.clock[0]).resume_rollout(
        ALICE, "llama"
    )
    await leader.reconciler.run_pass()

    # ... then its ejection during the pause counts against it: rolled back, not promoted
    # as a canary never ejected.
    rollout = rollout_of(leader.store)
    assert rollout.state is RolloutState.ROLLING_BACK
    assert rollout.verdict == (
        f"roll_back: the gateways ejected the new revision's replica(s) {canary} "
        "(by 1 gateway(s)) during the hold for failing requests in a row, and none of the others"
    )


async def test_a_leader_that_takes_over_during_a_hold_counts_the_ejections_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a canary step half way through its hold, on a pass of which the gateways eject
    # the canary for failing ...
    leader, _, _ = await a_leader_over(monkeypatch, paused=False, into_hold_s=HOLD_S / 2)
    [canary] = [r.id for r in leader.store.state.replicas.values() if r.revision == 2]
    leader.gateways.ejected = {canary: 1}
    await leader.reconciler.run_pass()
    assert rollout_of(leader.store).verdict is None

    # When another control plane takes over as leader on the same log, and the canary is
    # back in rotation (good figures, no ejection) as the hold ends ...
    leader.clock[0] += timedelta(seconds=HOLD_S)
    view = LiveView(ReportRecorder(leader.store))
    for said in leader.hellos:
        await view.handle(said)
    settings = msgspec.structs.replace(leader.reconciler.settings, epoch=2)
    successor = Reconciler(
        leader.store,
        Agents(connected={"gpu-1", "gpu-2"}),
        view,
        settings,
        clock=lambda: leader.clock[0],
        in_flight=Gateways(),
    )
    await successor.run_pass()

    # ... then its verdict counts the ejection its predecessor saw: rolled back, not
    # promoted as a canary never ejected.
    rollout = rollout_of(leader.store)
    assert rollout.state is RolloutState.ROLLING_BACK
    assert rollout.verdict == (
        f"roll_back: the gateways ejected the new revision's replica(s) {canary} "
        "(by 1 gateway(s)) during the hold for failing requests in a row, and none of the others"
    )


async def test_a_canary_ejected_pass_after_pass_is_recorded_once_per_rise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a canary step in its hold, and two gateways ejecting the canary ...
    leader, _, _ = await a_leader_over(monkeypatch, paused=False, into_hold_s=1)
    [canary] = [r.id for r in leader.store.state.replicas.values() if r.revision == 2]
    leader.gateways.ejected = {canary: 2}
    start = await leader.store.recorder.last_position()

    # When pass after pass of the hold sees it so ...
    for _ in range(20):
        await leader.reconciler.run_pass()
        leader.clock[0] += timedelta(seconds=1)

    # ... then the log says so once; again only when more gateways eject it at once.
    assert await ejections_recorded(leader.store, start) == [(canary, 2)]
    leader.gateways.ejected = {canary: 1}
    await leader.reconciler.run_pass()
    leader.gateways.ejected = {canary: 3}
    await leader.reconciler.run_pass()
    await leader.reconciler.run_pass()
    assert await ejections_recorded(leader.store, start) == [(canary, 2), (canary, 3)]


async def ejections_recorded(store: InMemoryEventStore, after: int) -> list[tuple[str, int]]:
    """The replicas the log records ejected during a hold since ``after``, each with how
    many gateways ejected it at once."""
    recorded = await store.recorder.read_all(after, limit=10_000)
    data = [
        msgspec.to_builtins(r.event)
        for r in recorded
        if event_type(r.event) == "rollout_hold_ejection_seen"
    ]
    return [(d["replica_id"], d["gateways"]) for d in data]
