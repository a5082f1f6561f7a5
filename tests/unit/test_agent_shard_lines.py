"""What the agent's log says when an engine fails: a warning, not an info line among the
starts and stops, naming the replica, its model and why, so that an operator who filters
the agent's log on warnings finds the engine that failed."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from structlog.testing import capture_logs

from agent.engines import ShardRecord, ShardState
from agent.engines.records import RecordStore
from agent.engines.supervisor import AWAY_ERROR
from agent.runtime import AgentRuntime
from tests.unit.test_agent_vanished_gpus import ScriptedGpus, a_config, a_gpu

GONE_PID = 2**31 - 1
"""Above any kernel's pid_max: no process has it, as none has a dead engine's pid."""


async def test_an_engine_found_dead_at_start_is_a_warning_naming_replica_model_and_error(
    tmp_path: Path,
) -> None:
    """The agent was away while the engine of llama-8b-3 died: at its start it reports the
    shard failed, and says so at warning."""
    RecordStore(tmp_path).save(
        ShardRecord(
            replica_id="llama-8b-3",
            shard_index=0,
            model="llama-8b",
            port=20017,
            gpus=(0,),
            command=("vllm", "serve", "meta-llama/Llama-3.1-8B", "--port", "20017"),
            pid=GONE_PID,
            process_start_time=1,
            log_path=str(tmp_path / "llama-8b-3-0.log"),
            started_at=datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
            state=ShardState.READY,
        )
    )
    runtime = AgentRuntime(a_config(tmp_path), ScriptedGpus(a_gpu(0, "GPU-a")))
    with capture_logs() as lines:
        await runtime.start()
    await runtime.close()

    [failed] = [line for line in lines if line["event"] == "shard_changed"]
    assert failed["log_level"] == "warning"
    assert (failed["replica_id"], failed["model"], failed["state"]) == (
        "llama-8b-3",
        "llama-8b",
        "failed",
    )
    assert failed["error"] == f"{AWAY_ERROR} (pid {GONE_PID} is gone)"
