"""Stopping an engine that job control stopped (SIGSTOP: an operator paused it, or a
debugger's ``kill -STOP``), with the engine simulator as the real engine.

A stopped process keeps SIGTERM pending until it is continued, so an engine stopped that
way sat out the whole grace and was SIGKILLed; asked with SIGTERM and then SIGCONT, it acts
on the SIGTERM at once and ends as it would running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.engines import EngineSupervisor, ShardChange, ShardSpec, ShardState
from agent.engines.readiness import Liveness
from agent.engines.records import ShardRecord, is_same_process, read_proc_stat
from agent.simulator.launcher import simulator_command
from tests.support.ports import free_port
from tests.support.waiting import wait_until

GRACE_S = 20.0
"""Longer than any stop of a continued engine takes, so a stop that waits it out shows."""
UNCHECKED = Liveness(interval_s=0)


@dataclass
class Agent:
    state_dir: Path
    changes: list[ShardChange] = field(default_factory=list)
    supervisors: list[EngineSupervisor] = field(default_factory=list)
    records: list[ShardRecord] = field(default_factory=list)

    def supervisor(self, liveness: Liveness = UNCHECKED) -> EngineSupervisor:
        supervisor = EngineSupervisor(self.state_dir, self.changes.append, liveness=liveness)
        self.supervisors.append(supervisor)
        return supervisor

    def last(self, state: ShardState) -> ShardChange | None:
        return next((c for c in reversed(self.changes) if c.state is state), None)

    async def serving_simulator(self, supervisor: EngineSupervisor) -> ShardRecord:
        port = free_port()
        spec = ShardSpec(
            replica_id="sim-1",
            shard_index=0,
            model="sim-model",
            argv=(simulator_command(), "--instant", "--port", str(port)),
            gpus=(0,),
            port=port,
        )
        record = await supervisor.start(spec)
        self.records.append(record)
        await wait_until(lambda: self.last(ShardState.READY) is not None, what="ready")
        return record


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    agent = Agent(tmp_path / "agent-state")
    try:
        yield agent
    finally:
        for supervisor in agent.supervisors:
            await supervisor.shutdown()
        for record in agent.records:
            if is_same_process(record):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(record.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                await asyncio.to_thread(os.waitpid, record.pid, 0)


async def job_control_stop(record: ShardRecord) -> None:
    os.killpg(record.pid, signal.SIGSTOP)

    def stopped() -> bool:
        stat = read_proc_stat(record.pid)
        return stat is not None and stat.state == "T"

    await wait_until(stopped, what=f"pid {record.pid} stopped")


async def test_a_stopped_engine_acts_on_sigterm_at_once_instead_of_waiting_for_sigkill(
    agent: Agent,
) -> None:
    supervisor = agent.supervisor()
    record = await agent.serving_simulator(supervisor)
    await job_control_stop(record)
    asked_at = time.monotonic()

    await supervisor.stop(record.replica_id, record.shard_index, grace_s=GRACE_S)

    stopped = agent.last(ShardState.STOPPED)
    assert stopped is not None
    assert stopped.exit_code == -signal.SIGTERM
    assert time.monotonic() - asked_at < GRACE_S / 2
    assert not is_same_process(record)


async def test_a_stopped_engine_that_fails_its_health_checks_ends_on_its_stop_signal(
    agent: Agent,
) -> None:
    """A SIGSTOPped engine answers no health check; ending it waited out the 5 s before
    SIGKILL."""
    supervisor = agent.supervisor(Liveness(interval_s=1.0, failures=2))
    record = await agent.serving_simulator(supervisor)
    await job_control_stop(record)

    await wait_until(lambda: agent.last(ShardState.FAILED) is not None, what="failed")

    failed = agent.last(ShardState.FAILED)
    assert failed is not None
    assert failed.exit_code == -signal.SIGTERM
    assert not is_same_process(record)


async def test_stop_engines_ends_a_stopped_engine_with_sigterm_not_sigkill(agent: Agent) -> None:
    supervisor = agent.supervisor()
    record = await agent.serving_simulator(supervisor)
    await supervisor.shutdown()  # the agent exits; its engine runs on
    await job_control_stop(record)
    asked_at = time.monotonic()

    stop = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "llmgw-agent"),
        "stop-engines",
        "--state-dir",
        str(agent.state_dir),
        "--grace",
        str(GRACE_S),
        stdout=subprocess.PIPE,
    )
    out, _ = await stop.communicate()

    assert out.decode() == f"{agent.state_dir}: sim-1 shard 0 (pid {record.pid}) stopped\n"
    assert stop.returncode == 0
    assert time.monotonic() - asked_at < GRACE_S / 2
    assert not is_same_process(record)
