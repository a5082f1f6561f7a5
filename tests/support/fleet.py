"""Real fleet processes for tests: ``llmgw-agent`` subprocesses, the engines they start, and
the reaping that kills every one of them when a test ends, passed or failed.

Each agent runs in its own session, so its process group id is its pid. Engines lead
sessions of their own and outlive a killed agent, as they do in production; ``reap`` finds
them through the shard records in each agent's state directory and through the pids a test
saw reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.engines.records import RecordStore, is_same_process, read_proc_stat
from agent.simulator.launcher import simulator_command
from app.domain import commands
from app.hub.edge import command_to_wire
from wire.messages import StartShard

LOOPBACK = "127.0.0.1"
AGENT = str(Path(sys.executable).parent / "llmgw-agent")
REAP_WAIT_S = 10.0


@dataclass(frozen=True)
class NodeCredentials:
    """The files an agent presents and trusts: its node certificate and key, the CA."""

    certificate: Path
    key: Path
    ca: Path


@dataclass(eq=False)
class AgentProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    state_dir: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def exited(self) -> bool:
        return self.process.poll() is not None

    def kill(self) -> None:
        """SIGKILL the agent's process group; its engines, in sessions of their own, live on."""
        kill_group(self.pid)


@dataclass(eq=False)
class FleetProcesses:
    """Starts agents and, in ``reap``, kills them and every engine they started."""

    tmp_path: Path
    agents: list[AgentProcess] = field(default_factory=list)

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
    ) -> AgentProcess:
        """``llmgw-agent`` dialling ``server_uri`` (then each of ``fallback_servers`` in
        turn) with fake GPUs, engines on any port unless ``port_range`` says; its stdout and
        stderr go to a log file in ``tmp_path``."""
        log_path = self.tmp_path / f"agent-{len(self.agents)}.log"
        label_flags = [flag for k, v in (labels or {}).items() for flag in ("--label", f"{k}={v}")]
        fallback_flags = [flag for uri in fallback_servers for flag in ("--server", uri)]
        reconnect_flags = (
            []
            if reconnect_max_delay_s is None
            else ["--reconnect-max-delay", str(reconnect_max_delay_s)]
        )
        environment = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_AGENT_")}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    AGENT,
                    *("--server", server_uri, *fallback_flags, "--node-id", node_id),
                    *("--cert", str(credentials.certificate), "--key", str(credentials.key)),
                    *("--ca", str(credentials.ca), "--state-dir", str(state_dir)),
                    *("--fake-gpus", fake_gpus, "--address", LOOPBACK),
                    *("--port-range", port_range, *label_flags, *reconnect_flags),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )
        agent = AgentProcess(process, log_path, state_dir)
        self.agents.append(agent)
        return agent

    def reap(self, reported_engine_pids: Iterable[int] = ()) -> None:
        """Kill every agent, every engine still recorded in their state directories, and
        the process group of every engine pid a test saw reported."""
        for agent in self.agents:
            agent.kill()
            agent.process.wait(timeout=REAP_WAIT_S)
        for state_dir in {agent.state_dir for agent in self.agents}:
            for record in RecordStore(state_dir).load_all():
                if is_same_process(record):
                    kill_group(record.pid)
        for pid in reported_engine_pids:
            kill_group(pid)


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def is_running(pid: int) -> bool:
    stat = read_proc_stat(pid)
    return stat is not None and stat.state not in ("Z", "X")


async def mark_fake_gpu(state_dir: Path, gpu: int, reason: str) -> int:
    """``llmgw-agent fake-gpu mark`` as an operator runs it; its exit code."""
    return await _fake_gpu(
        "mark", "--state-dir", str(state_dir), "--gpu", str(gpu), "--reason", reason
    )


async def clear_fake_gpu(state_dir: Path, gpu: int) -> int:
    """``llmgw-agent fake-gpu clear`` as an operator runs it; its exit code."""
    return await _fake_gpu("clear", "--state-dir", str(state_dir), "--gpu", str(gpu))


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
