"""The control plane's log when an engine fails: a warning naming the replica, its model
and why, not only an event counted among those recorded. Told as a story of one agent
session over the in-memory store."""

from __future__ import annotations

from datetime import timedelta

from structlog.testing import capture_logs

from app.domain.model_spec import ModelSpec
from app.domain.reconcile import Settings
from app.hub.edge import report_of
from app.services.agent_reports import LiveView, ReportRecorder
from app.services.operations import Operations
from app.services.reconciler import Reconciler
from app.store.memory import InMemoryEventStore
from tests.unit.test_agent_causation import OPERATOR, T0, AgentLink, connect, observed
from wire.messages import ShardStatus, encode


async def test_a_failed_engine_is_a_warning_naming_replica_model_and_error() -> None:
    store = InMemoryEventStore()
    view = LiveView(ReportRecorder(store))
    operations = Operations(store, clock=lambda: T0)
    session, hello = connect("gpu-1")
    await view.handle(report_of(hello))
    await operations.apply_model(OPERATOR, ModelSpec(name="llama", command="sim --port {port}"))
    settings = Settings(epoch=1, started_at=T0 - timedelta(hours=1))
    await Reconciler(store, AgentLink(session), view, settings).run_pass()
    [replica_id] = store.state.replicas
    start = f"start-{replica_id}-0"
    for state in ("starting", "ready"):
        said = ShardStatus(
            replica_id=replica_id, shard_index=0, state=state, port=20000, command_id=start
        )
        await view.handle(report_of(observed(session.receive(encode(said), 1.0))))

    failed = ShardStatus(
        replica_id=replica_id,
        shard_index=0,
        state="failed",
        port=20000,
        error="engine was killed by SIGKILL",
        exit_code=-9,
    )
    with capture_logs() as lines:
        await view.handle(report_of(observed(session.receive(encode(failed), 2.0))))

    warnings = [line for line in lines if line["log_level"] == "warning"]
    assert [(w["event"], w["replica_id"], w["model"]) for w in warnings] == [
        ("replica_shard_failed", replica_id, "llama")
    ]
    assert (warnings[0]["error"], warnings[0]["exit_code"]) == ("engine was killed by SIGKILL", -9)
