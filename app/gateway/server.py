"""A gateway assembled: a snapshot source, the router, the ASGI app, and uvicorn.

    gateway = Gateway(source, host="0.0.0.0", port=8080)
    await gateway.start()        # listening once this returns
    ...                          # gateway.in_flight() for the database's drain accounting
    await gateway.stop()         # in-flight requests finish (up to ``graceful_shutdown_s``)

``serve()`` is ``start()`` and then waiting until ``stop()`` is called or uvicorn stops by
itself. Signals are the caller's: the server installs no handlers of its own.

Where the routing table and keys come from is a ``SnapshotSource``: PostgreSQL in
production (``app.gateway.source``), a ``StaticSource`` holding one snapshot in tests and
benchmarks. Run the loop on uvloop (``uvloop.run(...)``) for the figures in
docs/performance.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from typing import Protocol

import uvicorn
from prometheus_client import CollectorRegistry
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.edge.limits import ListenerLimits, limited
from app.gateway.app import GatewayApp
from app.gateway.errors import listener_refusal
from app.gateway.metrics import GatewayMetrics
from app.gateway.ratelimit import RateLimiter
from app.gateway.router import Router
from app.gateway.table import GatewaySnapshot, SnapshotListener


class SnapshotSource(Protocol):
    def current(self) -> GatewaySnapshot:
        """The latest snapshot."""
        ...

    def fresh(self) -> bool:
        """Whether the snapshot follows the source of truth (false: the last one known)."""
        ...

    def stale_reason(self) -> str:
        """Why ``fresh()`` is false, for ``/readyz``."""
        ...

    def subscribe(self, callback: SnapshotListener) -> None:
        """Call ``callback`` (on the gateway's loop) with each new snapshot."""
        ...


class StaticSource:
    """One snapshot, always fresh; ``publish`` replaces it (call it on the gateway's loop)."""

    def __init__(self, snapshot: GatewaySnapshot) -> None:
        self._snapshot = snapshot
        self._listeners: list[SnapshotListener] = []

    def current(self) -> GatewaySnapshot:
        return self._snapshot

    def fresh(self) -> bool:
        return True

    def stale_reason(self) -> str:
        return ""

    def subscribe(self, callback: SnapshotListener) -> None:
        self._listeners.append(callback)

    def publish(self, snapshot: GatewaySnapshot) -> None:
        self._snapshot = snapshot
        for listener in self._listeners:
            listener(snapshot)


DEFAULT_MAX_CONNECTIONS = 4096
"""Client connections one gateway holds; each stream is one. Raise ``ulimit -n`` above it."""


class GatewayFailed(RuntimeError):
    """The gateway could not start listening, or stopped by itself."""


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the gateway's owner decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class Gateway:
    def __init__(
        self,
        source: SnapshotSource,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        queue_timeout_s: float = 5.0,
        queue_limit: int = 1000,
        scrape_interval_s: float = 0.25,
        connect_timeout_s: float = 5.0,
        graceful_shutdown_s: int = 30,
        registry: CollectorRegistry | None = None,
        log_requests: bool = True,
        limits: ListenerLimits | None = None,
    ) -> None:
        """``port`` 0 takes a free port (``self.port`` says which once started)."""
        self.source = source
        self.host = host
        self.port = port
        self.limits = limits or ListenerLimits(max_connections=DEFAULT_MAX_CONNECTIONS)
        self.router = Router(
            queue_timeout_s=queue_timeout_s,
            queue_limit=queue_limit,
            scrape_interval_s=scrape_interval_s,
        )
        self.metrics = GatewayMetrics(registry)
        self.metrics.watch_replicas(self.router.replica_views, self.router.queued)
        self.app = GatewayApp(
            router=self.router,
            metrics=self.metrics,
            limiter=RateLimiter(),
            stale_reason=self._stale_reason,
            connect_timeout_s=connect_timeout_s,
            log_requests=log_requests,
        )
        self._graceful_shutdown_s = graceful_shutdown_s
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """Base URL of the OpenAI API, e.g. ``http://127.0.0.1:8080/v1``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def in_flight(self) -> dict[str, int]:
        """Requests open per replica (replicas just taken out of routing included)."""
        return self.router.in_flight()

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the gateway is started already")
        self._use(self.source.current())
        self.source.subscribe(self._use)
        listener = _listen(self.host, self.port)
        self.port = listener.getsockname()[1]
        protocol: type[HttpToolsProtocol] = limited(
            HttpToolsProtocol, self.limits, listener_refusal
        )
        config = uvicorn.Config(
            self.app,
            http=protocol,
            ws="none",
            lifespan="on",
            access_log=False,
            log_config=None,
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=self._graceful_shutdown_s,
        )
        server = self._server = _Server(config)
        self._task = asyncio.get_running_loop().create_task(
            server.serve(sockets=[listener]), name=f"gateway :{self.port}"
        )
        while not server.started:
            if self._task.done():
                listener.close()
                raise GatewayFailed(f"the gateway on {self.url} did not start") from (
                    self._task.exception()
                )
            await asyncio.sleep(0.01)

    async def serve(self) -> None:
        """Serve until ``stop()``."""
        if self._task is None:
            await self.start()
        assert self._task is not None
        await asyncio.shield(self._task)

    async def stop(self) -> None:
        server, task = self._server, self._task
        if server is None or task is None:
            return
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def _use(self, snapshot: GatewaySnapshot) -> None:
        self.app.use(snapshot)
        self.router.update(snapshot)

    def _stale_reason(self) -> str | None:
        if self.source.fresh():
            return None
        return self.source.stale_reason() or "the routing table is stale"


def _listen(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without it, uvicorn's two writes per answer (head,
    # then body) wait on the client's delayed ACK, adding milliseconds to every request.
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        listener.bind(address)
    except OSError:
        listener.close()
        raise
    return listener
