"""The admin API served for a test: uvicorn on a loopback socket in the test's event loop,
plain HTTP or HTTPS with the llmgw CA, the way ``llmgw-server serve`` runs it; and a
private CA with the certificates those tests present."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from ipaddress import ip_address
from pathlib import Path

import uvicorn
from cryptography import x509

from app.admin.app import create_admin_app
from app.admin.auth import TokenAuthenticator
from app.admin.metrics import LiveSource
from app.admin.tls import TlsScopeProtocol, admin_ssl_context
from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    GpuInfo,
    NodeConnected,
    NodeRegistered,
    ReplicaPlaced,
    ReplicaServing,
    ShardPlacement,
    model_stream,
    node_stream,
    replica_stream,
)
from app.pki import build_ca, generate_key, issue_node, issue_operator, issue_server
from app.pki.files import write_ca, write_issued
from app.pki.keys import PrivateKey
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.waiting import wait_until

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Pki:
    """Files of a test CA: ``ca.crt``, ``server.crt`` for the loopback address, an operator
    certificate, a node certificate, and an operator certificate from a stranger CA."""

    directory: Path
    operator: str
    node: str

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def pair(self, stem: str) -> tuple[Path, Path]:
        return self.directory / f"{stem}.crt", self.directory / f"{stem}.key"

    def server_context(self) -> ssl.SSLContext:
        return admin_ssl_context(*self.pair("server"), self.ca)

    def client_context(self, stem: str | None = None) -> ssl.SSLContext:
        """Trusting the test CA, presenting ``stem``'s certificate if given."""
        context = ssl.create_default_context(cafile=self.ca)
        if stem is not None:
            context.load_cert_chain(*self.pair(stem))
        return context


def write_pki(directory: Path, operator: str, node: str) -> Pki:
    now = datetime.now(UTC)
    ca = build_ca(generate_key(), "llmgw test CA", now, 2)
    write_ca(directory, ca, force=False)
    stranger = build_ca(generate_key(), "llmgw test CA", now, 2)
    builders: dict[str, Callable[[PrivateKey], x509.Certificate]] = {
        "server": lambda key: issue_server(ca, key, [], [ip_address(LOOPBACK)], now, 1),
        "operator": lambda key: issue_operator(ca, key, operator, now, 1),
        "node": lambda key: issue_node(ca, key, node, now, 1),
        "stranger": lambda key: issue_operator(stranger, key, operator, now, 1),
    }
    for stem, build in builders.items():
        key = generate_key()
        write_issued(directory, stem, build(key), key, force=False)
    return Pki(directory=directory, operator=operator, node=node)


@asynccontextmanager
async def serving_admin(
    store: PostgresEventStore,
    *,
    tokens: dict[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
    live: LiveSource | None = None,
) -> AsyncIterator[str]:
    """The admin API over ``store`` until the block ends; yields its base URL."""
    app = create_admin_app(store, TokenAuthenticator(tokens or {}), live=live)
    listener = socket.socket()
    listener.bind((LOOPBACK, 0))
    port = listener.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="on",
        http=TlsScopeProtocol,
        ssl_context_factory=(lambda _config, _default: tls) if tls is not None else None,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await wait_until(lambda: server.started, within_s=10, what="admin API listening")
        yield f"{'https' if tls else 'http'}://{LOOPBACK}:{port}"
    finally:
        server.should_exit = True
        await serving
        listener.close()


# -- seeding what agents and the reconciler would record ---------------------------------


def gpu(index: int) -> GpuInfo:
    return GpuInfo(index=index, uuid=f"GPU-{index}", name="H100", memory_total_mib=81559)


async def record(
    store: PostgresEventStore, actor: str, *events: AnyEvent, stream: str | None = None
) -> None:
    for event in events:
        await store.append(stream or stream_of(event), None, [NewEvent(event)], Meta(actor=actor))


def stream_of(event: AnyEvent) -> str:
    if (replica_id := getattr(event, "replica_id", None)) is not None:
        return replica_stream(replica_id)
    if (node_id := getattr(event, "node_id", None)) is not None:
        return node_stream(node_id)
    return model_stream(getattr(event, "model", ""))


async def seed_node(store: PostgresEventStore, node_id: str, gpus: int = 2) -> None:
    inventory = tuple(gpu(i) for i in range(gpus))
    await record(
        store,
        f"agent:{node_id}",
        NodeRegistered(node_id=node_id, address="10.0.0.7", gpus=inventory),
        NodeConnected(node_id=node_id, address="10.0.0.7", gpus=inventory),
    )


async def seed_serving_replica(store: PostgresEventStore, replica_id: str, node_id: str) -> None:
    model, number = replica_id.rsplit("-", 1)
    shard = ShardPlacement(index=0, node_id=node_id, gpus=(0,), port=20000)
    await record(
        store,
        "reconciler",
        ReplicaPlaced(replica_id=replica_id, model=model, number=int(number), shards=(shard,)),
        ReplicaServing(replica_id=replica_id),
    )


async def last_position(store: PostgresEventStore) -> int:
    """The log's last position: unchanged means nothing was appended."""
    return await store.last_position()
