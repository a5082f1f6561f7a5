"""An operator's cordon that reaches the log between a reconciler pass's catch-up and its
append, on the in-memory store with two control planes over one log: the leader
reconciles, and the cordon is recorded through the other. Node streams are not appended at
a version (agents write them), so this is the store asking the pass's ``still_holds``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.domain.model_spec import ModelSpec
from app.domain.reconcile import Settings
from app.domain.reports import NodeReport
from app.domain.state import ACTIVE_PHASES, ClusterState
from app.services.agent_reports import LiveView, ReportRecorder
from app.services.operations import Caller, Operations
from app.services.reconciler import Reconciler
from app.store.folded import FoldedEventStore
from app.store.memory import InMemoryEventStore
from tests.unit.test_rollout_verdict_pass import Gateways, hello
from tests.unit.test_services_in_memory import Agents

NOW = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
ALICE = Caller(actor="alice", request_id="req-1")
NODES = ("gpu-1", "gpu-2")


async def test_a_cordon_recorded_while_a_pass_places_a_replica_there_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given two nodes and a model of one replica not placed yet ...
    leader_store = InMemoryEventStore(clock=lambda: NOW)
    other = Operations(FoldedEventStore(leader_store.recorder, clock=lambda: NOW), lambda: NOW)
    view = LiveView(ReportRecorder(leader_store))
    for node in NODES:
        await view.handle(hello(NodeReport(node_id=node)))
    spec = ModelSpec(name="llama", command="sim --port {port}", replicas=1)
    await Operations(leader_store, lambda: NOW).apply_model(ALICE, spec)
    agents = Agents(connected=set(NODES))
    settings = Settings(epoch=1, started_at=NOW - timedelta(hours=1), adoption_grace_ended=True)
    leader = Reconciler(
        leader_store, agents, view, settings, clock=lambda: NOW, in_flight=Gateways()
    )

    # When an operator cordons both nodes through the other server just after the
    # leader's pass has caught up (so it places the replica on one of them) ...
    caught_up = leader_store.catch_up
    cordoned: list[bool] = []

    async def catch_up_then_cordon() -> ClusterState:
        state = await caught_up()
        if not cordoned:
            for node in NODES:
                cordoned.append(await other.cordon(ALICE, node, "rack maintenance"))
        return state

    monkeypatch.setattr(leader_store, "catch_up", catch_up_then_cordon)
    await leader.run_pass()
    assert cordoned == [True, True]
    monkeypatch.undo()

    # ... then the pass, decided before the cordon, places nothing and starts nothing ...
    assert leader.passes[-1].outcome == "conflict"
    assert leader_store.state.replicas == {}
    assert agents.sent == []
    # ... and the next pass, on the log with the cordon in it, finds no node for it.
    await leader.run_pass()
    assert leader.passes[-1].outcome == "done"
    state = leader_store.state
    assert [r for r in state.replicas.values() if r.phase in ACTIVE_PHASES] == []
    assert "cordoned" in (state.models["llama"].unplaceable_reason or "")
