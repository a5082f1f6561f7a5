"""A gateway that follows PostgreSQL: what ``llmgw-server gateway`` runs, and what ``serve``
runs on its client listener.

It is stateless: everything it routes by comes from the database (``PostgresSnapshotSource``)
and the only thing it writes there is its report (``GatewayReporter``: requests in flight,
requests queued per model, what it saw of each replica's requests, and the replicas it keeps
out of rotation), so any number of them can run behind a load balancer. Keys' rpm and tpm
are counted across all of them by leasing slices of each key's budget from the database
(``app.gateway.sharedlimits``, kept supplied by ``app.gateway.budget_keeper``). Stopping it
lets open requests finish, reporting them until the last one ends, removes its report, then
gives back the slices it did not use.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import structlog

from app.domain.egress import EngineNetworks
from app.gateway.budget_keeper import BudgetKeeper
from app.gateway.ejection import EjectionPolicy
from app.gateway.engine_bounds import MAX_TIMEOUT_S, EngineTimeouts
from app.gateway.reporter import GatewayReporter, gateway_id_problem
from app.gateway.server import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_METRICS_HOST,
    DEFAULT_SHUTDOWN_GRACE_S,
    MAX_SHUTDOWN_GRACE_S,
    Gateway,
)
from app.gateway.sharedlimits import SharedLimiter
from app.gateway.source import DEFAULT_REFRESH_INTERVAL_S, PostgresSnapshotSource
from app.gateway.uploads import DEFAULT_MAX_UPLOAD_BYTES, MAX_UPLOAD_BYTES
from app.listeners.limits import ListenerLimits
from app.listeners.throttle import FailureLimits

log = structlog.get_logger(__name__)

DEFAULT_CLIENT_HOST = "127.0.0.1"
DEFAULT_CLIENT_PORT = 8080


DEFAULT_QUEUE_TIMEOUT_S = 5.0
DEFAULT_SCRAPE_INTERVAL_S = 0.25


@dataclass(frozen=True)
class GatewayOptions:
    host: str = DEFAULT_CLIENT_HOST
    port: int = DEFAULT_CLIENT_PORT
    gateway_id: str | None = None
    """Its name in ``gateway_reports``; hostname-pid when not given."""
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S
    engine_networks: EngineNetworks | None = None
    """Where engines may be contacted; None: each node at its agent's own address only."""
    limits: ListenerLimits = field(
        default_factory=lambda: ListenerLimits(max_connections=DEFAULT_MAX_CONNECTIONS)
    )
    """Of the client listener: slow clients cut off, connections capped."""
    auth_failures: FailureLimits = field(default_factory=FailureLimits)
    """Wrong keys per client address before 429."""
    metrics_host: str = DEFAULT_METRICS_HOST
    metrics_port: int | None = None
    """Serve ``/metrics`` on a listener of its own there; None: on none (``serve`` has the
    admin API serve it)."""
    ejection: EjectionPolicy = field(default_factory=EjectionPolicy)
    """When a replica that keeps failing is taken out of this gateway's rotation."""
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    """An upload's body at most (``app.gateway.uploads``)."""
    engine_timeouts: EngineTimeouts = field(default_factory=EngineTimeouts)
    """How long an engine may take to answer, and be silent once it has begun."""
    reuse_port: bool = False
    """Share ``port`` with other gateway processes (``SO_REUSEPORT``)."""
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    """How long a stopping gateway lets open requests finish before it cancels them."""

    def problems(self, connections_flag: str = "--max-connections") -> list[str]:
        """What is wrong with these options, as messages naming the command's flags."""
        found = self.limits.problems(connections_flag) + self.auth_failures.problems()
        found += self.ejection.problems() + self.engine_timeouts.problems()
        for flag, port in (("--port", self.port), ("--metrics-port", self.metrics_port)):
            if port is not None and not 0 <= port <= 65535:
                found.append(f"{flag} must be between 0 and 65535, not {port}")
        # A NaN passes every comparison, and an infinite time never comes: a request would
        # wait in the line for ever, a replica be scraped once.
        if not 0 <= self.queue_timeout_s < math.inf:
            found.append(
                f"--queue-timeout must be a finite number of seconds, 0 or more, "
                f"not {self.queue_timeout_s}"
            )
        for flag, value in (
            ("--scrape-interval", self.scrape_interval_s),
            ("--refresh-interval", self.refresh_interval_s),
        ):
            if not 0 < value < math.inf:
                found.append(f"{flag} must be a finite number of seconds above 0, not {value}")
            elif value > MAX_TIMEOUT_S:
                # Finite but huge overflows what is computed from it (1e308 * 4 is inf).
                found.append(f"{flag} must be at most {MAX_TIMEOUT_S:g} seconds, not {value:g}")
        if self.gateway_id is not None:
            id_problem = gateway_id_problem(self.gateway_id, "--gateway-id", "LLMGW_GATEWAY_ID")
            if id_problem is not None:
                found.append(id_problem)
        if self.reuse_port and self.port == 0:
            found.append("--reuse-port needs a fixed --port for the processes to share")
        upload_problem = max_upload_problem(self.max_upload_bytes)
        if upload_problem is not None:
            found.append(upload_problem)
        grace_problem = shutdown_grace_problem(self.shutdown_grace_s)
        if grace_problem is not None:
            found.append(grace_problem)
        return found


def max_upload_problem(max_upload_bytes: int) -> str | None:
    """What is wrong with ``--max-upload-mib`` (given in bytes); None when it is in bounds."""
    if 1 <= max_upload_bytes <= MAX_UPLOAD_BYTES:
        return None
    return (
        f"--max-upload-mib must be between 1 and {MAX_UPLOAD_BYTES >> 20}, "
        f"not {max_upload_bytes / (1 << 20):g}"
    )


def shutdown_grace_problem(seconds: float) -> str | None:
    """What is wrong with ``--shutdown-grace``; None when it is in bounds. A NaN passes
    every comparison and an infinite grace never ends: the gateway would never stop."""
    if 0 <= seconds <= MAX_SHUTDOWN_GRACE_S:
        return None
    return (
        f"--shutdown-grace must be between 0 and {MAX_SHUTDOWN_GRACE_S:g} seconds, not {seconds:g}"
    )


class PostgresGateway:
    def __init__(self, database_url: str, options: GatewayOptions) -> None:
        self.source = PostgresSnapshotSource(
            database_url,
            gateway_id=options.gateway_id,
            refresh_interval_s=options.refresh_interval_s,
        )
        self.limiter = SharedLimiter()
        self.gateway = Gateway(
            self.source,
            host=options.host,
            port=options.port,
            queue_timeout_s=options.queue_timeout_s,
            scrape_interval_s=options.scrape_interval_s,
            engine_networks=options.engine_networks,
            limits=options.limits,
            metrics_host=options.metrics_host,
            metrics_port=options.metrics_port,
            auth_failures=options.auth_failures,
            ejection=options.ejection,
            max_upload_bytes=options.max_upload_bytes,
            limiter=self.limiter,
            limits_reason=lambda: self.budgets.degraded_reason(),
            reuse_port=options.reuse_port,
            engine_timeouts=options.engine_timeouts,
            graceful_shutdown_s=options.shutdown_grace_s,
        )
        self.gateway.metrics.watch_routing_reads(self.source.read_counts)
        self.budgets = BudgetKeeper(
            database_url,
            self.limiter,
            gateway_id=self.source.gateway_id,
            on_degraded=self.gateway.metrics.rate_limits_degraded,
        )
        self.limiter.on_ask(self.budgets.wake)
        self.reporter = GatewayReporter(
            database_url,
            gateway_id=self.source.gateway_id,
            in_flight=self.gateway.in_flight,
            routing_position=self.source.routing_position,
            queued=self.gateway.queued,
            traffic=self.gateway.traffic_report,
            ejected=self.gateway.ejected,
            on_shared_id=self.gateway.metrics.id_shared,
        )
        # A request held for a model starting from zero is demand the leader should see now.
        self.gateway.router.on_hold(self.reporter.report_soon)

    async def start(self) -> None:
        """Read the first snapshot (or give up waiting for it after a few seconds: the
        gateway then answers 503 until the database answers) and listen."""
        await self.source.start()
        await self.budgets.start()
        await self.reporter.start()
        if not self.source.fresh():
            log.warning("gateway_started_without_routes", reason=self.source.stale_reason())
        try:
            await self.gateway.start()
        except BaseException:
            await self._close_database_side()
            raise
        networks = self.gateway.egress.networks
        log.info(
            "gateway_listening",
            url=self.gateway.url,
            metrics=self.gateway.metrics_url,
            gateway_id=self.source.gateway_id,
            position=self.source.current().position,
            engine_networks=str(networks) if networks is not None else "each node's agent address",
        )

    async def serve(self) -> None:
        """Until ``stop()``."""
        await self.gateway.serve()

    async def stop(self) -> None:
        try:
            await self.gateway.stop()
        finally:
            await self._close_database_side()

    async def _close_database_side(self) -> None:
        """The reporter first (its report goes: stopped, not silent), then the budgets
        (what they hold goes back), then the source; each even if one before it failed."""
        async with contextlib.AsyncExitStack() as closing:
            closing.push_async_callback(self.source.close)
            closing.push_async_callback(self.budgets.close)
            closing.push_async_callback(self.reporter.close)
