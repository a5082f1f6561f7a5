"""A gateway assembled: a snapshot source, the egress check, the router, the ASGI app, and
the listeners' own HTTP server (``app.listeners.httpserver``).

    gateway = Gateway(source, host="0.0.0.0", port=8080)
    await gateway.start()        # listening once this returns
    ...                          # gateway.in_flight() for the database's drain accounting,
                                 # gateway.queued() for the autoscaler's demand,
                                 # gateway.traffic_report() for the replicas' figures,
                                 # gateway.ejected() for the replicas it keeps out
    await gateway.stop()         # in-flight requests finish (up to ``graceful_shutdown_s``)

``serve()`` is ``start()`` and then waiting until ``stop()`` is called. Signals are the
caller's: the server installs no handlers of its own.

Where the routing table and keys come from is a ``SnapshotSource``: PostgreSQL in
production (``app.gateway.source``), a ``StaticSource`` holding one snapshot in tests and
benchmarks. Each snapshot passes the egress check (``app.gateway.egress``) before the
router and the app see it: ``engine_networks`` says where engines may be contacted. Run the
loop on uvloop (``uvloop.run(...)``) for the figures in
docs/performance.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import structlog
from prometheus_client import CollectorRegistry

from app.domain.egress import EngineNetworks
from app.domain.traffic_cut import in_canary_step
from app.gateway.app import GatewayApp, MetricsApp
from app.gateway.egress import EngineEgress
from app.gateway.ejection import EjectionPolicy
from app.gateway.engine_bounds import EngineTimeouts
from app.gateway.errors import listener_refusal
from app.gateway.metrics import GatewayMetrics
from app.gateway.ratelimit import Limiter, RateLimiter
from app.gateway.request_body import MAX_BODY_BYTES
from app.gateway.router import Router
from app.gateway.table import GatewaySnapshot, SnapshotListener
from app.gateway.traffic import TrafficWindow
from app.gateway.uploads import DEFAULT_MAX_UPLOAD_BYTES
from app.listeners.binding import CannotListen, bound_listener
from app.listeners.heap import settle_heap
from app.listeners.httpserver import HttpServer
from app.listeners.lifespan import LifespanFailed
from app.listeners.limits import ListenerLimits
from app.listeners.refusals import ListenerRefusals
from app.listeners.throttle import FailureBudget, FailureLimits
from app.store.gateway_reports import MAX_REPORTED_REPLICAS, TrafficReport, bounded

log = structlog.get_logger("llmgw.gateway")


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
DEFAULT_METRICS_HOST = "127.0.0.1"
DEFAULT_METRICS_PORT = 8082
MAX_METRICS_CONNECTIONS = 64
DEFAULT_SHUTDOWN_GRACE_S = 30.0
"""How long a stopping gateway lets its open requests finish before it cancels them. Below
the usual termination grace of its supervisor (Kubernetes' ``terminationGracePeriodSeconds``
and systemd's ``TimeoutStopSec`` are 30 s and 90 s), which kills the process when it runs
out; ``--shutdown-grace`` aligns it with a longer or shorter one."""
MAX_SHUTDOWN_GRACE_S = 86400.0
IDLE_KEEP_ALIVE_S = 75
"""How long a client's kept-alive connection may sit idle between requests. Longer than
the pools of common clients keep one (httpx and so the ``openai`` SDK: 5 s; aiohttp: 15 s),
so that the client gives up an idle connection before the gateway does: a gateway that
closes first races the client's next request on it, which then fails without having been
sent anywhere. nginx's default, 75 s."""


class GatewayFailed(RuntimeError):
    """The gateway could not start listening, or stopped by itself."""


class _Listening:
    """One HTTP server on one socket, and the task serving it."""

    def __init__(self, server: HttpServer, task: asyncio.Task[None], port: int) -> None:
        self.server = server
        self.task = task
        self.port = port

    async def stop(self) -> None:
        self.server.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def _serve_on(
    app: GatewayApp | MetricsApp,
    host: str,
    port: int,
    *,
    limits: ListenerLimits,
    lifespan: bool,
    graceful_shutdown_s: float,
    what: str,
    refusals: ListenerRefusals,
    reuse_port: bool = False,
) -> _Listening:
    """Serve ``app`` on ``host``:``port``; listening once this returns."""
    try:
        # Says which listener: a gateway has two, and "address in use" alone does not tell.
        listener = bound_listener(what, host, port, reuse_port=reuse_port, no_delay=True)
    except CannotListen as exc:
        raise GatewayFailed(str(exc)) from exc
    port = listener.getsockname()[1]
    server = HttpServer(
        app,
        limits=limits,
        refusal=listener_refusal,
        refusals=refusals,
        idle_s=IDLE_KEEP_ALIVE_S,
        graceful_shutdown_s=graceful_shutdown_s,
        lifespan=lifespan,
    )
    try:
        await server.start(listener)
    except (LifespanFailed, OSError) as exc:
        listener.close()
        raise GatewayFailed(f"the {what} on {host}:{port} did not start: {exc}") from exc
    task = asyncio.get_running_loop().create_task(server.serve(), name=f"{what} :{port}")
    return _Listening(server, task, port)


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
        engine_timeouts: EngineTimeouts | None = None,
        graceful_shutdown_s: float = DEFAULT_SHUTDOWN_GRACE_S,
        registry: CollectorRegistry | None = None,
        log_requests: bool = True,
        engine_networks: EngineNetworks | None = None,
        limits: ListenerLimits | None = None,
        metrics_host: str = DEFAULT_METRICS_HOST,
        metrics_port: int | None = None,
        auth_failures: FailureLimits | None = None,
        ejection: EjectionPolicy | None = None,
        max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
        limiter: Limiter | None = None,
        limits_reason: Callable[[], str | None] = lambda: None,
        reuse_port: bool = False,
        settle: bool = True,
    ) -> None:
        """``port`` 0 takes a free port (``self.port`` says which once started).
        ``engine_networks`` is where engines may be contacted; None: each node only at the
        address its agent connected from (``app.gateway.egress``). ``metrics_port`` (0: a
        free one) serves ``/metrics`` on a listener of its own; None serves it nowhere
        (``self.metrics.render()`` is the page). ``ejection``: when a replica that keeps failing
        is taken out of this gateway's rotation (``app.gateway.ejection``). ``max_upload_bytes``
        bounds an upload's body (``app.gateway.uploads``). ``limiter`` counts keys' rpm and
        tpm (this gateway's own ``RateLimiter`` when None); ``limits_reason`` says, for
        ``/readyz``, why limits are only approximate now (None: they are not).
        ``engine_timeouts``: how long an engine may take to answer, and be silent once it
        has begun (``app.gateway.engine_bounds``). ``graceful_shutdown_s``: how long
        ``stop()`` lets open requests finish before it cancels them (each is then told the
        gateway stopped, within a second more: ``app.listeners.httpserver``).
        ``reuse_port``: listen with ``SO_REUSEPORT``, so that several gateway processes
        share the client port and the kernel spreads new connections among them (one
        process is one core); the metrics listener is each process's own. ``settle``: settle
        the process's heap once started (``app.listeners.heap``; a process that runs more
        than this gateway, a test's, may not want its objects frozen)."""
        self.source = source
        self.host = host
        self.port = port
        self.metrics_host = metrics_host
        self.metrics_port = metrics_port
        # The listener refuses a body announced over the largest any route takes before
        # the app sees it; each route holds its own to its limit (``MAX_BODY_BYTES``).
        self.limits = replace(
            limits or ListenerLimits(max_connections=DEFAULT_MAX_CONNECTIONS),
            max_body_bytes=max(MAX_BODY_BYTES, max_upload_bytes),
        )
        self.router = Router(
            queue_timeout_s=queue_timeout_s,
            queue_limit=queue_limit,
            scrape_interval_s=scrape_interval_s,
            ejection=ejection,
        )
        self.metrics = GatewayMetrics(registry)
        self.metrics.watch_ejections(self.router.ejector)
        self.metrics.watch_replicas(
            self.router.replica_views, self.router.queued, self.router.cold_start_holds
        )
        self.metrics.watch_routes(self.router.route_decisions)
        self.client_refusals = ListenerRefusals("client")
        self.metrics_refusals = ListenerRefusals("metrics")
        self.metrics.watch_listener_refusals([self.client_refusals, self.metrics_refusals])
        self.egress = EngineEgress(engine_networks, self.metrics)
        self.traffic = TrafficWindow()
        self.app = GatewayApp(
            router=self.router,
            metrics=self.metrics,
            traffic=self.traffic,
            limiter=limiter if limiter is not None else RateLimiter(),
            limits_reason=limits_reason,
            stale_reason=self._stale_reason,
            connect_timeout_s=connect_timeout_s,
            engine_timeouts=engine_timeouts,
            log_requests=log_requests,
            failures=FailureBudget(auth_failures),
            max_upload_bytes=max_upload_bytes,
        )
        self._graceful_shutdown_s = graceful_shutdown_s
        self._reuse_port = reuse_port
        self._settle = settle
        self._clients: _Listening | None = None
        self._internal: _Listening | None = None

    @property
    def url(self) -> str:
        """Base URL of the OpenAI API, e.g. ``http://127.0.0.1:8080/v1``."""
        return f"{_base_url(self.host, self.port)}/v1"

    @property
    def metrics_url(self) -> str | None:
        """Where ``/metrics`` is served, once started; None without a metrics listener."""
        if self.metrics_port is None:
            return None
        return f"{_base_url(self.metrics_host, self.metrics_port)}/metrics"

    def in_flight(self) -> dict[str, int]:
        """Requests open per replica (replicas just taken out of routing included)."""
        return self.router.in_flight()

    def queued(self) -> dict[str, int]:
        """Requests waiting for a replica per model, those held for a cold start too."""
        return self.router.queued()

    def ejected(self) -> dict[str, int]:
        """The replicas this gateway keeps out of rotation, with their ejections in a row."""
        return {e.replica_id: e.ejections for e in self.router.ejector.ejected()}

    def traffic_report(self) -> TrafficReport:
        """What this gateway saw of each replica's requests over its window; past what a
        report lists, the replicas of the models its routing snapshot has in a canary step
        kept first (``app.domain.traffic_cut``), for their rollouts' verdicts to read."""
        report = TrafficReport(window_s=self.traffic.window_s, replicas=self.traffic.report())
        if len(report.replicas) <= MAX_REPORTED_REPLICAS:
            return report
        snapshot = self.source.current()
        routed = {
            route.replica_id: model for model, routes in snapshot.routes.items() for route in routes
        }
        return bounded(report, first=in_canary_step(report.replicas, snapshot.canaries, routed))

    async def start(self) -> None:
        if self._clients is not None:
            raise RuntimeError("the gateway is started already")
        self._use(self.source.current())
        self.source.subscribe(self._use)
        self._clients = await _serve_on(
            self.app,
            self.host,
            self.port,
            limits=self.limits,
            lifespan=True,
            graceful_shutdown_s=self._graceful_shutdown_s,
            what="gateway",
            refusals=self.client_refusals,
            reuse_port=self._reuse_port,
        )
        self.port = self._clients.port
        if self.metrics_port is not None:
            internal = replace(self.limits, max_connections=MAX_METRICS_CONNECTIONS)
            try:
                self._internal = await _serve_on(
                    MetricsApp(self.metrics),
                    self.metrics_host,
                    self.metrics_port,
                    limits=internal,
                    lifespan=False,
                    graceful_shutdown_s=1,
                    what="gateway's metrics listener",
                    refusals=self.metrics_refusals,
                )
            except BaseException:
                await self.stop()
                raise
            self.metrics_port = self._internal.port
        if self._settle:
            settle_heap()

    async def serve(self) -> None:
        """Serve until ``stop()``."""
        if self._clients is None:
            await self.start()
        assert self._clients is not None
        await asyncio.shield(self._clients.task)

    async def stop(self) -> None:
        turned_away = self.router.turn_away_held()
        if turned_away:
            log.info("gateway_held_requests_turned_away", requests=turned_away)
        for listening in (self._internal, self._clients):
            if listening is not None:
                await listening.stop()

    def _use(self, snapshot: GatewaySnapshot) -> None:
        # The one way routes reach the router (and its scrapers) and the proxy.
        admitted = self.egress.admit(snapshot)
        self.app.use(admitted)
        self.router.update(admitted)
        self.metrics.keep_models(snapshot.declared)

    def _stale_reason(self) -> str | None:
        if self.source.fresh():
            return None
        return self.source.stale_reason() or "the routing table is stale"


def _base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
