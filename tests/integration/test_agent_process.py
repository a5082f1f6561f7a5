"""``llmgw-agent`` as a real process, over real mTLS, against a stand-in control plane.

The stand-in is the sans-I/O ``AgentSession`` behind ``websockets.asyncio.server.serve`` with
the llmgw CA's server certificate: it welcomes the agent, answers its heartbeats, sends the
commands a test asks for, and keeps every observation. One story runs against the control
plane's own ``AgentHub`` instead, to show that both sides agree. Engines are the real
``llmgw-sim-engine`` or a one-line Python program that fails. Every agent and engine process
group is killed when a test ends, passed or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from cryptography import x509
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from agent.engines.records import RecordStore
from app.domain import commands
from app.domain.reports import (
    AgentConnected,
    AgentInventory,
    AgentReport,
    CommandAnswered,
    ShardStatusReport,
)
from app.hub.hub import AgentHub
from app.hub.session import (
    AgentGone,
    AgentHeartbeat,
    AgentHello,
    AgentSession,
    Close,
    CommandCompleted,
    Observation,
    Observe,
    Output,
    PeerCertificate,
    Send,
    ShardStatusReported,
)
from app.pki.builders import build_ca, issue, issue_node, issue_server
from app.pki.files import write_ca, write_issued
from app.pki.keys import PrivateKey, generate_key
from app.pki.model import CertificateKind, Usage, Validity
from app.pki.tls import peer_identity, server_ssl_context
from devcluster.programs import EnginesOnExit
from tests.support.fleet import (
    AGENT,
    LOOPBACK,
    AgentProcess,
    FleetProcesses,
    NodeCredentials,
    is_running,
    mark_fake_gpu,
    simulator_shard,
    simulator_start,
)
from tests.support.operator_cli import clean_environment, installed
from tests.support.ports import free_port
from tests.support.waiting import wait_until
from wire.messages import (
    MAX_MESSAGE_BYTES,
    AgentCommand,
    GpuHealthChange,
    Hello,
    ShardStatus,
    StartShard,
    StopShard,
    encode,
)

pytestmark = pytest.mark.timeout(60)

NODE_ID = "gpu-01"
EXPIRED_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
EARLY_BY = timedelta(hours=2)
"""How far ahead of this machine's clock the early certificate starts: as a node booted
with its clock two hours behind sees a certificate issued today."""
T = TypeVar("T")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CA, a server certificate for 127.0.0.1, one for 127.0.0.2 only, the node's, a
    node certificate from another CA, one of the node's that expired and one that starts
    ``EARLY_BY`` from now."""
    directory = tmp_path_factory.mktemp("pki")
    now = datetime.now(UTC)
    ca = build_ca(generate_key(), "llmgw CA", now, 1)
    stranger = build_ca(generate_key(), "llmgw CA", now, 1)
    write_ca(directory, ca, force=False)
    loopback, elsewhere = ipaddress.ip_address(LOOPBACK), ipaddress.ip_address("127.0.0.2")
    certificates: dict[str, Callable[[PrivateKey], x509.Certificate]] = {
        "server": lambda key: issue_server(ca, key, ["localhost"], [loopback], now, 1),
        "server-elsewhere": lambda key: issue_server(ca, key, [], [elsewhere], now, 1),
        "node": lambda key: issue_node(ca, key, NODE_ID, now, 1),
        "node-stranger": lambda key: issue_node(stranger, key, NODE_ID, now, 1),
        "node-expired": lambda key: issue(
            ca,
            key,
            common_name=NODE_ID,
            unit=CertificateKind.NODE,
            usages=(Usage.CLIENT_AUTH,),
            validity=Validity(not_before=EXPIRED_AT - timedelta(days=1), not_after=EXPIRED_AT),
        ),
        "node-early": lambda key: issue(
            ca,
            key,
            common_name=NODE_ID,
            unit=CertificateKind.NODE,
            usages=(Usage.CLIENT_AUTH,),
            validity=Validity(not_before=now + EARLY_BY, not_after=now + timedelta(days=1)),
        ),
    }
    for stem, build in certificates.items():
        key = generate_key()
        write_issued(directory, stem, build(key), key, force=False)
    return directory


# -- control planes --------------------------------------------------------------------


@dataclass(eq=False)
class Recorder:
    """Where a control plane listens, and every observation its sessions made."""

    pki: Path
    port: int = 0
    seen: list[Observation] = field(default_factory=list)

    @property
    def uri(self) -> str:
        return f"wss://{LOOPBACK}:{self.port}"

    async def handle(
        self, node_id: str, observation: Observation, *, replaced_previous: bool = False
    ) -> None:
        self.seen.append(observation)

    def mark(self) -> int:
        """A place in the observations: ``observed(..., since=mark)`` looks only after it."""
        return len(self.seen)

    async def observed(
        self,
        kind: type[T],
        matches: Callable[[T], bool] = lambda _: True,
        *,
        since: int = 0,
        within_s: float = 15.0,
        what: str = "an observation",
    ) -> T:
        found: list[T] = []

        def check() -> bool:
            found[:] = [o for o in self.seen[since:] if isinstance(o, kind) and matches(o)]
            return bool(found)

        await wait_until(check, within_s=within_s, what=what)
        return found[0]

    async def hello(self, *, since: int = 0) -> Hello:
        observation = await self.observed(AgentHello, since=since, what="a hello")
        return observation.hello

    async def status(self, replica_id: str, state: str, *, within_s: float = 15.0) -> ShardStatus:
        observation = await self.observed(
            ShardStatusReported,
            lambda o: o.status.replica_id == replica_id and o.status.state == state,
            within_s=within_s,
            what=f"{replica_id} {state}",
        )
        return observation.status

    async def result(self, command_id: str) -> CommandCompleted:
        return await self.observed(
            CommandCompleted, lambda o: o.result.command_id == command_id, what=command_id
        )

    def engine_pids(self) -> set[int]:
        pids: set[int] = set()
        for observation in self.seen:
            if isinstance(observation, ShardStatusReported) and observation.status.pid:
                pids.add(observation.status.pid)
            if isinstance(observation, AgentHello):
                pids.update(shard.pid for shard in observation.hello.shards if shard.pid)
        return pids


@dataclass(eq=False)
class ControlPlane(Recorder):
    """The stand-in: ``AgentSession`` behind ``serve``, and nothing else."""

    certificate: str = "server"
    _server: Server | None = None
    _current: tuple[ServerConnection, AgentSession] | None = None

    async def start(self) -> None:
        context = server_ssl_context(
            self.pki / f"{self.certificate}.crt",
            self.pki / f"{self.certificate}.key",
            self.pki / "ca.crt",
        )
        self._server = await serve(
            self._handle, LOOPBACK, self.port, ssl=context, max_size=MAX_MESSAGE_BYTES
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Shut down as a restarting control plane does: every agent is told 1001."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def send(self, command: AgentCommand) -> None:
        assert self._current is not None, "no agent is connected"
        websocket, session = self._current
        await self._carry_out(websocket, session.send_command(command))

    async def _handle(self, websocket: ServerConnection) -> None:
        identity = peer_identity(
            websocket.transport.get_extra_info("ssl_object"), CertificateKind.NODE
        )
        session = AgentSession(
            peer=PeerCertificate(
                common_name=identity.common_name, subject=identity.subject, kind=identity.kind
            ),
            remote_address=LOOPBACK,
            require_identity=True,
            heartbeat_interval_s=1.0,
            heartbeat_timeout_s=3.0,
            server_id="stand-in",
            epoch=1,
            now=time.monotonic(),
        )
        self._current = (websocket, session)
        ticker = asyncio.create_task(self._tick(websocket, session))
        try:
            async for frame in websocket:
                await self._carry_out(websocket, session.receive(frame, time.monotonic()))
        except ConnectionClosed:
            pass
        finally:
            ticker.cancel()
            reason = f"closed {websocket.close_code}"
            await self._carry_out(websocket, session.connection_lost(reason, time.monotonic()))

    async def _tick(self, websocket: ServerConnection, session: AgentSession) -> None:
        while True:
            await asyncio.sleep(0.2)
            await self._carry_out(websocket, session.tick(time.monotonic()))

    async def _carry_out(self, websocket: ServerConnection, outputs: list[Output]) -> None:
        for output in outputs:
            match output:
                case Send(message):
                    with contextlib.suppress(ConnectionClosed):
                        await websocket.send(encode(message), text=True)
                case Close(code, reason):
                    await websocket.close(code, reason)
                case Observe(observation):
                    await self.handle(NODE_ID, observation)


@dataclass(eq=False)
class RealHub:
    """The control plane's own ``AgentHub``, handing the reports it converts to this."""

    pki: Path
    port: int = 0
    seen: list[AgentReport] = field(default_factory=list)
    _hub: AgentHub | None = None

    @property
    def uri(self) -> str:
        return f"wss://{LOOPBACK}:{self.port}"

    async def handle(self, report: AgentReport) -> None:
        self.seen.append(report)

    async def start(self) -> None:
        context = server_ssl_context(
            self.pki / "server.crt", self.pki / "server.key", self.pki / "ca.crt"
        )
        self._hub = AgentHub(self, context, heartbeat_interval_s=1.0, heartbeat_timeout_s=3.0)
        self.port = await self._hub.start(LOOPBACK, self.port)

    async def stop(self) -> None:
        if self._hub is not None:
            await self._hub.stop()

    async def send(self, command: commands.StartShard | commands.StopShard) -> None:
        assert self._hub is not None
        await self._hub.send_command(NODE_ID, command)

    async def reported(self, kind: type[T], matches: Callable[[T], bool], what: str) -> T:
        found: list[T] = []

        def check() -> bool:
            found[:] = [r for r in self.seen if isinstance(r, kind) and matches(r)]
            return bool(found)

        await wait_until(check, within_s=15.0, what=what)
        return found[0]

    async def hello(self) -> AgentInventory:
        connected = await self.reported(AgentConnected, lambda _: True, "a hello")
        return connected.inventory

    async def status(self, replica_id: str, state: str) -> ShardStatusReport:
        return await self.reported(
            ShardStatusReport,
            lambda r: r.phase.replica_id == replica_id and r.phase.phase.value == state,
            f"{replica_id} {state}",
        )

    async def result(self, command_id: str) -> CommandAnswered:
        return await self.reported(
            CommandAnswered, lambda r: r.command_id == command_id, command_id
        )

    def engine_pids(self) -> set[int]:
        pids = {r.phase.pid for r in self.seen if isinstance(r, ShardStatusReport) and r.phase.pid}
        for report in self.seen:
            if isinstance(report, AgentConnected):
                pids.update(shard.pid for shard in report.shards if shard.pid)
        return pids


# -- agent processes ---------------------------------------------------------------------


@dataclass(eq=False)
class Processes:
    """Agents dialling the control planes here; ``reap`` kills them and every engine."""

    fleet: FleetProcesses
    control_planes: list[Recorder | RealHub] = field(default_factory=list)

    def agent(
        self,
        control_plane: Recorder | RealHub,
        state_dir: Path,
        *,
        node_id: str = NODE_ID,
        certificate: str = "node",
        engines_on_exit: EnginesOnExit = "keep",
    ) -> AgentProcess:
        if control_plane not in self.control_planes:
            self.control_planes.append(control_plane)
        pki = control_plane.pki
        credentials = NodeCredentials(
            pki / f"{certificate}.crt", pki / f"{certificate}.key", pki / "ca.crt"
        )
        return self.fleet.start_agent(
            control_plane.uri,
            node_id,
            credentials,
            state_dir,
            labels={"zone": "test"},
            engines_on_exit=engines_on_exit,
        )

    def reap(self) -> None:
        self.fleet.reap(pid for plane in self.control_planes for pid in plane.engine_pids())


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(FleetProcesses(tmp_path))
    try:
        yield started
    finally:
        started.reap()


@pytest.fixture
async def control_plane(pki: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(pki)
    await plane.start()
    try:
        yield plane
    finally:
        await plane.stop()


async def models_served(port: int) -> list[str]:
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(f"http://{LOOPBACK}:{port}/v1/models")
    return [model["id"] for model in response.json()["data"]]


# -- stories -----------------------------------------------------------------------------


async def test_an_agent_says_hello_runs_a_shard_and_stops_it(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    processes.agent(control_plane, tmp_path / "state")

    hello = await control_plane.hello()
    assert hello.node_id == NODE_ID
    assert hello.address == LOOPBACK
    assert hello.labels == {"zone": "test"}
    assert [(gpu.index, gpu.memory_total_mib, gpu.healthy) for gpu in hello.gpus] == [
        (0, 80 * 1024, True),
        (1, 80 * 1024, True),
    ]
    assert hello.shards == ()

    port = free_port()
    await control_plane.send(simulator_shard("start-1", "m-1", port))
    assert (await control_plane.result("start-1")).result.ok
    ready = await control_plane.status("m-1", "ready")
    engine_pid = ready.pid
    assert engine_pid is not None
    assert ready.command_id == "start-1"
    assert ready.port == port
    assert await models_served(port) == ["m"]

    await control_plane.send(
        StopShard(command_id="stop-1", replica_id="m-1", shard_index=0, grace_s=5)
    )
    assert (await control_plane.result("stop-1")).result.ok
    stopped = await control_plane.status("m-1", "stopped")
    assert stopped.command_id == "stop-1"
    await wait_until(lambda: not is_running(engine_pid), what="the engine process is gone")


STUBBORN_ENGINE = """
import pathlib, signal, sys, time
told = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: told.write_text("told to stop"))
while True:
    time.sleep(1)
"""
"""An engine that notes its SIGTERM in the file its argument names and runs on: a stop
waits out its whole grace, then SIGKILLs it."""


def stubborn_start(command_id: str, port: int, told: Path) -> StartShard:
    return StartShard(
        command_id=command_id,
        replica_id="m-1",
        shard_index=0,
        model="m",
        argv=(sys.executable, "-c", STUBBORN_ENGINE, str(told)),
        gpus=(0,),
        port=port,
    )


async def test_a_start_sent_while_a_stop_waits_out_its_grace_is_reported_under_its_own_id(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    processes.agent(control_plane, tmp_path / "state")
    await control_plane.hello()
    port, told = free_port(), tmp_path / "told"
    await control_plane.send(stubborn_start("start-1", port, told))
    first = await control_plane.status("m-1", "starting")
    assert first.command_id == "start-1"

    since = control_plane.mark()
    await control_plane.send(
        StopShard(command_id="stop-1", replica_id="m-1", shard_index=0, grace_s=2)
    )
    await wait_until(told.exists, what="the engine told to stop, its grace running")
    await control_plane.send(stubborn_start("start-2", port, told))

    assert (await control_plane.result("stop-1")).result.ok
    assert (await control_plane.result("start-2")).result.ok
    statuses = [
        (observation.status.state, observation.status.command_id)
        for observation in control_plane.seen[since:]
        if isinstance(observation, ShardStatusReported)
    ]
    assert statuses == [("stopped", "stop-1"), ("starting", "start-2")]


async def test_a_start_for_a_running_shard_on_another_port_fails_and_is_not_its_cause(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    processes.agent(control_plane, tmp_path / "state")
    await control_plane.hello()
    port, told = free_port(), tmp_path / "told"
    await control_plane.send(stubborn_start("start-1", port, told))
    engine_pid = (await control_plane.status("m-1", "starting")).pid
    assert engine_pid is not None

    await control_plane.send(stubborn_start("start-2", free_port(), told))
    refused = (await control_plane.result("start-2")).result
    os.killpg(engine_pid, signal.SIGKILL)
    failed = await control_plane.status("m-1", "failed")

    assert not refused.ok
    assert f"already runs on port {port}" in str(refused.error)
    assert failed.command_id == "start-1"


async def test_an_engine_that_exits_with_an_error_is_reported_failed_with_its_log_and_reason(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    processes.agent(control_plane, tmp_path / "state")
    await control_plane.hello()
    crash = "import sys; print('loading weights'); sys.exit('CUDA out of memory')"
    await control_plane.send(
        StartShard(
            command_id="start-bad",
            replica_id="bad-1",
            shard_index=0,
            model="bad",
            argv=(sys.executable, "-c", crash),
            gpus=(0,),
            port=free_port(),
        )
    )

    failed = await control_plane.status("bad-1", "failed")
    assert failed.exit_code == 1
    # The log's last words give the one-line reason (wire.engines' failure patterns).
    assert failed.error == "engine exited with code 1: CUDA out of memory (CUDA out of memory)"
    assert "loading weights" in failed.log_tail
    assert "CUDA out of memory" in failed.log_tail


async def test_an_agent_killed_and_started_again_reattaches_its_engine_and_leaves_it_on_sigterm(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    first = processes.agent(control_plane, state_dir)
    await control_plane.hello()
    await control_plane.send(simulator_shard("start-1", "m-1", free_port()))
    engine_pid = (await control_plane.status("m-1", "ready")).pid
    assert engine_pid is not None

    killed = control_plane.mark()
    os.killpg(first.process.pid, signal.SIGKILL)
    await wait_until(first.exited, what="the first agent is dead")
    # Its connection's end (no closing handshake: 1006) reaches the control plane in its
    # own time; once it has, the departure looked for below can only be the second agent's.
    await control_plane.observed(AgentGone, since=killed, what="the first connection lost")
    since = control_plane.mark()
    second = processes.agent(control_plane, state_dir)

    hello = await control_plane.hello(since=since)
    assert [(shard.replica_id, shard.pid) for shard in hello.shards] == [("m-1", engine_pid)]
    assert is_running(engine_pid)

    second.process.send_signal(signal.SIGTERM)
    await wait_until(second.exited, what="the agent exits on SIGTERM")
    assert second.process.returncode == 0
    gone = await control_plane.observed(AgentGone, since=since, what="the agent left")
    assert "1001" in gone.reason
    assert is_running(engine_pid), "an agent that stops leaves its engines running"


async def test_an_agent_told_to_stop_its_engines_on_exit_reports_each_stop_before_it_leaves(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    agent = processes.agent(control_plane, state_dir, engines_on_exit="stop")
    await control_plane.hello()
    await control_plane.send(simulator_shard("start-1", "m-1", free_port()))
    engine_pid = (await control_plane.status("m-1", "ready")).pid
    assert engine_pid is not None
    since = control_plane.mark()

    agent.process.send_signal(signal.SIGTERM)
    await wait_until(agent.exited, within_s=20, what="the agent exits on SIGTERM")

    assert agent.process.returncode == 0
    stopped = await control_plane.observed(
        ShardStatusReported, lambda o: o.status.state == "stopped", since=since, what="a stop"
    )
    assert stopped.status.replica_id == "m-1"
    assert stopped.status.reason == "agent shutting down"
    assert stopped.status.command_id is None, "nobody asked for this stop"
    gone = await control_plane.observed(AgentGone, since=since, what="the agent left")
    assert control_plane.seen.index(stopped) < control_plane.seen.index(gone)
    assert "1001" in gone.reason
    assert not is_running(engine_pid)
    assert RecordStore(state_dir).load_all() == [], "a stopped engine leaves no record"


async def test_stop_engines_stops_what_a_stopped_agent_left_running_and_refuses_a_running_one(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    agent = processes.agent(control_plane, state_dir)
    await control_plane.hello()
    await control_plane.send(simulator_shard("start-1", "m-1", free_port()))
    engine_pid = (await control_plane.status("m-1", "ready")).pid
    assert engine_pid is not None

    refused = await stop_engines("--state-dir", str(state_dir))
    assert refused.returncode == 1
    assert f"another llmgw-agent (pid {agent.pid})" in refused.stderr
    assert "stop that agent first" in refused.stderr
    assert is_running(engine_pid)

    agent.process.send_signal(signal.SIGTERM)
    await wait_until(agent.exited, what="the agent exits on SIGTERM")
    assert is_running(engine_pid), "by default an agent leaves its engines running"

    stopped = await stop_engines("--state-dir", str(state_dir), "--grace", "5")
    assert stopped.returncode == 0, stopped.stderr
    assert f"m-1 shard 0 (pid {engine_pid}) stopped" in stopped.stdout
    assert not is_running(engine_pid)
    again = await stop_engines("--state-dir", str(state_dir))
    assert (again.returncode, again.stdout.strip()) == (0, f"{state_dir}: no engines recorded")
    nowhere = await stop_engines("--state-dir", str(tmp_path / "nowhere"))
    assert nowhere.returncode == 2
    assert f"--state-dir {tmp_path / 'nowhere'}: no such directory" in nowhere.stderr
    assert (await stop_engines("--state-dir", str(state_dir), "--grace", "-1")).returncode == 2


async def stop_engines(*args: str) -> subprocess.CompletedProcess[str]:
    """``llmgw-agent stop-engines ARGS`` as an operator runs it."""
    return await asyncio.to_thread(
        subprocess.run,
        [AGENT, "stop-engines", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_a_fake_gpu_marked_unhealthy_is_reported_in_a_heartbeat(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    processes.agent(control_plane, state_dir)
    await control_plane.hello()

    reason = "XID 79: GPU has fallen off the bus"
    assert await mark_fake_gpu(state_dir, 1, reason) == 0

    beat = await control_plane.observed(
        AgentHeartbeat, lambda o: bool(o.heartbeat.gpu_changes), what="a GPU health change"
    )
    assert beat.heartbeat.gpu_changes == (
        GpuHealthChange(
            index=1,
            uuid=beat.heartbeat.gpu_changes[0].uuid,
            healthy=False,
            reason=reason,
            xid=79,
        ),
    )


async def test_a_second_agent_on_the_same_state_directory_is_refused(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    first = processes.agent(control_plane, tmp_path / "state")
    await control_plane.hello()

    second = processes.agent(control_plane, tmp_path / "state")
    await wait_until(second.exited, what="the second agent exits")

    assert second.process.returncode == 1
    assert f"another llmgw-agent (pid {first.process.pid})" in second.log()
    assert not first.exited()


async def test_the_agent_refuses_a_server_certificate_without_the_dialled_ip(
    pki: Path, processes: Processes, tmp_path: Path
) -> None:
    impostor = ControlPlane(pki, certificate="server-elsewhere")
    await impostor.start()
    try:
        agent = processes.agent(impostor, tmp_path / "state")
        await wait_until(agent.exited, within_s=15, what="the agent exits")
    finally:
        await impostor.stop()

    assert agent.process.returncode == 1
    output = agent.log()
    assert "not valid for 127.0.0.1" in output
    assert "subject alternative names (it has IP:127.0.0.2)" in output
    assert "llmgw-cli cert server --ip 127.0.0.2 --ip 127.0.0.1 --force" in output
    assert impostor.seen == []


async def test_the_agent_gives_up_when_the_control_plane_refuses_its_certificate(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    agent = processes.agent(control_plane, tmp_path / "state", certificate="node-stranger")

    await wait_until(agent.exited, within_s=15, what="the agent exits")

    assert agent.process.returncode == 1
    assert "right after the TLS handshake" in agent.log()
    assert f"llmgw-cli cert node {NODE_ID}`" in agent.log()
    assert control_plane.seen == []


async def test_an_agent_whose_certificate_expired_says_so_at_start(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    """Every control plane would hang up on it without saying why: the agent reads its own
    certificate's dates before it dials, names the end that explains it and the command
    that issues another, and dials nobody. (One that ends while the agent runs is named
    when it gives up: ``test_agent_refusal_advice.py``.)"""
    agent = processes.agent(control_plane, tmp_path / "state", certificate="node-expired")

    await wait_until(agent.exited, within_s=15, what="the agent exits")

    assert agent.process.returncode == 2
    assert f"expired at {EXPIRED_AT:%Y-%m-%d %H:%M} UTC" in agent.log()
    assert f"`llmgw-cli cert node {NODE_ID}`" in agent.log()
    assert control_plane.seen == []


async def test_an_agent_whose_clock_is_behind_its_certificate_fails_so_that_it_is_restarted(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    """A certificate not valid yet by the agent's clock is no configuration error: the
    clock is behind (a machine booted before NTP set it) and time alone fixes it. Exit 2
    would tell systemd (``RestartPreventExitStatus=2``) never to try again; 1 is retried."""
    agent = processes.agent(control_plane, tmp_path / "state", certificate="node-early")

    await wait_until(agent.exited, within_s=15, what="the agent exits")

    assert agent.process.returncode == 1
    assert "is valid only from" in agent.log()
    assert "and this machine's clock says" in agent.log()
    assert "check this machine's clock (NTP)" in agent.log()
    assert control_plane.seen == []


async def test_the_agent_gives_up_when_its_certificate_names_another_node(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    agent = processes.agent(control_plane, tmp_path / "state", node_id="gpu-02")

    await wait_until(agent.exited, within_s=15, what="the agent exits")

    assert agent.process.returncode == 1
    assert "refused this node (close code 1008)" in agent.log()
    assert "certificate common name 'gpu-01' does not match node id 'gpu-02'" in agent.log()
    assert not any(isinstance(observation, AgentHello) for observation in control_plane.seen)


async def test_the_agent_reconnects_after_the_control_plane_restarts_and_says_hello_again(
    control_plane: ControlPlane, processes: Processes, tmp_path: Path
) -> None:
    agent = processes.agent(control_plane, tmp_path / "state")
    await control_plane.hello()

    await control_plane.stop()
    await wait_until(
        lambda: "Connect call failed" in agent.log(),
        what="the agent tries again and finds nobody",
    )
    since = control_plane.mark()
    await control_plane.start()

    hello = await control_plane.hello(since=since)
    assert hello.node_id == NODE_ID
    assert not agent.exited()


async def test_the_agent_and_the_control_planes_own_hub_run_a_shard_together(
    pki: Path, processes: Processes, tmp_path: Path
) -> None:
    hub = RealHub(pki)
    await hub.start()
    try:
        processes.agent(hub, tmp_path / "state")
        assert len((await hub.hello()).gpus) == 2

        await hub.send(simulator_start("start-1", "m-1", free_port()))
        assert (await hub.status("m-1", "ready")).command_id == "start-1"
        stop = commands.StopShard(command_id="stop-1", replica_id="m-1", shard_index=0, grace_s=5)
        await hub.send(stop)
        assert (await hub.status("m-1", "stopped")).command_id == "stop-1"
        assert (await hub.result("stop-1")).ok
    finally:
        await hub.stop()


def agent_refused_at_start(pki: Path, state_dir: Path) -> subprocess.CompletedProcess[str]:
    """``llmgw-agent`` run with ``state_dir``, to a server nobody answers at: what it says
    when the state directory stops it before it dials."""
    return subprocess.run(
        [
            installed("llmgw-agent"),
            *("--server", f"wss://{LOOPBACK}:{free_port()}", "--node-id", NODE_ID),
            *("--ca", str(pki / "ca.crt"), "--cert", str(pki / "node.crt")),
            *("--key", str(pki / "node.key"), "--fake-gpus", "1x80GB"),
            *("--state-dir", str(state_dir)),
        ],
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda path: path.write_text("x\n"), "not a directory but a regular file"),
        (lambda path: os.mkfifo(path), "not a directory but a named pipe (FIFO)"),
        (
            lambda path: path.symlink_to(path.parent / "gone"),
            "a symbolic link to {parent}/gone, which does not exist",
        ),
    ],
    ids=["file", "fifo", "dangling-link"],
)
def test_an_agent_whose_state_directory_is_something_else_says_what_it_is(
    pki: Path, tmp_path: Path, make: Callable[[Path], object], what: str
) -> None:
    # Before, each was "cannot be used: File exists".
    state_dir = tmp_path / "state"
    make(state_dir)

    refused = agent_refused_at_start(pki, state_dir)

    assert refused.stderr == (
        f"llmgw-agent: the state directory {state_dir} cannot be used: "
        f"{what.format(parent=tmp_path)}; give one this agent's user can write (--state-dir, "
        "LLMGW_AGENT_STATE_DIR or state_dir in the config file)\n"
    )
    assert refused.returncode == 1


def test_an_agent_whose_lock_file_is_a_fifo_says_so(pki: Path, tmp_path: Path) -> None:
    # Before, "cannot be used: File or stream is not seekable."
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    os.mkfifo(state_dir / "agent.lock")

    refused = agent_refused_at_start(pki, state_dir)

    assert refused.stderr == (
        f"llmgw-agent: the state directory {state_dir} cannot be used "
        f"({state_dir / 'agent.lock'}): not a regular file but a named pipe (FIFO); give one "
        "this agent's user can write (--state-dir, LLMGW_AGENT_STATE_DIR or state_dir in the "
        "config file)\n"
    )
    assert refused.returncode == 1


def test_an_agent_whose_state_directory_cannot_be_made_says_where_to_set_another(
    pki: Path, tmp_path: Path
) -> None:
    occupied = tmp_path / "a-file"
    occupied.write_text("not a directory\n")
    state_dir = occupied / "state"

    refused = agent_refused_at_start(pki, state_dir)

    assert refused.stderr == (
        f"llmgw-agent: the state directory {state_dir} cannot be used: Not a directory; give "
        "one this agent's user can write (--state-dir, LLMGW_AGENT_STATE_DIR or state_dir in "
        "the config file)\n"
    )
    assert refused.returncode == 1
