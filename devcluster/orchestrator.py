"""The processes of one cluster: ``llmgw-server serve`` and ``gateway`` processes, agents,
and (through the agents) engines; started, stopped in order, and reaped.

``Processes`` is the one place that starts them. ``stop`` ends them as an operator would:
SIGTERM to the agents first (started with ``--engines-on-exit stop`` they stop their
engines and report it before they disconnect), then ``llmgw-agent stop-engines`` for
anything an agent left behind, then SIGTERM to gateways and servers. ``reap`` kills
whatever is left, passed or failed: every process group it started, every engine recorded
in an agent's state directory, and the groups of any engine pids the caller saw reported.
``llmgw-dev`` and the tests' clusters are both built on it.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.ports import LOOPBACK
from devcluster.processes import Child, kill_group, run, spawn
from devcluster.programs import (
    AgentCommand,
    GatewayCommand,
    ServeCommand,
    gateway_url,
    stop_engines_argv,
)

AGENT_STOP_WITHIN_S = 25.0
"""An agent stopping its engines gives each one 10 s after SIGTERM before SIGKILL."""
SERVER_STOP_WITHIN_S = 10.0
STOP_ENGINES_TIMEOUT_S = 60.0


@dataclass(eq=False)
class ServerProcess(Child):
    """One ``llmgw-server serve``."""

    command: ServeCommand | None = None

    @property
    def server_id(self) -> str:
        return self.name

    @property
    def admin_port(self) -> int:
        return self._command.admin_port

    @property
    def agent_port(self) -> int:
        return self._command.agent_port

    @property
    def client_port(self) -> int:
        """Where its gateway listens (0: it runs none)."""
        return self._command.client_port or 0

    @property
    def agent_uri(self) -> str:
        return self._command.agent_uri

    @property
    def admin_url(self) -> str:
        return self._command.admin_url

    @property
    def gateway_url(self) -> str:
        """Base URL of its OpenAI-compatible API."""
        return gateway_url(self.client_port)

    @property
    def _command(self) -> ServeCommand:
        assert self.command is not None, "a server process is started with its command"
        return self.command

    def kill(self) -> None:
        """SIGKILL: no disconnect is recorded, leadership is not handed back."""
        super().kill()

    def terminate(self, within_s: float = SERVER_STOP_WITHIN_S) -> int:
        """SIGTERM, as a supervisor stops it; the exit code."""
        return super().terminate(within_s)


@dataclass(eq=False)
class GatewayProcess(Child):
    """One standalone ``llmgw-server gateway``."""

    command: GatewayCommand | None = None

    @property
    def gateway_id(self) -> str:
        return self.name

    @property
    def port(self) -> int:
        assert self.command is not None, "a gateway process is started with its command"
        return self.command.port

    @property
    def url(self) -> str:
        """Base URL of its OpenAI-compatible API, as the ``openai`` SDK takes it."""
        return gateway_url(self.port)

    @property
    def readyz_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/readyz"

    def terminate(self, within_s: float = SERVER_STOP_WITHIN_S) -> int:
        """SIGTERM: open requests finish first; the exit code."""
        return super().terminate(within_s)


@dataclass(eq=False)
class AgentProcess(Child):
    """One ``llmgw-agent``; its engines lead sessions of their own and outlive it."""

    state_dir: Path = Path()

    def kill(self) -> None:
        """SIGKILL the agent's process group; its engines, in sessions of their own, live on."""
        super().kill()


@dataclass(eq=False)
class Processes:
    """Everything one cluster started, in order; ``logs`` is where their output goes."""

    logs: Path
    die_with_parent: bool = False
    """Have the kernel end every child when this process dies, however it dies
    (``llmgw-dev``): servers and gateways get SIGTERM; agents get SIGKILL, so that their
    engines live on for the next run to adopt, as after any agent crash."""
    servers: list[ServerProcess] = field(default_factory=list)
    gateways: list[GatewayProcess] = field(default_factory=list)
    agents: list[AgentProcess] = field(default_factory=list)

    def start_server(
        self,
        name: str,
        command: ServeCommand,
        *,
        log_path: Path | None = None,
        append: bool = False,
    ) -> ServerProcess:
        child = self._spawn(name, command.argv(), command.secrets(), log_path, append)
        server = ServerProcess(name, child.process, child.log_path, command)
        self.servers.append(server)
        return server

    def start_gateway(
        self,
        name: str,
        command: GatewayCommand,
        *,
        log_path: Path | None = None,
        append: bool = False,
    ) -> GatewayProcess:
        child = self._spawn(name, command.argv(), command.secrets(), log_path, append)
        gateway = GatewayProcess(name, child.process, child.log_path, command)
        self.gateways.append(gateway)
        return gateway

    def start_agent(
        self,
        name: str,
        command: AgentCommand,
        *,
        log_path: Path | None = None,
        append: bool = False,
    ) -> AgentProcess:
        child = self._spawn(name, command.argv(), {}, log_path, append, signal.SIGKILL)
        agent = AgentProcess(child.name, child.process, child.log_path, command.state_dir)
        self.agents.append(agent)
        return agent

    def log_path(self, name: str) -> Path:
        """``<name>.log``, or ``<name>-<n>.log`` when the name has run before."""
        existing = len(list(self.logs.glob(f"{name}*.log")))
        return self.logs / f"{name}{'-' + str(existing) if existing else ''}.log"

    def children(self) -> list[Child]:
        return [*self.servers, *self.gateways, *self.agents]

    def stop(self) -> list[str]:
        """Stop everything in order (see the module docstring); what went wrong, if
        anything, one line each."""
        problems: list[str] = []
        for agent in self.agents:
            agent.send(signal.SIGTERM)  # all at once: each takes its engines' stop time
        for agent in self.agents:
            code = agent.wait_or_kill(AGENT_STOP_WITHIN_S)
            if code != 0:
                problems.append(f"{agent.name} exited with code {code}; see {agent.log_path}")
        problems += self.stop_engines(grace_s=5.0)
        for child in (*self.gateways, *self.servers):
            child.terminate(SERVER_STOP_WITHIN_S)
        return problems

    def reap(self, engine_pids: Iterable[int] = ()) -> None:
        """Kill every process started here and every engine their agents recorded, then
        the process group of every pid in ``engine_pids``."""
        for child in (*self.gateways, *self.servers, *self.agents):
            child.kill()
        for problem in self.stop_engines(grace_s=0.0):
            print(f"reaping engines: {problem}", file=sys.stderr)
        for pid in engine_pids:
            kill_group(pid)

    def stop_engines(self, *, grace_s: float) -> list[str]:
        """``llmgw-agent stop-engines`` over every agent's state directory, once their
        agents are gone; its complaints, if any."""
        directories = sorted({agent.state_dir for agent in self.agents})
        if not directories:
            return []
        done = run(stop_engines_argv(directories, grace_s), timeout_s=STOP_ENGINES_TIMEOUT_S)
        if done.returncode == 0:
            return []
        return [line for line in done.stderr.splitlines() if line.strip()]

    def _spawn(
        self,
        name: str,
        argv: list[str],
        secrets: dict[str, str],
        log_path: Path | None,
        append: bool,
        death_signal: signal.Signals = signal.SIGTERM,
    ) -> Child:
        """``log_path``, else the next free ``<name>[-<n>].log`` in ``logs``; appended to
        with ``append``, else written afresh."""
        path = log_path or self.log_path(name)
        return spawn(
            name,
            argv,
            path,
            settings=secrets,
            append=append,
            death_signal=death_signal if self.die_with_parent else None,
        )
