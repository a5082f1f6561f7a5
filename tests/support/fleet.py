"""Real fleet processes for tests: ``llmgw-agent`` subprocesses, the engines they start, and
the reaping that kills every one of them when a test ends, passed or failed.

They are started and reaped by ``devcluster``'s orchestrator, as ``llmgw-dev`` starts its
own: each agent runs in its own session, so its process group id is its pid. Engines lead
sessions of their own and outlive a killed agent, as they do in production; ``reap`` stops
them with ``llmgw-agent stop-engines`` over each agent's state directory, and kills the
process groups of the pids a test saw reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.simulator.launcher import simulator_command
from app.domain import commands
from app.hub.edge import command_to_wire
from devcluster.orchestrator import AgentProcess, Processes
from devcluster.pki import NodeCredentials
from devcluster.ports import LOOPBACK
from devcluster.processes import is_running, kill_group, program
from devcluster.programs import AgentCommand, EnginesOnExit
from wire.messages import StartShard

__all__ = [
    "AGENT",
    "LOOPBACK",
    "AgentProcess",
    "FleetProcesses",
    "NodeCredentials",
    "clear_fake_gpu",
    "is_running",
    "kill_group",
    "mark_fake_gpu",
    "simulator_shard",
    "simulator_start",
    "use_fake_gpu_memory",
]

AGENT = program("llmgw-agent")


@dataclass(eq=False)
class FleetProcesses:
    """Starts agents and, in ``reap``, kills them and every engine they started. Given
    ``processes``, its agents join those (a test cluster's), and are reaped with them."""

    tmp_path: Path
    processes: Processes | None = None
    _processes: Processes = field(init=False)

    def __post_init__(self) -> None:
        self._processes = self.processes or Processes(self.tmp_path)

    @property
    def agents(self) -> list[AgentProcess]:
        return self._processes.agents

    def start_agent(
        self,
        server_uri: str,
        node_id: str,
        credentials: NodeCredentials,
        state_dir: Path,
        *,
        fake_gpus: str = "2x80GB",
        labels: Mapping[str, str] | None = None,
        fallback_servers: Sequence[str] = (),
        port_range: str = "1024-65535",
        reconnect_max_delay_s: float | None = None,
        engines_on_exit: EnginesOnExit = "keep",
    ) -> AgentProcess:
        """``llmgw-agent`` dialling ``server_uri`` (then each of ``fallback_servers`` in
        turn) with fake GPUs, engines on any port unless ``port_range`` says; its stdout and
        stderr go to a log file in ``tmp_path``."""
        command = AgentCommand(
            servers=(server_uri, *fallback_servers),
            node_id=node_id,
            credentials=credentials,
            state_dir=state_dir,
            fake_gpus=fake_gpus,
            port_range=port_range,
            labels=dict(labels or {}),
            reconnect_max_delay_s=reconnect_max_delay_s,
            engines_on_exit=engines_on_exit,
        )
        log_path = self.tmp_path / f"agent-{len(self.agents)}.log"
        return self._processes.start_agent(node_id, command, log_path=log_path)

    def reap(self, reported_engine_pids: Iterable[int] = ()) -> None:
        """Kill every agent, every engine still recorded in their state directories, and
        the process group of every engine pid a test saw reported."""
        self._processes.reap(reported_engine_pids)


async def mark_fake_gpu(state_dir: Path, gpu: int, reason: str) -> int:
    """``llmgw-agent fake-gpu mark`` as an operator runs it; its exit code."""
    return await _fake_gpu(
        "mark", "--state-dir", str(state_dir), "--gpu", str(gpu), "--reason", reason
    )


async def clear_fake_gpu(state_dir: Path, gpu: int) -> int:
    """``llmgw-agent fake-gpu clear`` as an operator runs it; its exit code."""
    return await _fake_gpu("clear", "--state-dir", str(state_dir), "--gpu", str(gpu))


async def use_fake_gpu_memory(state_dir: Path, gpu: int, mib: int) -> int:
    """``llmgw-agent fake-gpu use`` as an operator runs it; its exit code."""
    return await _fake_gpu(
        "use", "--state-dir", str(state_dir), "--gpu", str(gpu), "--mib", str(mib)
    )


async def _fake_gpu(*args: str) -> int:
    command = await asyncio.create_subprocess_exec(AGENT, "fake-gpu", *args)
    return await command.wait()


def simulator_shard(
    command_id: str,
    replica_id: str,
    port: int,
    *flags: str,
    model: str = "m",
    gpus: tuple[int, ...] = (1,),
) -> StartShard:
    """Start shard 0 of ``replica_id`` as the real ``llmgw-sim-engine`` serving ``model``,
    as the agent receives it."""
    start = command_to_wire(
        simulator_start(command_id, replica_id, port, *flags, model=model, gpus=gpus)
    )
    assert isinstance(start, StartShard)
    return start


def simulator_start(
    command_id: str,
    replica_id: str,
    port: int,
    *flags: str,
    model: str = "m",
    gpus: tuple[int, ...] = (1,),
) -> commands.StartShard:
    """The same, as the control plane decides it (what its agent hub sends)."""
    return commands.StartShard(
        command_id=command_id,
        replica_id=replica_id,
        shard_index=0,
        model=model,
        argv=(simulator_command(), "--port", str(port), "--model", model, "--instant", *flags),
        env={},
        gpus=gpus,
        port=port,
    )
