"""The admin API served for a test: uvicorn on a loopback socket in the test's event loop,
plain HTTP or HTTPS with the llmgw CA, the way ``llmgw-server serve`` runs it; a private CA
with the certificates those tests present; and the log seeded as agents and the reconciler
record it."""

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
from typing import Any

import httpx
import uvicorn
from cryptography import x509
from litestar.types import ASGIApp

from app.admin.app import create_admin_app
from app.admin.auth import TokenAuthenticator
from app.admin.events import end_event_streams
from app.admin.health import Readiness
from app.admin.metrics import LiveSource
from app.admin.tls import (
    DEFAULT_ADMIN_KEEP_ALIVE_S,
    DEFAULT_ADMIN_MAX_CONNECTIONS,
    admin_protocol,
    admin_ssl_context,
)
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
from app.listeners.limits import ListenerLimits
from app.listeners.refusals import ListenerRefusals
from app.listeners.throttle import FailureBudget, FailureLimits
from app.pki.builders import build_ca, issue_node, issue_operator, issue_server
from app.pki.files import write_ca, write_issued
from app.pki.keys import PrivateKey, generate_key
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.waiting import wait_until

LOOPBACK = "127.0.0.1"
SHUTDOWN_GRACE_S = 2
"""As ``llmgw-server serve``: requests still going on this long after the stop are cut."""


@dataclass(frozen=True)
class Pki:
    """Files of a test CA: ``ca.crt``, ``server.crt`` for the loopback address, an operator
    certificate, a node certificate; and a stranger CA (``stranger/ca.crt``) with an
    operator certificate of its own (``stranger.crt``)."""

    directory: Path
    operator: str
    node: str

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def stranger_ca(self) -> Path:
        """A CA that issued none of the other files."""
        return self.directory / "stranger" / "ca.crt"

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
    write_ca(directory / "stranger", stranger, force=False)
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
    port: int | None = None,
    limits: ListenerLimits | None = None,
    auth_failures: FailureLimits | None = None,
    wrap: Callable[[ASGIApp], ASGIApp] | None = None,
    readiness: Readiness | None = None,
    keep_alive_s: float = DEFAULT_ADMIN_KEEP_ALIVE_S,
) -> AsyncIterator[str]:
    """The admin API over ``store`` until the block ends, on ``port`` or a free one; yields
    its base URL. ``tokens`` maps each token to the operator it names; ``limits`` are the
    listener's and ``auth_failures`` the budget of wrong tokens per address, as ``serve``
    sets them by default; ``readiness`` what ``/readyz`` checks (by default the store's
    database); ``keep_alive_s`` how long a kept-alive connection may idle between
    requests."""
    authenticator = TokenAuthenticator(tokens or {}, FailureBudget(auth_failures))
    refusals = ListenerRefusals("admin")
    app = create_admin_app(store, authenticator, readiness, live=live, listener_refusals=refusals)
    listener = socket.socket()
    # A test that serves again on the same port must not wait out the old one's TIME_WAIT.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LOOPBACK, port or 0))
    config = uvicorn.Config(
        wrap(app) if wrap is not None else app,
        log_level="warning",
        lifespan="on",
        http=admin_protocol(
            limits or ListenerLimits(max_connections=DEFAULT_ADMIN_MAX_CONNECTIONS),
            refusals,
            keep_alive_s=keep_alive_s,
        ),
        ws="none",
        ssl_context_factory=(lambda _config, _default: tls) if tls is not None else None,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await wait_until(lambda: server.started, within_s=10, what="admin API listening")
        yield f"{'https' if tls else 'http'}://{LOOPBACK}:{listener.getsockname()[1]}"
    finally:
        end_event_streams(app)
        server.should_exit = True
        await serving
        listener.close()


def bearer_client(url: str, token: str) -> httpx.AsyncClient:
    """An HTTP client of the admin API at ``url`` that presents ``token``."""
    return httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {token}"})


# -- seeding what agents and the reconciler would record ---------------------------------


def gpu(index: int, node_id: str = "") -> GpuInfo:
    """GPU ``index`` of ``node_id``: nodes named apart list UUIDs apart, as no two machines
    hold one GPU (``app.domain.gpu_claims``)."""
    uuid = f"GPU-{node_id}-{index}" if node_id else f"GPU-{index}"
    return GpuInfo(index=index, uuid=uuid, name="H100", memory_total_mib=81559)


async def record(
    store: PostgresEventStore, actor: str, *events: AnyEvent, correlation_id: str | None = None
) -> None:
    """Append each event to its own stream, one at a time, as ``actor``."""
    meta = Meta(actor=actor, correlation_id=correlation_id)
    for event in events:
        await store.append(stream_of(event), None, [NewEvent(event)], meta)


def stream_of(event: AnyEvent) -> str:
    if (replica_id := getattr(event, "replica_id", None)) is not None:
        return replica_stream(replica_id)
    if (node_id := getattr(event, "node_id", None)) is not None:
        return node_stream(node_id)
    return model_stream(getattr(event, "model", ""))


async def seed_node(
    store: PostgresEventStore,
    node_id: str,
    gpus: int = 2,
    labels: dict[str, str] | None = None,
) -> None:
    """A node that registered and is connected, with ``gpus`` healthy H100s."""
    inventory = tuple(gpu(i, node_id) for i in range(gpus))
    address = "127.0.0.7"
    await record(
        store,
        f"agent:{node_id}",
        NodeRegistered(node_id=node_id, address=address, gpus=inventory, labels=labels or {}),
        NodeConnected(
            node_id=node_id,
            address=address,
            gpus=inventory,
            labels=labels or {},
            agent_version="0.1",
        ),
    )


async def seed_serving_replica(store: PostgresEventStore, replica_id: str, node_id: str) -> None:
    """``replica_id`` (``<model>-<n>``) placed on GPU 0 of ``node_id``, and serving."""
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


def problem_of(answer: httpx.Response, status: int) -> dict[str, Any]:
    """The problem document of ``answer``, which must have ``status``."""
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = answer.json()
    return body
