"""In-process agents for control-plane tests: real mutual TLS, real WebSockets, the real
protocol, and no engines behind them.

A ``FakeAgent`` says hello with an inventory of shards, heartbeats, and answers commands as
a healthy agent would: ``start_shard`` with ``shard_status`` starting then ready,
``stop_shard`` with stopped, each followed by a ``command_result`` (or, told to, refuses
every start in its ``command_result``, as an agent whose checks fail it). Every command it
receives is kept, so a test can say exactly what the control plane sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import ssl
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from app.pki.builders import build_ca, issue_node, issue_server
from app.pki.files import write_ca, write_issued
from app.pki.keys import generate_key
from app.pki.model import CertificateAuthority
from app.pki.tls import client_ssl_context, server_ssl_context
from wire.messages import (
    PROTOCOL_VERSION,
    AgentMessage,
    CommandResult,
    GpuReport,
    Heartbeat,
    HeartbeatShard,
    Hello,
    ShardReport,
    ShardState,
    ShardStatus,
    StartShard,
    StopShard,
    Welcome,
    decode_from_server,
    encode,
)

LOOPBACK = "127.0.0.1"
DEADLINE_S = 10.0
FIRST_FAKE_PID = 4000


@dataclass(frozen=True)
class AgentPki:
    """A CA with a server certificate for 127.0.0.1, issuing node certificates on demand."""

    directory: Path
    ca: CertificateAuthority
    now: datetime

    def node(self, node_id: str) -> ssl.SSLContext:
        key = generate_key()
        certificate = issue_node(self.ca, key, node_id, self.now, 1)
        files = write_issued(self.directory, uuid.uuid4().hex, certificate, key, force=False)
        return client_ssl_context(self.directory / "ca.crt", files.certificate, files.key)

    def server_context(self) -> ssl.SSLContext:
        d = self.directory
        return server_ssl_context(d / "server.crt", d / "server.key", d / "ca.crt")


def make_pki(directory: Path) -> AgentPki:
    now = datetime.now(UTC)
    ca = build_ca(generate_key(), "llmgw CA", now, 30)
    write_ca(directory, ca, force=False)
    key = generate_key()
    server = issue_server(ca, key, ["localhost"], [ipaddress.ip_address(LOOPBACK)], now, 1)
    write_issued(directory, "server", server, key, force=False)
    return AgentPki(directory=directory, ca=ca, now=now)


def gpu(index: int, node_id: str = "") -> GpuReport:
    """GPU ``index`` of ``node_id``: nodes named apart list UUIDs apart, as no two machines
    hold one GPU (``app.domain.gpu_claims``)."""
    return GpuReport(
        index=index,
        uuid=f"GPU-{node_id}-{index}" if node_id else f"GPU-{index}",
        name="H100",
        memory_total_mib=81559,
        memory_used_mib=0,
        healthy=True,
    )


def running_shard(
    replica_id: str, port: int, *, shard_index: int = 0, pid: int = 4242, model: str = "m"
) -> ShardReport:
    """A shard an agent lists in its hello as ready."""
    return ShardReport(
        replica_id=replica_id,
        shard_index=shard_index,
        model=model,
        port=port,
        gpus=(0,),
        pid=pid,
        state="ready",
        started_at=datetime.now(UTC),
    )


@dataclass(eq=False)
class FakeAgent:
    node_id: str
    websocket: ClientConnection
    welcome: Welcome
    shards: dict[tuple[str, int], ShardReport]
    obeys: bool = True
    """False: commands are kept but not carried out (an agent whose engines will not stop)."""
    refuses_starts: str | None = None
    """Set: every ``start_shard`` is refused with this reason, before anything starts."""
    received: list[StartShard | StopShard] = field(default_factory=list)
    _pids: itertools.count[int] = field(default_factory=lambda: itertools.count(FIRST_FAKE_PID))

    def starts(self) -> list[StartShard]:
        return [c for c in self.received if isinstance(c, StartShard)]

    def stops(self) -> list[StopShard]:
        return [c for c in self.received if isinstance(c, StopShard)]

    async def say(self, message: AgentMessage) -> None:
        await self.websocket.send(encode(message), text=True)

    async def answer_commands(self) -> None:
        async for frame in self.websocket:
            message = decode_from_server(frame)
            if isinstance(message, StartShard | StopShard):
                self.received.append(message)
            if not self.obeys:
                continue
            if isinstance(message, StartShard):
                await self._start(message)
            elif isinstance(message, StopShard):
                await self._stop(message)

    async def heartbeat(self, interval_s: float) -> None:
        for seq in itertools.count():
            listed = tuple(
                HeartbeatShard(replica_id=s.replica_id, shard_index=s.shard_index, state=s.state)
                for s in self.shards.values()
            )
            await self.say(Heartbeat(seq=seq, shards=listed))
            await asyncio.sleep(interval_s)

    async def _start(self, command: StartShard) -> None:
        if self.refuses_starts is not None:
            refused = CommandResult(
                command_id=command.command_id, ok=False, error=self.refuses_starts
            )
            await self.say(refused)
            return
        pid = next(self._pids)
        for state in ("starting", "ready"):
            self._record(command.replica_id, command.shard_index, command.port, pid, state)
            await self.say(
                ShardStatus(
                    replica_id=command.replica_id,
                    shard_index=command.shard_index,
                    state=state,
                    pid=pid,
                    port=command.port,
                    command_id=command.command_id,
                )
            )
        await self.say(CommandResult(command_id=command.command_id, ok=True))

    async def _stop(self, command: StopShard) -> None:
        known = self.shards.pop((command.replica_id, command.shard_index), None)
        if known is not None:
            await self.say(
                ShardStatus(
                    replica_id=command.replica_id,
                    shard_index=command.shard_index,
                    state="stopped",
                    pid=known.pid,
                    port=known.port,
                    exit_code=0,
                    command_id=command.command_id,
                )
            )
        await self.say(CommandResult(command_id=command.command_id, ok=True))

    def _record(
        self, replica_id: str, shard_index: int, port: int, pid: int, state: ShardState
    ) -> None:
        self.shards[(replica_id, shard_index)] = ShardReport(
            replica_id=replica_id,
            shard_index=shard_index,
            model="",
            port=port,
            gpus=(0,),
            pid=pid,
            state=state,
            started_at=datetime.now(UTC),
        )


@asynccontextmanager
async def fake_agent(
    port: int,
    pki: AgentPki,
    node_id: str,
    *,
    gpus: int = 1,
    shards: Sequence[ShardReport] = (),
    heartbeat_interval_s: float = 0.5,
    obeys: bool = True,
    refuses_starts: str | None = None,
    port_range: tuple[int, int] = (20000, 20099),
) -> AsyncIterator[FakeAgent]:
    """An agent connected to the hub on ``port`` that has said hello and been welcomed."""
    hello = Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id=node_id,
        agent_version="fake",
        address=LOOPBACK,
        port_range=port_range,
        gpus=tuple(gpu(i, node_id) for i in range(gpus)),
        shards=tuple(shards),
    )
    async with connect(
        f"wss://{LOOPBACK}:{port}", ssl=pki.node(node_id), open_timeout=DEADLINE_S
    ) as websocket:
        await websocket.send(encode(hello), text=True)
        async with asyncio.timeout(DEADLINE_S):
            welcome = decode_from_server(await websocket.recv())
        assert isinstance(welcome, Welcome), welcome
        agent = FakeAgent(
            node_id=node_id,
            websocket=websocket,
            welcome=welcome,
            obeys=obeys,
            refuses_starts=refuses_starts,
            shards={(s.replica_id, s.shard_index): s for s in shards},
        )
        tasks = [
            asyncio.create_task(agent.answer_commands()),
            asyncio.create_task(agent.heartbeat(heartbeat_interval_s)),
        ]
        try:
            yield agent
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                    await task
