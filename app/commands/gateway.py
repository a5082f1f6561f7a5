"""``llmgw-server gateway``: the gateway alone, stateless, against the database.

Its flags are ``StandaloneGatewaySettings``: where it listens and what only a standalone
gateway has, around the flags every gateway has (``app.commands.gateway_settings``)."""

from __future__ import annotations

import asyncio
import signal
import sys
from dataclasses import dataclass, field
from typing import Annotated

import structlog
import uvloop
from cyclopts import Parameter

from app.commands.common import (
    GATEWAY,
    AllowPrivilegedRole,
    DatabaseUrl,
    database_role_allowed,
    database_url_problem,
    engine_networks_of,
    refuse_usage,
    schema_allowed,
    warn_if_gateway_appends,
)
from app.commands.gateway_settings import GatewaySettings, gateway_options
from app.domain.egress import EngineNetworks, InvalidEngineNetworks
from app.gateway.postgres import (
    DEFAULT_CLIENT_HOST,
    DEFAULT_CLIENT_PORT,
    DEFAULT_QUEUE_TIMEOUT_S,
    DEFAULT_SCRAPE_INTERVAL_S,
    GatewayOptions,
    PostgresGateway,
)
from app.gateway.server import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_METRICS_HOST,
    DEFAULT_METRICS_PORT,
    GatewayFailed,
)
from app.gateway.source import DEFAULT_REFRESH_INTERVAL_S
from app.logs import configure_logging
from app.store.database import create_engine
from app.store.errors import StoreError, StoreUnavailable
from app.usage_errors import finite_number_flag, print_command_error, whole_number_flag

log = structlog.get_logger(__name__)

ROLE_CHECK_RETRY_S = 5.0
"""How often a gateway that started while the database was away asks again for its role
and its schema."""


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class StandaloneGatewaySettings:
    """``llmgw-server gateway``'s flags: where it listens, what only a standalone gateway
    has, the gateway's own (``GatewaySettings``), and the database role check."""

    database_url: DatabaseUrl
    host: Annotated[
        str,
        Parameter(
            env_var="LLMGW_GATEWAY_HOST",
            help="address to listen on; loopback by default, so exposing the gateway is a "
            "choice (0.0.0.0 behind a load balancer)",
        ),
    ] = DEFAULT_CLIENT_HOST
    port: Annotated[int, Parameter(converter=whole_number_flag, env_var="LLMGW_GATEWAY_PORT")] = (
        DEFAULT_CLIENT_PORT
    )
    reuse_port: Annotated[
        bool,
        Parameter(
            env_var="LLMGW_GATEWAY_REUSE_PORT",
            help="share --port with other gateway processes on this machine (SO_REUSEPORT: "
            "the kernel spreads new connections among them), one per core to use; give each "
            "its own --metrics-port",
        ),
    ] = False
    gateway_id: Annotated[
        str | None,
        Parameter(
            env_var="LLMGW_GATEWAY_ID",
            help="this gateway's name in its in-flight reports, one per process: a second "
            "process with the same id reports as ID@INSTANCE and logs gateway_id_shared; at "
            "most 200 printable characters, without '@' [default: hostname-pid]",
            show_default=False,
        ),
    ] = None
    queue_timeout: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_QUEUE_TIMEOUT",
            help="seconds a request waits for a replica with room before it gets 429",
        ),
    ] = DEFAULT_QUEUE_TIMEOUT_S
    scrape_interval: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_SCRAPE_INTERVAL",
            help="seconds between scrapes of each replica's engine metrics",
        ),
    ] = DEFAULT_SCRAPE_INTERVAL_S
    refresh_interval: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_REFRESH_INTERVAL",
            help="seconds between reads of the routing table and keys when no change is "
            "notified sooner",
        ),
    ] = DEFAULT_REFRESH_INTERVAL_S
    gateway_settings: GatewaySettings = field(default_factory=GatewaySettings)
    allow_privileged_role: AllowPrivilegedRole = False
    metrics_host: Annotated[
        str,
        Parameter(
            env_var="LLMGW_GATEWAY_METRICS_HOST",
            help="where /metrics is served, apart from clients: it names every model and "
            "replica (loopback unless set; the client listener answers 404 for it)",
        ),
    ] = DEFAULT_METRICS_HOST
    metrics_port: Annotated[
        int, Parameter(converter=whole_number_flag, env_var="LLMGW_GATEWAY_METRICS_PORT")
    ] = DEFAULT_METRICS_PORT
    max_connections: Annotated[
        int,
        Parameter(
            converter=whole_number_flag,
            env_var="LLMGW_GATEWAY_MAX_CONNECTIONS",
            help="client connections held at once; one more is answered 503 and closed",
        ),
    ] = DEFAULT_MAX_CONNECTIONS
    log_level: Annotated[str, Parameter(env_var="LLMGW_LOG_LEVEL")] = "info"

    def options(self, engine_networks: EngineNetworks | None) -> GatewayOptions:
        """The gateway these flags run, contacting engines in ``engine_networks``."""
        return gateway_options(
            self.gateway_settings,
            engine_networks,
            max_connections=self.max_connections,
            host=self.host,
            port=self.port,
            reuse_port=self.reuse_port,
            gateway_id=self.gateway_id,
            queue_timeout_s=self.queue_timeout,
            scrape_interval_s=self.scrape_interval,
            refresh_interval_s=self.refresh_interval,
            metrics_host=self.metrics_host,
            metrics_port=self.metrics_port,
        )


def gateway_command(settings: StandaloneGatewaySettings) -> None:
    """Run the OpenAI-compatible gateway alone, stateless, against the database, until
    SIGINT or SIGTERM. Any number may run behind a load balancer; each keeps serving from
    its last routing table and keys while the database is away (/readyz then says 503).
    Keys' rpm and tpm hold across all of them (slices of each key's budget are leased from
    the database); while it is away each gateway enforces its local share.

    Engines are contacted only where --engine-networks allows; a route elsewhere is left
    out of routing, with a warning. Like `serve`, it refuses a database role that could
    rewrite the event log (a superuser, the owner of its tables) unless
    --allow-privileged-role is given: connect as the gateway role (`llmgw-server migrate
    --gateway-role`), which cannot append, or the runtime role (it then warns that it
    could append). Started while the database is away, it checks the role and the schema
    once the database answers, and exits 1 then if either is refused. Its /metrics is on a
    listener of its own (--metrics-host, --metrics-port), never on the client listener.

    A gateway is one process on one core; to use more cores of a machine, start one
    process per core with --reuse-port on the same --port, each with its own --metrics-port:
    every process is a gateway of its own (its own reports, its own share of keys' limits).

    Exit codes: 0 after SIGINT or SIGTERM; 1 when it cannot listen, stops by itself or its
    database role could rewrite the log, said in one line on stderr; 2 bad usage.

    Example: llmgw-server gateway --host 0.0.0.0 --port 8080 --engine-networks 10.20.0.0/16
    --metrics-host 10.0.0.5
    """
    configure_logging(settings.log_level, command=GATEWAY)
    url_problem = database_url_problem(settings.database_url)
    if url_problem is not None:
        refuse_usage(GATEWAY, url_problem)
    try:
        networks = engine_networks_of(settings.gateway_settings.engine_networks)
    except InvalidEngineNetworks as exc:
        refuse_usage(GATEWAY, f"--engine-networks: {exc}")
    options = settings.options(networks)
    if options.problems():
        refuse_usage(GATEWAY, "; ".join(options.problems()))
    sys.exit(uvloop.run(_gateway(settings.database_url, options, settings.allow_privileged_role)))


async def _gateway(database_url: str, options: GatewayOptions, allow_privileged: bool) -> int:
    """Serve until signalled; the exit code (1 when it cannot listen, stops by itself or
    finds its database role privileged)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        if not await database_role_allowed(
            database_url, allow_privileged=allow_privileged, command=GATEWAY
        ):
            return 1
        role_checked = True
        await warn_if_gateway_appends(database_url)
        if not await _schema_served(database_url):
            return 1
    except StoreUnavailable as exc:
        log.warning(
            "database_role_unchecked",
            detail="cannot check the database role yet; asking again",
            error=str(exc),
        )
        role_checked = False
    gateway = PostgresGateway(database_url, options)
    try:
        await gateway.start()
    except (OSError, GatewayFailed) as exc:
        log.error("gateway_failed_to_start", host=options.host, port=options.port, error=str(exc))
        print_command_error(GATEWAY, f"cannot serve: {exc}")
        return 1
    serving = asyncio.create_task(gateway.serve())
    stopping = asyncio.create_task(stop.wait())
    waiting: set[asyncio.Task[object]] = {serving, stopping}
    if not role_checked:
        waiting.add(asyncio.create_task(_refused_later(database_url, allow_privileged)))
    try:
        while True:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if done & {serving, stopping} or any(task.result() for task in done):
                break
            waiting -= done  # the role and schema, asked once the database answered, are allowed
    finally:
        for task in waiting - {serving}:
            task.cancel()
        await gateway.stop()
        await asyncio.gather(*waiting, return_exceptions=True)
    return 0 if stop.is_set() else 1


async def _schema_served(database_url: str) -> bool:
    """Whether the schema is one this gateway can serve from: its release's, or a newer
    one's (gateways are rolled after the control planes, and go on serving meanwhile). On a
    database not migrated it used to start, listen and answer every request with an error."""
    engine = create_engine(database_url, pool_size=1)
    try:
        return await schema_allowed(engine, command=GATEWAY, newer_allowed=True)
    except StoreUnavailable:
        raise
    except StoreError as exc:
        log.error("gateway_failed_to_start", error=f"cannot read the schema's revision: {exc}")
        return False
    finally:
        await engine.dispose()


async def _refused_later(database_url: str, allow_privileged: bool) -> bool:
    """Whether the role or the schema is refused, asked until the database answers: what
    the start-up check asks, for a gateway that started while the database was away (a
    gateway of a new release started while PostgreSQL restarted during an upgrade)."""
    while True:
        await asyncio.sleep(ROLE_CHECK_RETRY_S)
        try:
            if not await database_role_allowed(
                database_url, allow_privileged=allow_privileged, command=GATEWAY
            ):
                return True
            await warn_if_gateway_appends(database_url)
            return not await _schema_served(database_url)
        except StoreUnavailable:
            continue
