"""A reconciler pass whose append may or may not have reached the log (its connection broke
once the append was sent): it logs one line worded for itself, not for an operator who sent
a request, sends nothing, and its next pass decides again on the log as it is."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from app.domain.model_spec import ModelSpec
from app.domain.reconcile import Settings
from app.domain.reports import NodeReport
from app.services.agent_reports import LiveView, ReportRecorder
from app.services.operations import Caller, Operations
from app.services.reconciler import Reconciler
from app.store.errors import AppendOutcomeUnknown
from app.store.memory import InMemoryEventStore
from tests.unit.test_rollout_verdict_pass import Gateways, hello
from tests.unit.test_services_in_memory import Agents

NOW = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
ALICE = Caller(actor="alice", request_id="req-1")


async def test_a_pass_of_unknown_outcome_says_the_next_pass_decides_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a node and a model of one replica not placed yet ...
    store = InMemoryEventStore(clock=lambda: NOW)
    view = LiveView(ReportRecorder(store))
    await view.handle(hello(NodeReport(node_id="gpu-1")))
    spec = ModelSpec(name="llama", command="sim --port {port}", replicas=1)
    await Operations(store, lambda: NOW).apply_model(ALICE, spec)
    agents = Agents(connected={"gpu-1"})
    settings = Settings(epoch=1, started_at=NOW - timedelta(hours=1), adoption_grace_ended=True)
    leader = Reconciler(store, agents, view, settings, clock=lambda: NOW, in_flight=Gateways())

    # When the pass's append is sent and its connection breaks before the answer ...
    async def broken(*_: Any, **__: Any) -> None:
        raise AppendOutcomeUnknown("rec-7", "connection was closed in the middle of operation")

    monkeypatch.setattr(store, "append_many", broken)
    with capture_logs() as logs:
        await leader.run_pass()
    monkeypatch.undo()

    # ... then it says what happened in its own words, and starts nothing ...
    [line] = [log for log in logs if log["event"] == "reconcile_pass_store_error"]
    assert line["error"] == (
        "the database connection broke while this pass's events were being committed "
        "(connection was closed in the middle of operation): they may or may not have been "
        "recorded, and nothing was sent to the agents for them; the next pass reads the log "
        "and decides again on what it holds"
    )
    assert line["correlation_id"] == "rec-7"
    assert leader.passes[-1].outcome == "store_error"
    assert agents.sent == []
    # ... and the next pass places the replica.
    await leader.run_pass()
    assert leader.passes[-1].outcome == "done"
    assert len(store.state.replicas) == 1
