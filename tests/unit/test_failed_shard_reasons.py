"""Why a shard failed, told where its status could not be: an agent killed with its engine
finds the engine gone when it starts again, and says why in the hello that lists the shard
``failed`` (``ShardReport.failure``); the control plane puts that claim, shown as the
agent's, in the ``replica_lost`` it records. Before, the hello could not carry it, and the
replica was lost "its agent reports it failed", with no why."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import msgspec

from agent.engines import ShardRecord, ShardState
from agent.engines.records import RecordStore
from agent.runtime import AgentRuntime
from app.domain.events import ReplicaLost
from app.domain.reports import FleetView, HeartbeatReport, observe
from app.hub.edge import report_of
from app.hub.session import AgentHello
from tests.unit.test_agent_vanished_gpus import ScriptedGpus, a_config, a_gpu, hello_of
from tests.unit.test_reconcile import of_type, restarted_with_two_serving_replicas
from wire.messages import Hello, decode_from_agent

GONE_PID = 2**31 - 1
"""Above any kernel's pid_max: no process has it, as none has a dead engine's pid."""
STARTED = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)


def a_record(state: ShardState = ShardState.READY, **changes: object) -> ShardRecord:
    record = ShardRecord(
        replica_id="llama-8b-3",
        shard_index=0,
        model="llama-8b",
        port=20017,
        gpus=(0,),
        command=("vllm", "serve", "meta-llama/Llama-3.1-8B", "--port", "20017"),
        pid=GONE_PID,
        process_start_time=1,
        log_path="/var/lib/llmgw/logs/llama-8b-3-0.log",
        started_at=STARTED,
        state=state,
    )
    return msgspec.structs.replace(record, **changes)


# -- the agent ---------------------------------------------------------------------------


async def test_an_engine_found_dead_at_start_is_listed_failed_saying_why(tmp_path: Path) -> None:
    """The engine of llama-8b-3 ran out of GPU memory while its agent was away: the next
    agent finds its pid gone, and its log's last lines say why."""
    RecordStore(tmp_path).save(a_record(log_path=str(tmp_path / "logs" / "llama-8b-3-0.log")))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "llama-8b-3-0.log").write_text(
        "INFO loading weights\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    runtime = AgentRuntime(a_config(tmp_path), ScriptedGpus(a_gpu(0, "GPU-a")))
    await runtime.start()
    try:
        hello = await hello_of(runtime)
    finally:
        await runtime.close()

    [shard] = msgspec.to_builtins(hello)["shards"]
    assert shard["state"] == "failed"
    assert shard.get("failure") == (
        f"engine exited while the agent was away (pid {GONE_PID} is gone): CUDA out of "
        "memory (torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB)"
    )


# -- the control plane -------------------------------------------------------------------


def test_the_replica_lost_says_what_the_agent_said() -> None:
    """gpu-1's agent was killed with the engine of llama-1; the next one lists the shard
    failed, saying why, in its hello, and a heartbeat lists it failed again."""
    cluster = restarted_with_two_serving_replicas()
    cluster.running("gpu-2", "llama-2", 20000)
    said = "engine exited while the agent was away (pid 77 is gone): CUDA out of memory"
    hello = decode_from_agent(
        b'{"type":"hello","protocol_version":1,"node_id":"gpu-1","agent_version":"1.0",'
        b'"address":"127.0.0.1","port_range":[20000,20999],"shards":[{"replica_id":"llama-1",'
        b'"shard_index":0,"model":"llama","port":20000,"gpus":[0],"pid":77,"state":"failed",'
        b'"started_at":"2024-05-01T12:30:00Z","failure":' + msgspec.json.encode(said) + b"}]}"
    )
    assert isinstance(hello, Hello)
    view = observe(
        FleetView(),
        report_of(AgentHello(node_id="gpu-1", hello=hello, remote_address="127.0.0.1")),
        lambda _: None,
    )
    view = observe(
        view,
        HeartbeatReport(node_id="gpu-1", gpu_changes=(), shard_states=(("llama-1", 0, "failed"),)),
        lambda _: None,
    )
    cluster.reports["gpu-1"] = view.reports["gpu-1"]

    decision = cluster.reconcile()

    assert [e.reason for e in of_type(decision, ReplicaLost)] == [
        f"shard 0 no longer runs on gpu-1: its agent reports it failed (the agent says: {said})"
    ]


def test_a_reason_beside_a_shard_listed_running_is_not_kept() -> None:
    """A node may send anything there: a reason goes only with a shard listed failed."""
    hello = decode_from_agent(
        b'{"type":"hello","protocol_version":1,"node_id":"gpu-1","agent_version":"1.0",'
        b'"address":"127.0.0.1","port_range":[20000,20999],"shards":[{"replica_id":"llama-1",'
        b'"shard_index":0,"model":"llama","port":20000,"gpus":[0],"pid":77,"state":"ready",'
        b'"started_at":"2024-05-01T12:30:00Z","failure":"nothing of the sort"}]}'
    )
    assert isinstance(hello, Hello)

    report = report_of(AgentHello(node_id="gpu-1", hello=hello, remote_address="127.0.0.1"))
    view = observe(FleetView(), report, lambda _: None)

    assert view.reports["gpu-1"].shards[("llama-1", 0)].failure is None
