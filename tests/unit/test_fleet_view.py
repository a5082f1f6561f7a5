"""The live fleet view is a fold of what agents report: stories of ``observe``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.domain.reports import (
    AgentConnected,
    AgentDisconnected,
    AgentInventory,
    CommandAnswered,
    FleetView,
    HeartbeatReport,
    ReportedShard,
    ShardPhaseReport,
    ShardStatusReport,
    command_sent,
    command_settled,
    observe,
)
from app.domain.state import ShardPhase

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

MODELS = {"llama-1": "llama", "qwen-1": "qwen"}


def model_of(replica_id: str) -> str | None:
    return MODELS.get(replica_id)


def shard(replica_id: str, state: str = "ready", port: int = 20000) -> ReportedShard:
    return ReportedShard(
        replica_id=replica_id, shard_index=0, model="llama", port=port, pid=7, state=state
    )


def hello(node_id: str, *shards: ReportedShard) -> AgentConnected:
    inventory = AgentInventory(
        node_id=node_id,
        address="127.0.0.1",
        remote_address="127.0.0.1:4000",
        labels={},
        gpus=(),
        port_range=(20000, 20999),
        agent_version="t",
    )
    return AgentConnected(inventory=inventory, shards=shards)


def status(
    node_id: str, replica_id: str, phase: ShardPhase, port: int = 20000
) -> ShardStatusReport:
    return ShardStatusReport(
        node_id=node_id,
        phase=ShardPhaseReport(replica_id=replica_id, shard_index=0, phase=phase, pid=8),  # type: ignore[arg-type]
        port=port,
    )


def test_a_hello_lists_what_runs_and_gives_the_node_a_new_greeting() -> None:
    view = observe(FleetView(), hello("gpu-1", shard("llama-1")), model_of)
    again = observe(view, hello("gpu-1"), model_of)

    assert list(view.reports["gpu-1"].shards) == [("llama-1", 0)]
    assert again.reports["gpu-1"].shards == {}  # a hello replaces what was known
    assert (view.greeting("gpu-1"), again.greeting("gpu-1")) == (1, 2)
    assert again.greeting("gpu-2") is None


def test_a_heartbeat_updates_only_the_shards_the_view_knows() -> None:
    view = observe(FleetView(), hello("gpu-1", shard("llama-1", state="starting")), model_of)

    beat = HeartbeatReport(
        node_id="gpu-1", shard_states=(("llama-1", 0, "ready"), ("x-1", 0, "ready"))
    )
    after = observe(view, beat, model_of)

    assert {k: s.state for k, s in after.reports["gpu-1"].shards.items()} == {
        ("llama-1", 0): "ready"
    }
    assert observe(after, beat, model_of) is after  # nothing new: the same view


def test_a_status_inserts_a_shard_with_the_model_the_log_knows() -> None:
    view = observe(FleetView(), hello("gpu-1"), model_of)

    after = observe(view, status("gpu-1", "qwen-1", ShardPhase.STARTING, port=20001), model_of)

    [reported] = after.reports["gpu-1"].shards.values()
    assert (reported.model, reported.port, reported.state, reported.pid) == (
        "qwen",
        20001,
        "starting",
        8,
    )


def test_a_disconnect_drops_the_node_and_other_reports_change_nothing() -> None:
    view = observe(FleetView(), hello("gpu-1", shard("llama-1")), model_of)

    answered = CommandAnswered(node_id="gpu-1", command_id="c", ok=True)
    assert observe(view, answered, model_of) is view  # a command it was not sent
    gone = observe(view, AgentDisconnected(node_id="gpu-1", reason="lost"), model_of)
    assert gone.reports == {}
    assert observe(gone, AgentDisconnected(node_id="gpu-1", reason="lost"), model_of) is gone


def test_a_command_sent_is_awaited_until_answered_or_the_node_says_hello_again() -> None:
    view = observe(FleetView(), hello("gpu-1"), model_of)

    later = T0 + timedelta(seconds=5)
    sent = command_sent(
        command_sent(view, "gpu-1", "start-llama-1-0", T0), "gpu-1", "stop-x-0", later
    )
    answered = CommandAnswered(node_id="gpu-1", command_id="stop-x-0", ok=False, error="no")
    after = observe(sent, answered, model_of)

    assert sent.reports["gpu-1"].awaited == {"start-llama-1-0": T0, "stop-x-0": later}
    assert after.reports["gpu-1"].awaited == {"start-llama-1-0": T0}  # answered, even with an error
    assert command_settled(after, "gpu-1", "start-llama-1-0").reports["gpu-1"].awaited == {}
    assert observe(after, hello("gpu-1"), model_of).reports["gpu-1"].awaited == {}
    assert command_sent(view, "gpu-2", "start-qwen-1-0", T0) is view  # no hello: sent nothing
    # Sent again while awaited (after a failover, say), it keeps when it was first sent.
    assert command_sent(sent, "gpu-1", "start-llama-1-0", later) is sent


def test_shards_that_ended_leave_the_view_once_a_heartbeat_no_longer_lists_them() -> None:
    # Before, every shard started on a connection stayed in the view, stopped or failed,
    # until the node disconnected: a node up for months held every engine it ever ran.
    view = observe(FleetView(), hello("gpu-1"), model_of)
    for number in range(100):
        replica_id = f"r-{number}"
        view = observe(view, status("gpu-1", replica_id, ShardPhase.STARTING), model_of)
        ended = ShardPhase.FAILED if number % 2 else ShardPhase.STOPPED
        view = observe(view, status("gpu-1", replica_id, ended), model_of)
    view = observe(view, status("gpu-1", "llama-1", ShardPhase.READY), model_of)

    # The agent keeps its last failure (it lists it), forgets what it stopped.
    beat = HeartbeatReport(
        node_id="gpu-1", shard_states=(("llama-1", 0, "ready"), ("r-99", 0, "failed"))
    )
    after = observe(view, beat, model_of)

    assert {k: s.state for k, s in after.reports["gpu-1"].shards.items()} == {
        ("llama-1", 0): "ready",
        ("r-99", 0): "failed",
    }
    forgotten = HeartbeatReport(node_id="gpu-1", shard_states=(("llama-1", 0, "ready"),))
    assert list(observe(after, forgotten, model_of).reports["gpu-1"].shards) == [("llama-1", 0)]


def test_a_running_shard_or_one_its_agent_stopped_on_purpose_stays_until_the_hello() -> None:
    view = observe(
        FleetView(), hello("gpu-1", shard("llama-1"), shard("qwen-1", port=20001)), model_of
    )
    shutting_down = ShardStatusReport(
        node_id="gpu-1",
        phase=ShardPhaseReport(
            replica_id="qwen-1",
            shard_index=0,
            phase=ShardPhase.STOPPED,  # type: ignore[arg-type]
            reason="agent shutting down",
        ),
        port=20001,
    )
    view = observe(view, shutting_down, model_of)

    # A heartbeat that lists neither: the running one waits for its status (the log's
    # business), the one stopped on purpose keeps its start back until the node returns.
    after = observe(view, HeartbeatReport(node_id="gpu-1"), model_of)

    assert {k: s.state for k, s in after.reports["gpu-1"].shards.items()} == {
        ("llama-1", 0): "ready",
        ("qwen-1", 0): "stopped",
    }
    assert after.reports["gpu-1"].shards[("qwen-1", 0)].stopped_by_agent


def test_a_disconnect_is_remembered_with_its_reason_until_the_node_says_hello_again() -> None:
    view = observe(FleetView(), hello("gpu-1"), model_of)
    view = observe(view, AgentDisconnected(node_id="gpu-1", reason="heartbeat timeout"), model_of)
    never_here = observe(view, AgentDisconnected(node_id="gpu-9", reason="closed"), model_of)

    assert view.disconnected == {"gpu-1": "heartbeat timeout"}
    assert never_here.disconnected == {"gpu-1": "heartbeat timeout"}
    assert observe(view, hello("gpu-1"), model_of).disconnected == {}
