"""``llmgw-server serve``: the control plane, its admin API and its gateway."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated

import msgspec
import structlog
import uvicorn
from cyclopts import Parameter

from app.admin.app import create_admin_app
from app.admin.auth import TokenAuthenticator, parse_tokens
from app.admin.events import end_event_streams
from app.admin.health import Readiness
from app.admin.metrics import control_plane_figures
from app.admin.tls import DEFAULT_ADMIN_MAX_CONNECTIONS, admin_protocol, admin_ssl_context
from app.commands.common import (
    AllowPrivilegedRole,
    AuthFailureBurst,
    AuthFailuresPerMinute,
    BodyTimeout,
    DatabaseUrl,
    EngineNetworksFlag,
    HeaderTimeout,
    database_role_allowed,
    engine_networks_of,
    fail,
)
from app.domain.egress import InvalidEngineNetworks
from app.gateway.postgres import (
    DEFAULT_CLIENT_HOST,
    DEFAULT_CLIENT_PORT,
    GatewayOptions,
    PostgresGateway,
)
from app.gateway.server import DEFAULT_MAX_CONNECTIONS, GatewayFailed
from app.hub.budget import MessageBudget
from app.hub.hub import DEFAULT_HEARTBEAT_INTERVAL_S
from app.listeners.limits import DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S, ListenerLimits
from app.listeners.throttle import DEFAULT_BURST, DEFAULT_PER_MINUTE, FailureBudget, FailureLimits
from app.logs import configure_logging
from app.pki import TlsConfigurationError, server_ssl_context
from app.services.control_plane import ControlPlane, ControlPlaneConfig, Outcome
from app.store.database import create_engine
from app.store.errors import StoreError
from app.store.postgres import PostgresEventStore

log = structlog.get_logger(__name__)

AGENT_TLS_HINT = (
    "the agent hub needs --tls-cert, --tls-key and --tls-ca (or LLMGW_TLS_CERT, "
    "LLMGW_TLS_KEY, LLMGW_TLS_CA): agents always connect with mutual TLS. Create them with "
    "`llmgw-cli cert init-ca` and `llmgw-cli cert server --ip <address agents dial>`"
)

DEFAULT_BUDGET = MessageBudget()
HEARTBEAT_TIMEOUT_INTERVALS = 3
"""An agent silent for this many heartbeat intervals is disconnected (15 s at 5 s)."""
EXIT_DEPOSED = 3
"""``serve`` exits with this code when it lost leadership, so a supervisor restarts it (as a
standby) rather than treating it as a crash or a clean stop."""
ADMIN_SHUTDOWN_GRACE_S = 3
"""How long admin requests may go on once the server stops (event streams are cut then)."""


def serve(
    *,
    database_url: DatabaseUrl,
    admin_host: Annotated[str, Parameter(env_var="LLMGW_ADMIN_HOST")] = "127.0.0.1",
    admin_port: Annotated[int, Parameter(env_var="LLMGW_ADMIN_PORT")] = 8081,
    admin_tokens: Annotated[
        str, Parameter(env_var="LLMGW_ADMIN_TOKENS", help="NAME:TOKEN pairs, comma-separated")
    ] = "",
    admin_tls_cert: Annotated[
        Path | None,
        Parameter(
            env_var="LLMGW_ADMIN_TLS_CERT",
            help="serve the admin API over HTTPS with this server certificate; operators may "
            "then authenticate with an operator certificate",
        ),
    ] = None,
    admin_tls_key: Annotated[
        Path | None, Parameter(env_var="LLMGW_ADMIN_TLS_KEY", help="that certificate's key")
    ] = None,
    admin_ca: Annotated[
        Path | None,
        Parameter(
            env_var="LLMGW_ADMIN_CA",
            help="the CA that issues operator certificates [default: --tls-ca]",
        ),
    ] = None,
    agent_host: Annotated[str, Parameter(env_var="LLMGW_AGENT_HOST")] = "0.0.0.0",
    agent_port: Annotated[int, Parameter(env_var="LLMGW_AGENT_PORT")] = 8443,
    tls_cert: Annotated[
        Path | None, Parameter(env_var="LLMGW_TLS_CERT", help="the hub's server certificate")
    ] = None,
    tls_key: Annotated[
        Path | None, Parameter(env_var="LLMGW_TLS_KEY", help="the server certificate's key")
    ] = None,
    tls_ca: Annotated[
        Path | None,
        Parameter(env_var="LLMGW_TLS_CA", help="the llmgw CA that issues node certificates"),
    ] = None,
    require_identity: Annotated[
        bool,
        Parameter(
            env_var="LLMGW_REQUIRE_IDENTITY",
            help="a node certificate's common name must equal the node id its agent claims",
        ),
    ] = True,
    heartbeat_interval: Annotated[
        float,
        Parameter(
            env_var="LLMGW_HEARTBEAT_INTERVAL",
            help="seconds between agent heartbeats; an agent silent for three is disconnected",
        ),
    ] = DEFAULT_HEARTBEAT_INTERVAL_S,
    server_id: Annotated[
        str,
        Parameter(
            env_var="LLMGW_SERVER_ID",
            help="this server's name in the leadership table and to agents (hostname:pid)",
        ),
    ] = "",
    adoption_grace: Annotated[
        float,
        Parameter(
            env_var="LLMGW_ADOPTION_GRACE",
            help="seconds after election during which nothing is placed, lost or timed out, "
            "unless every known node has reconnected sooner",
        ),
    ] = 30.0,
    lost_timeout: Annotated[
        float,
        Parameter(
            env_var="LLMGW_LOST_TIMEOUT",
            help="seconds a disconnected node may stay away before it and its replicas are lost",
        ),
    ] = 60.0,
    stability_window: Annotated[
        float,
        Parameter(
            env_var="LLMGW_STABILITY_WINDOW",
            help="seconds a drain replacement must serve before the original is stopped",
        ),
    ] = 10.0,
    reconcile_interval: Annotated[
        float,
        Parameter(
            env_var="LLMGW_RECONCILE_INTERVAL",
            help="seconds between reconcile passes when nothing wakes the reconciler sooner",
        ),
    ] = 1.0,
    client_host: Annotated[
        str,
        Parameter(
            env_var="LLMGW_CLIENT_HOST",
            help="where the OpenAI-compatible gateway listens (loopback unless set)",
        ),
    ] = DEFAULT_CLIENT_HOST,
    client_port: Annotated[int, Parameter(env_var="LLMGW_CLIENT_PORT")] = DEFAULT_CLIENT_PORT,
    gateway: Annotated[
        bool,
        Parameter(
            env_var="LLMGW_GATEWAY",
            help="serve the gateway on the client listener; --no-gateway when separate "
            "`llmgw-server gateway` processes serve clients",
        ),
    ] = True,
    drain_idle_timeout: Annotated[
        float,
        Parameter(
            env_var="LLMGW_DRAIN_IDLE_TIMEOUT",
            help="seconds a replica taken out of routing waits for the requests gateways "
            "report in flight on it before it is stopped anyway",
        ),
    ] = 60.0,
    agent_message_rate: Annotated[
        float,
        Parameter(
            env_var="LLMGW_AGENT_MESSAGE_RATE",
            help="messages a second one agent connection may send, sustained; a connection "
            "over its budget is closed (1008) and the refusal recorded",
        ),
    ] = DEFAULT_BUDGET.messages_per_s,
    agent_message_burst: Annotated[
        int,
        Parameter(
            env_var="LLMGW_AGENT_MESSAGE_BURST",
            help="messages one agent connection may send at once above that rate",
        ),
    ] = DEFAULT_BUDGET.message_burst,
    engine_networks: EngineNetworksFlag = "",
    allow_privileged_role: AllowPrivilegedRole = False,
    auth_failure_burst: AuthFailureBurst = DEFAULT_BURST,
    auth_failures_per_minute: AuthFailuresPerMinute = DEFAULT_PER_MINUTE,
    header_timeout: HeaderTimeout = DEFAULT_HEADER_TIMEOUT_S,
    body_timeout: BodyTimeout = DEFAULT_BODY_TIMEOUT_S,
    admin_max_connections: Annotated[
        int,
        Parameter(
            env_var="LLMGW_ADMIN_MAX_CONNECTIONS",
            help="connections the admin listener holds at once; one more is answered 503",
        ),
    ] = DEFAULT_ADMIN_MAX_CONNECTIONS,
    client_max_connections: Annotated[
        int,
        Parameter(
            env_var="LLMGW_CLIENT_MAX_CONNECTIONS",
            help="connections the gateway's client listener holds at once; one more is "
            "answered 503",
        ),
    ] = DEFAULT_MAX_CONNECTIONS,
    log_level: Annotated[str, Parameter(env_var="LLMGW_LOG_LEVEL")] = "info",
) -> None:
    """Run the control plane until SIGINT or SIGTERM: the admin API and the gateway (on
    its own client listener, never serving the admin API) always; the agent hub and the
    reconciler while this server is the elected leader.

    Several servers may run against one database: one leads, the others stand by and take
    over within seconds when it goes. A server that loses leadership exits with code 3.

    With --admin-tls-cert and --admin-tls-key the admin API is served over HTTPS, and an
    operator certificate from the llmgw CA (`llmgw-cli cert operator <name>`) authenticates
    its holder, whose name then becomes the actor of what they change.

    Engines are contacted only where --engine-networks allows.
    The database role must be the runtime role (`llmgw-server migrate --runtime-role`),
    which appends only through llmgw_append and owns nothing: a superuser, or the owner of
    the log's tables, is refused unless --allow-privileged-role is given.

    Example: llmgw-server serve --tls-cert server.crt --tls-key server.key --tls-ca ca.crt
    """
    configure_logging(log_level)
    try:
        tokens = parse_tokens(admin_tokens or os.environ.get("LLMGW_ADMIN_TOKEN_PAIRS", ""))
    except ValueError as exc:
        fail(str(exc))
        return
    try:
        networks = engine_networks_of(engine_networks)
    except InvalidEngineNetworks as exc:
        fail(f"--engine-networks: {exc}")
        return
    if tls_cert is None or tls_key is None or tls_ca is None:
        fail(AGENT_TLS_HINT)
        return
    for flag, value in (
        ("--heartbeat-interval", heartbeat_interval),
        ("--reconcile-interval", reconcile_interval),
        ("--agent-message-rate", agent_message_rate),
        ("--agent-message-burst", agent_message_burst),
    ):
        if value <= 0:
            fail(f"{flag} must be positive, not {value}")
            return
    for flag, value in (
        ("--adoption-grace", adoption_grace),
        ("--lost-timeout", lost_timeout),
        ("--stability-window", stability_window),
        ("--drain-idle-timeout", drain_idle_timeout),
    ):
        if value < 0:
            fail(f"{flag} must not be negative, not {value}")
            return
    admin_limits = ListenerLimits(
        header_timeout_s=header_timeout,
        body_timeout_s=body_timeout,
        max_connections=admin_max_connections,
    )
    client_limits = replace(admin_limits, max_connections=client_max_connections)
    auth_failures = FailureLimits(burst=auth_failure_burst, per_minute=auth_failures_per_minute)
    problems = dict.fromkeys(  # the timeouts' problems once, each listener's cap's
        admin_limits.problems("--admin-max-connections")
        + client_limits.problems("--client-max-connections")
        + auth_failures.problems()
    )
    if problems:
        fail("; ".join(problems))
        return
    try:
        agent_tls = server_ssl_context(tls_cert, tls_key, tls_ca)
        admin_tls = _admin_tls(admin_tls_cert, admin_tls_key, admin_ca or tls_ca)
    except (TlsConfigurationError, ValueError) as exc:
        fail(str(exc))
        return
    settings = ServeSettings(
        database_url=database_url,
        admin_host=admin_host,
        admin_port=admin_port,
        admin_tls=admin_tls,
        admin_limits=admin_limits,
        authenticator=TokenAuthenticator(tokens, FailureBudget(auth_failures)),
        control_plane=ControlPlaneConfig(
            server_id=server_id or f"{socket.gethostname()}:{os.getpid()}",
            agent_host=agent_host,
            agent_port=agent_port,
            agent_tls=agent_tls,
            require_identity=require_identity,
            heartbeat_interval_s=heartbeat_interval,
            heartbeat_timeout_s=heartbeat_interval * HEARTBEAT_TIMEOUT_INTERVALS,
            adoption_grace_s=adoption_grace,
            lost_timeout_s=lost_timeout,
            stability_window_s=stability_window,
            reconcile_interval_s=reconcile_interval,
            drain_idle_timeout_s=drain_idle_timeout,
            agent_budget=msgspec.structs.replace(
                DEFAULT_BUDGET,
                messages_per_s=agent_message_rate,
                message_burst=agent_message_burst,
            ),
            engine_networks=networks,
        ),
        gateway=GatewayOptions(
            host=client_host,
            port=client_port,
            gateway_id=server_id or None,
            engine_networks=networks,
            limits=client_limits,
            auth_failures=auth_failures,
        )
        if gateway
        else None,
        allow_privileged_role=allow_privileged_role,
    )
    if gateway and not 0 <= client_port <= 65535:
        fail(f"--client-port must be between 0 and 65535, not {client_port}")
        return
    sys.exit(asyncio.run(_serve(settings)))


def _admin_tls(cert: Path | None, key: Path | None, ca: Path) -> ssl.SSLContext | None:
    """HTTPS for the admin listener when --admin-tls-cert is given, else None (plain
    HTTP, for a loopback listener)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("--admin-tls-cert and --admin-tls-key go together: give both or neither")
    return admin_ssl_context(cert, key, ca)


@dataclass(frozen=True)
class ServeSettings:
    database_url: str
    admin_host: str
    admin_port: int
    authenticator: TokenAuthenticator
    control_plane: ControlPlaneConfig
    admin_tls: ssl.SSLContext | None = None
    admin_limits: ListenerLimits = field(
        default_factory=lambda: ListenerLimits(max_connections=DEFAULT_ADMIN_MAX_CONNECTIONS)
    )
    gateway: GatewayOptions | None = None
    """The client listener; None: no gateway in this process."""
    allow_privileged_role: bool = False


class _AdminServer(uvicorn.Server):
    """uvicorn without its own signal handling: ``_serve`` stops it with the control plane."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Event streams never end by themselves; ended now, they do not hold up the stop.
        end_event_streams(self.config.app)
        await super().shutdown(sockets)


async def _serve(settings: ServeSettings) -> int:
    """Serve until signalled or deposed; the process's exit code."""
    engine = create_engine(settings.database_url)
    try:
        allowed = await database_role_allowed(
            settings.database_url, allow_privileged=settings.allow_privileged_role
        )
        if not allowed:
            return 1
        store = PostgresEventStore(engine)
        await store.catch_up()
        control_plane = ControlPlane(store, settings.database_url, settings.control_plane)
        gateway = (
            PostgresGateway(settings.database_url, settings.gateway)
            if settings.gateway is not None
            else None
        )
        admin = _AdminServer(
            uvicorn.Config(
                create_admin_app(
                    store,
                    settings.authenticator,
                    Readiness(engine, role=lambda: control_plane.role),
                    live=control_plane_figures(control_plane),
                    # The gateway's page names every model and replica: operators read it
                    # here, with the cluster's, and its client listener has none.
                    gateway_metrics=gateway.gateway.metrics.render if gateway else None,
                ),
                host=settings.admin_host,
                port=settings.admin_port,
                log_config=None,
                access_log=False,
                # Followers of /admin/v1/events never finish their request by themselves.
                timeout_graceful_shutdown=ADMIN_SHUTDOWN_GRACE_S,
                http=admin_protocol(settings.admin_limits),
                ssl_context_factory=_fixed_context(settings.admin_tls),
            )
        )
        if gateway is not None:
            await gateway.start()
        outcome = await _run_until_signalled(admin, control_plane, gateway)
    except (OSError, StoreError, GatewayFailed) as exc:
        log.error("serve_failed", error=str(exc))
        return 1
    finally:
        await engine.dispose()
    if outcome is Outcome.DEPOSED:
        log.error(
            "serve_deposed",
            detail="this server no longer leads; restart it to stand by",
            exit_code=EXIT_DEPOSED,
        )
        return EXIT_DEPOSED
    return 0


def _fixed_context(
    context: ssl.SSLContext | None,
) -> Callable[[uvicorn.Config, Callable[[], ssl.SSLContext]], ssl.SSLContext] | None:
    if context is None:
        return None
    return lambda _config, _default: context


async def _run_until_signalled(
    admin: uvicorn.Server, control_plane: ControlPlane, gateway: PostgresGateway | None = None
) -> Outcome:
    """Serve the admin API (and the gateway, if any) and run the control plane until
    SIGINT or SIGTERM, until the control plane is deposed, or until a listener stops by
    itself."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    admin_task = asyncio.create_task(admin.serve())
    plane_task = asyncio.create_task(control_plane.run(stop))
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
    return plane_task.result()
