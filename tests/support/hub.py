"""The agent hub for tests that speak its protocol by hand: a test CA, a hub on 127.0.0.1
over a real PostgreSQL store, and plain WebSocket clients that send the messages of
``wire.messages`` themselves, so each story shows exactly what goes over the wire.

Node certificates issued here name ``ENGINE_ADDRESS``, the address the hand-made hellos
advertise for their engines, as a subject alternative name (the hub accepts only an address
the certificate names or the connection comes from)."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from cryptography import x509
from websockets.asyncio.client import ClientConnection, connect

from app.domain.events import event_type
from app.hub.hub import AgentHub
from app.pki.builders import build_ca, issue_node, issue_server
from app.pki.files import write_ca, write_issued
from app.pki.keys import PrivateKey, generate_key
from app.pki.model import CertificateAuthority
from app.pki.tls import client_ssl_context, server_ssl_context
from app.services.agent_reports import ReportHandler, ReportRecorder
from app.store.postgres import PostgresEventStore
from wire.messages import (
    PROTOCOL_VERSION,
    AgentMessage,
    GpuReport,
    Hello,
    ServerMessage,
    Welcome,
    decode_from_server,
    encode,
)

LOOPBACK = "127.0.0.1"
ENGINE_ADDRESS = "127.0.0.7"
DEADLINE_S = 10.0


# -- certificates ------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca: CertificateAuthority
    stranger: CertificateAuthority
    now: datetime

    def client(self, build: Callable[[PrivateKey], x509.Certificate]) -> ssl.SSLContext:
        """An agent's TLS context presenting the certificate ``build`` makes, whatever it
        is: a peer is not held to the checks llmgw's own agent makes of its certificate
        before it dials (in date, for a client)."""
        key = generate_key()
        stem = uuid.uuid4().hex
        files = write_issued(self.directory, stem, build(key), key, force=False)
        context = client_ssl_context(self.directory / "ca.crt")
        context.load_cert_chain(certfile=files.certificate, keyfile=files.key)
        return context

    def node(self, node_id: str, *, ips: tuple[str, ...] = (ENGINE_ADDRESS,)) -> ssl.SSLContext:
        """A node certificate naming ``ips`` (by default the address hellos advertise)."""
        addresses = [ipaddress.ip_address(ip) for ip in ips]
        return self.client(
            lambda key: issue_node(self.ca, key, node_id, self.now, 1, ips=addresses)
        )

    def anonymous(self) -> ssl.SSLContext:
        return client_ssl_context(self.directory / "ca.crt")

    def server_context(self) -> ssl.SSLContext:
        d = self.directory
        return server_ssl_context(d / "server.crt", d / "server.key", d / "ca.crt")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("hub-pki")
    now = datetime.now(UTC)
    ca = build_ca(generate_key(), "llmgw CA", now, 30)
    write_ca(directory, ca, force=False)
    key = generate_key()
    server = issue_server(ca, key, ["localhost"], [ipaddress.ip_address(LOOPBACK)], now, 1)
    write_issued(directory, "server", server, key, force=False)
    stranger = build_ca(generate_key(), "llmgw CA", now, 30)
    return Pki(directory=directory, ca=ca, stranger=stranger, now=now)


# -- the hub and agents ------------------------------------------------------------------


RunHub = Callable[..., AbstractAsyncContextManager[AgentHub]]


@pytest_asyncio.fixture(loop_scope="session")
async def run_hub(pg_store: PostgresEventStore, pki: Pki) -> RunHub:
    @asynccontextmanager
    async def running(
        heartbeat_interval_s: float = 1.0,
        heartbeat_timeout_s: float = 10.0,
        handler: ReportHandler | None = None,
        **options: Any,
    ) -> AsyncIterator[AgentHub]:
        """The hub, its reports recorded in ``pg_store`` (through ``handler`` if given)."""
        hub = AgentHub(
            handler or ReportRecorder(pg_store),
            pki.server_context(),
            heartbeat_interval_s=heartbeat_interval_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            server_id="test-hub",
            **options,
        )
        await pg_store.catch_up()  # as the leader does before it listens: not in a connection
        await hub.start(LOOPBACK, 0)
        try:
            yield hub
        finally:
            await hub.stop()

    return running


@pytest_asyncio.fixture(loop_scope="session")
async def hub(run_hub: RunHub) -> AsyncIterator[AgentHub]:
    async with run_hub() as running:
        yield running


def dial(hub: AgentHub, context: ssl.SSLContext, *, source: str | None = None) -> connect:
    """A WebSocket connection to ``hub``; from the loopback address ``source`` if given
    (any of 127.0.0.0/8 is this host), else from 127.0.0.1."""
    return connect(
        f"wss://{LOOPBACK}:{hub.port}",
        ssl=context,
        open_timeout=DEADLINE_S,
        local_addr=(source, 0) if source is not None else None,
    )


def new_node_id() -> str:
    return f"gpu-{uuid.uuid4().hex[:8]}"


def gpu(index: int) -> GpuReport:
    return GpuReport(
        index=index,
        uuid=f"GPU-{index}",
        name="H100",
        memory_total_mib=81559,
        memory_used_mib=0,
        healthy=True,
    )


def hello(node_id: str) -> Hello:
    return Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id=node_id,
        agent_version="test",
        address=ENGINE_ADDRESS,
        labels={"zone": "a"},
        port_range=(20000, 20099),
        gpus=(gpu(0),),
    )


async def say(agent: ClientConnection, message: AgentMessage) -> None:
    await agent.send(encode(message), text=True)


async def hear(agent: ClientConnection) -> ServerMessage:
    async with asyncio.timeout(DEADLINE_S):
        return decode_from_server(await agent.recv())


def hello_apart(node_id: str) -> Hello:
    """``hello(node_id)`` with a GPU UUID of its own: two nodes that list one UUID are
    told apart (``app.domain.gpu_claims``), and the one connected later warned of."""
    return msgspec.structs.replace(
        hello(node_id), gpus=(msgspec.structs.replace(gpu(0), uuid=f"GPU-{node_id}-0"),)
    )


async def greet(agent: ClientConnection, node_id: str, message: Hello | None = None) -> Welcome:
    """Say ``message`` (``hello(node_id)`` by default) and hear the welcome."""
    await say(agent, message or hello(node_id))
    welcome = await hear(agent)
    assert isinstance(welcome, Welcome)
    return welcome


async def close_code(agent: ClientConnection) -> int | None:
    """The code the hub closed ``agent`` with, once the closing handshake is over."""
    async with asyncio.timeout(DEADLINE_S):
        await agent.wait_closed()
    return agent.close_code


async def event_types(store: PostgresEventStore, stream: str) -> list[str]:
    return [event_type(recorded.event) for recorded in await store.read_stream(stream)]


def stream_is(
    store: PostgresEventStore, stream: str, expected: list[str]
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await event_types(store, stream) == expected

    return check
