"""The composition root: every concrete adapter is chosen and wired here, once.

``llmgw-server serve`` parses its flags into ``app.settings.ServeSettings`` and hands them
to ``Server.from_settings``; tests build the same parts with the functions below. Read it
top to bottom as the server is assembled:

    PostgreSQL engine -> PostgresEventStore -> ControlPlane (election, and per term the
    agent hub, the live view, the report recorder, the reconciler) -> admin API (Litestar on
    uvicorn) -> the embedded gateway (on its own client listener)

Everything below this module depends on protocols: the services never see the agent hub,
the subscription or PostgreSQL by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import msgspec
import structlog
import uvicorn
from sqlalchemy.ext.asyncio import AsyncEngine

from app.admin.app import create_admin_app
from app.admin.auth import TokenAuthenticator, parse_tokens
from app.admin.events import end_event_streams
from app.admin.health import Readiness
from app.admin.metrics import control_plane_figures, control_plane_running
from app.admin.tls import DEFAULT_ADMIN_KEEP_ALIVE_S, admin_protocol, admin_ssl_context
from app.clock import utc_now
from app.commands.common import (
    SERVE,
    database_role_allowed,
    engine_networks_of,
    schema_allowed,
)
from app.commands.gateway_settings import gateway_options
from app.domain.egress import EngineNetworks, InvalidEngineNetworks
from app.domain.envelope import Recorded
from app.gateway.postgres import GatewayOptions, PostgresGateway, shutdown_grace_problem
from app.gateway.server import GatewayFailed
from app.hub.budget import MessageBudget
from app.hub.gate import DEFAULT_PER_ADDRESS as DEFAULT_HANDSHAKES_PER_ADDRESS
from app.hub.hub import DEFAULT_HEARTBEAT_INTERVAL_S, DEFAULT_HEARTBEAT_TIMEOUT_S, AgentHub
from app.hub.reconnects import ConnectLimits
from app.listeners.binding import bound_listener
from app.listeners.limits import ListenerLimits
from app.listeners.refusals import ListenerRefusals
from app.listeners.throttle import FailureBudget
from app.pki.ends import CertificateEnd, CertificateRole, ending_soon, read_ends, unique_ends
from app.pki.errors import CertificateFileError, TlsConfigurationError
from app.pki.tls import server_ssl_context
from app.services.agent_reports import ReportHandler
from app.services.control_plane import (
    ControlPlane,
    ControlPlaneConfig,
    LeaderWiring,
    Outcome,
    RevocationCheck,
)
from app.services.leader import DEFAULT_LEASE_S, LeaderElection
from app.settings import DEFAULT_BUDGET, ServeSettings
from app.store.database import create_engine
from app.store.errors import StoreError
from app.store.gateway_reports import InFlightReports
from app.store.postgres import PostgresEventStore
from app.store.subscription import Subscription
from app.usage_errors import print_command_error

log = structlog.get_logger(__name__)

HEARTBEAT_TIMEOUT_INTERVALS = 3
"""An agent silent for this many heartbeat intervals is disconnected (15 s at 5 s)."""
EXIT_DEPOSED = 3
"""``serve`` exits with this code when it lost leadership, so a supervisor restarts it (as a
standby) rather than treating it as a crash or a clean stop."""
ADMIN_SHUTDOWN_GRACE_S = 3
"""How long admin requests may go on once the server stops (event streams are cut then), or
less when ``--shutdown-grace`` is less: the process stops within the grace it was given."""
AGENT_TLS_HINT = (
    "the agent hub needs --tls-cert, --tls-key and --tls-ca (or LLMGW_TLS_CERT, "
    "LLMGW_TLS_KEY, LLMGW_TLS_CA): agents always connect with mutual TLS. Create them with "
    "`llmgw-cli cert init-ca` and `llmgw-cli cert server --ip <address agents dial>`"
)


class SettingsError(ValueError):
    """Settings that cannot be used; the message says why, in one line."""


# -- the control plane -------------------------------------------------------------------


@dataclass(frozen=True)
class AgentHubConfig:
    """The agent hub's own settings: its TLS, identity rule, liveness, budget, networks,
    and its cap on handshakes per address."""

    tls: ssl.SSLContext
    require_identity: bool = True
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    budget: MessageBudget = field(default_factory=MessageBudget)
    connects: ConnectLimits = field(default_factory=ConnectLimits)
    """How often one node may connect: ``--agent-connect-burst`` at once, then
    ``--agent-connects-per-minute``."""
    engine_networks: EngineNetworks | None = None
    """Where nodes' engines may live (``--engine-networks``); None: each node only at the
    address its agent connects from."""
    handshakes_per_address: int = DEFAULT_HANDSHAKES_PER_ADDRESS
    """TLS handshakes one address may have in progress (``app.hub.gate``)."""


def leader_wiring(
    store: PostgresEventStore, database_url: str, hub: AgentHubConfig, server_id: str
) -> LeaderWiring:
    """The adapters of every leadership term: an agent hub per term, the appends a
    subscription delivers, and what gateways report in flight."""

    def agent_hub(handler: ReportHandler, epoch: int, revocations: RevocationCheck) -> AgentHub:
        return AgentHub(
            handler,
            hub.tls,
            require_identity=hub.require_identity,
            heartbeat_interval_s=hub.heartbeat_interval_s,
            heartbeat_timeout_s=hub.heartbeat_timeout_s,
            server_id=server_id,
            epoch=epoch,
            budget=hub.budget,
            revocations=revocations,
            engine_networks=hub.engine_networks,
            connects=hub.connects,
            handshakes_per_address=hub.handshakes_per_address,
        )

    def appends(after_position: int) -> AsyncIterator[Recorded]:
        subscription = Subscription(
            store, database_url, after_position=after_position, name="reconciler"
        )
        return subscription.__aiter__()

    return LeaderWiring(hub=agent_hub, appends=appends, in_flight=InFlightReports(store.engine))


def control_plane_engine(database_url: str, lease_s: float = DEFAULT_LEASE_S) -> AsyncEngine:
    """The pool of ``serve``: its appends, reads and the admin API's writes.

    An append that must catch up first holds the append lock in a transaction of a few
    statements; a server frozen between two of them (SIGSTOP, a stalled machine) would
    hold it, and stop every other server's appends, for as long as it stays frozen. So a
    transaction left waiting for its client for the leader lease is ended by PostgreSQL:
    by then a standby may lead, and the lock is its to take. Only ``serve``'s pool has
    this: ``projections rebuild`` and migrations compute between statements for longer.

    A statement that gets no answer for twice the lease is given up and its connection
    dropped (``answer_timeout_s``): a connection cut off without a reset would otherwise
    hold the store's fold lock, and so every change and read of the admin API, until the
    kernel gives up on it. Twice the lease leaves an append waiting for the append lock
    of a frozen server (ended after the lease) the time to get it.
    """
    return create_engine(
        database_url, idle_in_transaction_timeout_s=lease_s, answer_timeout_s=2 * lease_s
    )


def control_plane(
    store: PostgresEventStore,
    database_url: str,
    config: ControlPlaneConfig,
    hub: AgentHubConfig,
    *,
    election: LeaderElection | None = None,
    clock: Callable[[], datetime] = utc_now,
) -> ControlPlane:
    """A control plane on ``store`` that leads when elected in ``database_url``."""
    return ControlPlane(
        store,
        config,
        leader_wiring(store, database_url, hub, config.server_id),
        election or LeaderElection(database_url, config.server_id),
        clock=clock,
    )


# -- the whole server --------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    """``serve``'s parts, resolved from its settings: what ``run`` starts."""

    database_url: str
    admin_host: str
    admin_port: int
    authenticator: TokenAuthenticator
    control_plane: ControlPlaneConfig
    agent_hub: AgentHubConfig
    admin_tls: ssl.SSLContext | None = None
    admin_limits: ListenerLimits = field(default_factory=ListenerLimits)
    gateway: GatewayOptions | None = None
    """The client listener; None: no gateway in this process."""
    allow_privileged_role: bool = False
    leader_lease_s: float = DEFAULT_LEASE_S
    certificate_ends: tuple[CertificateEnd, ...] = ()
    """When the certificates it presents and trusts end: warned of at start, on /metrics."""
    admin_shutdown_grace_s: int = ADMIN_SHUTDOWN_GRACE_S
    """How long admin requests may go on once the server stops."""
    admin_keep_alive_s: float = DEFAULT_ADMIN_KEEP_ALIVE_S
    """How long a kept-alive admin connection may sit idle between requests."""

    @classmethod
    def from_settings(cls, settings: ServeSettings) -> Server:
        """Raises ``SettingsError`` (with one line to print) for settings that cannot run."""
        problems = settings.problems()
        gateway_settings = settings.gateway_settings
        if problems:
            raise SettingsError("; ".join(problems))
        try:
            tokens = parse_tokens(
                settings.admin_tokens or os.environ.get("LLMGW_ADMIN_TOKEN_PAIRS", "")
            )
        except ValueError as exc:
            raise SettingsError(str(exc)) from exc
        try:
            networks = engine_networks_of(gateway_settings.engine_networks)
        except InvalidEngineNetworks as exc:
            raise SettingsError(f"--engine-networks: {exc}") from exc
        if settings.tls_cert is None or settings.tls_key is None or settings.tls_ca is None:
            raise SettingsError(AGENT_TLS_HINT)
        # The admin listener treats its clients as the gateway's does: the same timeouts and
        # the same budget of wrong tokens.
        admin_limits = gateway_settings.listener_limits(settings.admin_max_connections)
        client_limits = gateway_settings.listener_limits(settings.client_max_connections)
        auth_failures = gateway_settings.auth_failures()
        grace_problem = shutdown_grace_problem(gateway_settings.shutdown_grace)
        limit_problems = dict.fromkeys(  # the timeouts' problems once, each listener's cap's
            admin_limits.problems("--admin-max-connections")
            + client_limits.problems("--client-max-connections")
            + auth_failures.problems()
            + ([grace_problem] if grace_problem is not None else [])
        )
        if limit_problems:
            raise SettingsError("; ".join(limit_problems))
        try:
            agent_tls = server_ssl_context(settings.tls_cert, settings.tls_key, settings.tls_ca)
            operators_ca = settings.admin_ca or settings.tls_ca
            admin_tls = _admin_tls(settings.admin_tls_cert, settings.admin_tls_key, operators_ca)
            ends = _certificate_ends(settings.tls_cert, settings.tls_ca, settings.admin_tls_cert)
            if settings.admin_ca is not None:
                ends += read_ends(CertificateRole.CA, settings.admin_ca)
        except (TlsConfigurationError, CertificateFileError, ValueError) as exc:
            raise SettingsError(str(exc)) from exc
        server_id = settings.server_id or f"{socket.gethostname()}:{os.getpid()}"
        return cls(
            database_url=settings.database_url,
            admin_host=settings.admin_host,
            admin_port=settings.admin_port,
            admin_tls=admin_tls,
            admin_limits=admin_limits,
            admin_keep_alive_s=settings.admin_keep_alive_timeout,
            authenticator=TokenAuthenticator(tokens, FailureBudget(auth_failures)),
            control_plane=ControlPlaneConfig(
                server_id=server_id,
                agent_host=settings.agent_host,
                agent_port=settings.agent_port,
                adoption_grace_s=settings.adoption_grace,
                adoption_quiet_s=settings.adoption_quiet,
                adoption_grace_max_s=settings.adoption_grace_max,
                lost_timeout_s=settings.lost_timeout,
                stability_window_s=settings.stability_window,
                reconcile_interval_s=settings.reconcile_interval,
                drain_idle_timeout_s=settings.drain_idle_timeout,
            ),
            agent_hub=AgentHubConfig(
                tls=agent_tls,
                require_identity=settings.require_identity,
                heartbeat_interval_s=settings.heartbeat_interval,
                heartbeat_timeout_s=settings.heartbeat_interval * HEARTBEAT_TIMEOUT_INTERVALS,
                budget=msgspec.structs.replace(
                    DEFAULT_BUDGET,
                    messages_per_s=settings.agent_message_rate,
                    message_burst=settings.agent_message_burst,
                ),
                connects=ConnectLimits(
                    burst=settings.agent_connect_burst,
                    per_minute=settings.agent_connects_per_minute,
                ),
                engine_networks=networks,
                handshakes_per_address=settings.agent_handshakes_per_address,
            ),
            gateway=gateway_options(
                gateway_settings,
                networks,
                max_connections=settings.client_max_connections,
                host=settings.client_host,
                port=settings.client_port,
                gateway_id=settings.server_id or None,
            )
            if settings.gateway
            else None,
            allow_privileged_role=settings.allow_privileged_role,
            leader_lease_s=settings.leader_lease,
            certificate_ends=unique_ends(ends),
            admin_shutdown_grace_s=min(
                ADMIN_SHUTDOWN_GRACE_S, math.ceil(gateway_settings.shutdown_grace)
            ),
        )

    def database_engine(self) -> AsyncEngine:
        """The pool ``run`` serves from: idle transactions end after the leader lease."""
        return control_plane_engine(self.database_url, self.leader_lease_s)

    def election(self) -> LeaderElection:
        """The election ``run`` leads through, for the leader lease."""
        return LeaderElection(
            self.database_url, self.control_plane.server_id, lease_s=self.leader_lease_s
        )

    async def run(self) -> int:
        """Serve until signalled or deposed; the process's exit code."""
        engine = self.database_engine()
        admin_socket: socket.socket | None = None
        try:
            # Bound before anything else starts: a port in use stops serve at once, saying
            # which listener, where uvicorn would exit the process from inside the loop.
            admin_socket = bound_listener(
                "admin API (--admin-host, --admin-port)", self.admin_host, self.admin_port
            )
            allowed = await database_role_allowed(
                self.database_url, allow_privileged=self.allow_privileged_role, command=SERVE
            )
            if not allowed or not await schema_allowed(engine, command=SERVE):
                return 1
            _warn_of_certificate_ends(self.certificate_ends, utc_now())
            store = PostgresEventStore(engine)
            await store.catch_up()
            plane = control_plane(
                store,
                self.database_url,
                self.control_plane,
                self.agent_hub,
                election=self.election(),
            )
            gateway = PostgresGateway(self.database_url, self.gateway) if self.gateway else None
            admin_refusals = ListenerRefusals("admin")
            admin = _AdminServer(
                uvicorn.Config(
                    create_admin_app(
                        store,
                        self.authenticator,
                        Readiness(engine, role=lambda: plane.role),
                        live=control_plane_figures(plane),
                        running=control_plane_running(plane),
                        # The gateway's page names every model and replica: operators read
                        # it here, with the cluster's, and its client listener has none.
                        gateway_metrics=gateway.gateway.metrics.render if gateway else None,
                        certificates=self.certificate_ends,
                        listener_refusals=admin_refusals,
                    ),
                    host=self.admin_host,
                    port=self.admin_port,
                    log_config=None,
                    access_log=False,
                    # Followers of /admin/v1/events never finish their request by themselves.
                    timeout_graceful_shutdown=self.admin_shutdown_grace_s,
                    http=admin_protocol(
                        self.admin_limits, admin_refusals, keep_alive_s=self.admin_keep_alive_s
                    ),
                    # The admin API serves no WebSocket (agents have their own listener): a
                    # handshake is a plain HTTP request, answered by its route.
                    ws="none",
                    ssl_context_factory=_fixed_context(self.admin_tls),
                )
            )
            if gateway is not None:
                await gateway.start()
            log.info("admin_listening", host=self.admin_host, port=self.admin_port)
            outcome = await _run_until_signalled(admin, plane, gateway, admin_socket)
        except (OSError, StoreError, GatewayFailed) as exc:
            log.error("serve_failed", error=str(exc))
            print_command_error(SERVE, f"cannot serve: {exc}")
            return 1
        finally:
            if admin_socket is not None:
                admin_socket.close()
            await engine.dispose()
        if outcome is Outcome.DEPOSED:
            log.error(
                "serve_deposed",
                detail="this server no longer leads; restart it to stand by",
                exit_code=EXIT_DEPOSED,
            )
            return EXIT_DEPOSED
        return 0


def _admin_tls(cert: Path | None, key: Path | None, ca: Path) -> ssl.SSLContext | None:
    """HTTPS for the admin listener when --admin-tls-cert is given, else None (plain
    HTTP, for a loopback listener)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("--admin-tls-cert and --admin-tls-key go together: give both or neither")
    return admin_ssl_context(cert, key, ca)


def _certificate_ends(agent_hub: Path, ca: Path, admin: Path | None) -> list[CertificateEnd]:
    """The ends of the certificates ``serve`` presents and trusts; raises
    ``CertificateFileError``."""
    ends = read_ends(CertificateRole.AGENT_HUB, agent_hub) + read_ends(CertificateRole.CA, ca)
    if admin is not None:
        ends += read_ends(CertificateRole.ADMIN, admin)
    return ends


def _warn_of_certificate_ends(ends: tuple[CertificateEnd, ...], now: datetime) -> None:
    """One line for each certificate that ends within ``app.pki.ends.WARN_WITHIN``: when it
    ends, every agent or operator that dials this server after refuses it."""
    for end in ending_soon(ends, now):
        fields = {
            "certificate": str(end.role),
            "serial": end.serial,
            "subject": end.subject,
            "not_after": end.not_after.isoformat(),
        }
        if end.not_after <= now:
            log.error("certificate_expired", **fields)
        else:
            log.warning("certificate_expires_soon", days_left=(end.not_after - now).days, **fields)


class AdminListenFailed(OSError):
    """The admin listener could not start (its port in use, an address not of this host)."""


class _AdminServer(uvicorn.Server):
    """uvicorn without its own signal handling: the server stops it with the control plane."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        except SystemExit as exc:
            # uvicorn ends the whole process when it cannot listen, with exit code 3: this
            # program's "deposed, restart to stand by". A failure to start it is, and says so.
            why = exc.__context__  # the OSError uvicorn exits on
            raise AdminListenFailed(
                f"the admin API cannot listen on {self.config.host}:{self.config.port}: "
                f"{why if isinstance(why, OSError) else 'see the line logged before'}"
            ) from exc

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Event streams never end by themselves; ended now, they do not hold up the stop.
        end_event_streams(self.config.app)
        await super().shutdown(sockets)


def _fixed_context(
    context: ssl.SSLContext | None,
) -> Callable[[uvicorn.Config, Callable[[], ssl.SSLContext]], ssl.SSLContext] | None:
    if context is None:
        return None
    return lambda _config, _default: context


async def _run_until_signalled(
    admin: uvicorn.Server,
    plane: ControlPlane,
    gateway: PostgresGateway | None = None,
    admin_socket: socket.socket | None = None,
) -> Outcome:
    """Serve the admin API (and the gateway, if any) and run the control plane until
    SIGINT or SIGTERM, until the control plane is deposed, or until a listener stops by
    itself."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    admin_task = asyncio.create_task(admin.serve([admin_socket] if admin_socket else None))
    plane_task = asyncio.create_task(plane.run(stop))
    tasks = {admin_task, plane_task}
    if gateway is not None:
        tasks.add(asyncio.create_task(gateway.serve()))
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        stop.set()
        admin.should_exit = True
        if gateway is not None:
            await gateway.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
    if not admin_task.cancelled() and isinstance(admin_task.exception(), AdminListenFailed):
        raise AdminListenFailed(str(admin_task.exception()))
    return plane_task.result()
