"""``llmgw-server serve``'s settings: one frozen struct that is also its set of flags.

Each field is a flag (``--admin-port``) with its environment variable and help; its
default is written here once, taken from the module that uses it where that module has
one (the reconciler's timings, the agent budget, the listeners' limits). The flags every
gateway has are ``GatewaySettings``, flattened in as ``llmgw-server gateway`` has them;
where the embedded gateway listens has flags of ``serve``'s own (``--client-host``,
``--client-port``, ``--client-max-connections``). A file flag given empty, by its flag or
its variable, is bad usage (``app.commands.path_flag``). The composition root,
``app.bootstrap``, builds the server from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from app.admin.tls import DEFAULT_ADMIN_KEEP_ALIVE_S, DEFAULT_ADMIN_MAX_CONNECTIONS
from app.commands.common import AllowPrivilegedRole, DatabaseUrl, database_url_problem
from app.commands.gateway_settings import GatewaySettings
from app.commands.path_flag import path_flag
from app.domain.adoption_grace import (
    DEFAULT_ADOPTION_GRACE_MAX_S,
    DEFAULT_ADOPTION_GRACE_S,
    DEFAULT_ADOPTION_QUIET_S,
)
from app.domain.reconcile import (
    DEFAULT_DRAIN_IDLE_TIMEOUT_S,
    DEFAULT_LOST_TIMEOUT_S,
    DEFAULT_STABILITY_WINDOW_S,
)
from app.gateway.postgres import DEFAULT_CLIENT_HOST, DEFAULT_CLIENT_PORT
from app.gateway.reporter import blank_id_problem, gateway_id_problem
from app.gateway.server import DEFAULT_MAX_CONNECTIONS
from app.hub.budget import MessageBudget
from app.hub.gate import DEFAULT_PER_ADDRESS as DEFAULT_HANDSHAKES_PER_ADDRESS
from app.hub.gate import MAX_PER_ADDRESS as MAX_HANDSHAKES_PER_ADDRESS
from app.hub.gate import per_address_problem
from app.hub.hub import DEFAULT_HEARTBEAT_INTERVAL_S
from app.hub.reconnects import (
    DEFAULT_CONNECT_BURST,
    DEFAULT_CONNECTS_PER_MINUTE,
    limit_problems,
)
from app.services.leader import DEFAULT_LEASE_S, lease_problem
from app.services.reconciler import DEFAULT_INTERVAL_S
from app.usage_errors import finite_number_flag, whole_number_flag

DEFAULT_BUDGET = MessageBudget()
MAX_TIMING_S = 86400.0
"""The longest of the reconciler's and the hub's timings: a day. Every pass turns them into
time spans, and a longer one (infinity, 1e308) overflowed them: the leader failed every pass."""


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    database_url: DatabaseUrl
    admin_host: Annotated[str, Parameter(env_var="LLMGW_ADMIN_HOST")] = "127.0.0.1"
    admin_port: Annotated[
        int, Parameter(converter=whole_number_flag, env_var="LLMGW_ADMIN_PORT")
    ] = 8081
    admin_tokens: Annotated[
        str,
        Parameter(
            env_var="LLMGW_ADMIN_TOKENS",
            help="NAME:TOKEN pairs, comma-separated. Given as this flag they are visible to "
            "other local users in the process list: set $LLMGW_ADMIN_TOKENS (in an "
            "environment file readable by the server's user alone) instead.",
        ),
    ] = ""
    admin_tls_cert: Annotated[
        Path | None,
        path_flag(
            "--admin-tls-cert",
            "LLMGW_ADMIN_TLS_CERT",
            "serve the admin API over HTTPS with this server certificate; operators may "
            "then authenticate with an operator certificate",
        ),
    ] = None
    admin_tls_key: Annotated[
        Path | None,
        path_flag("--admin-tls-key", "LLMGW_ADMIN_TLS_KEY", "that certificate's key"),
    ] = None
    admin_ca: Annotated[
        Path | None,
        path_flag(
            "--admin-ca",
            "LLMGW_ADMIN_CA",
            "the CA that issues operator certificates [default: --tls-ca]",
        ),
    ] = None
    agent_host: Annotated[str, Parameter(env_var="LLMGW_AGENT_HOST")] = "0.0.0.0"
    agent_port: Annotated[
        int, Parameter(converter=whole_number_flag, env_var="LLMGW_AGENT_PORT")
    ] = 8443
    tls_cert: Annotated[
        Path | None, path_flag("--tls-cert", "LLMGW_TLS_CERT", "the hub's server certificate")
    ] = None
    tls_key: Annotated[
        Path | None, path_flag("--tls-key", "LLMGW_TLS_KEY", "the server certificate's key")
    ] = None
    tls_ca: Annotated[
        Path | None,
        path_flag("--tls-ca", "LLMGW_TLS_CA", "the llmgw CA that issues node certificates"),
    ] = None
    require_identity: Annotated[
        bool,
        Parameter(
            env_var="LLMGW_REQUIRE_IDENTITY",
            help="a node certificate's common name must equal the node id its agent claims",
        ),
    ] = True
    heartbeat_interval: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_HEARTBEAT_INTERVAL",
            help="seconds between agent heartbeats; an agent silent for three is disconnected",
        ),
    ] = DEFAULT_HEARTBEAT_INTERVAL_S
    server_id: Annotated[
        str | None,
        Parameter(
            env_var="LLMGW_SERVER_ID",
            help="this server's name in the leadership table, to agents and in its gateway's "
            "reports; one per server (hostname:pid). With a gateway, at most 200 printable "
            "characters, without '@'",
            show_default=False,
        ),
    ] = None
    adoption_grace: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_ADOPTION_GRACE",
            help="the least seconds after election during which nothing is placed, lost or "
            "timed out, unless every known node has reconnected sooner; past it the grace "
            "lasts while agents are still arriving (--adoption-quiet)",
        ),
    ] = DEFAULT_ADOPTION_GRACE_S
    adoption_quiet: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_ADOPTION_QUIET",
            help="past --adoption-grace, the grace ends once no agent has arrived (said hello "
            "or had a connection opening) for this many seconds",
        ),
    ] = DEFAULT_ADOPTION_QUIET_S
    adoption_grace_max: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_ADOPTION_GRACE_MAX",
            help="the most seconds the adoption grace lasts, however long agents keep "
            "arriving (never less than --adoption-grace)",
        ),
    ] = DEFAULT_ADOPTION_GRACE_MAX_S
    lost_timeout: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_LOST_TIMEOUT",
            help="seconds a disconnected node may stay away before it and its replicas are lost",
        ),
    ] = DEFAULT_LOST_TIMEOUT_S
    stability_window: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_STABILITY_WINDOW",
            help="seconds a drain replacement must serve before the original is stopped",
        ),
    ] = DEFAULT_STABILITY_WINDOW_S
    leader_lease: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_LEADER_LEASE",
            help="seconds a leader may go unheard by PostgreSQL (frozen, cut off) before its "
            "lock is freed and a standby leads; also how long a transaction may wait for a "
            "frozen server. Longer than 6 (a leader's own check gives up first), at most 3600",
        ),
    ] = DEFAULT_LEASE_S
    reconcile_interval: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_RECONCILE_INTERVAL",
            help="seconds between reconcile passes when nothing wakes the reconciler sooner",
        ),
    ] = DEFAULT_INTERVAL_S
    client_host: Annotated[
        str,
        Parameter(
            env_var="LLMGW_CLIENT_HOST",
            help="where the OpenAI-compatible gateway listens (loopback unless set)",
        ),
    ] = DEFAULT_CLIENT_HOST
    client_port: Annotated[
        int, Parameter(converter=whole_number_flag, env_var="LLMGW_CLIENT_PORT")
    ] = DEFAULT_CLIENT_PORT
    gateway: Annotated[
        bool,
        Parameter(
            env_var="LLMGW_GATEWAY",
            help="serve the gateway on the client listener; --no-gateway when separate "
            "`llmgw-server gateway` processes serve clients",
        ),
    ] = True
    drain_idle_timeout: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_DRAIN_IDLE_TIMEOUT",
            help="seconds a replica taken out of routing waits for the requests gateways "
            "report in flight on it before it is stopped anyway",
        ),
    ] = DEFAULT_DRAIN_IDLE_TIMEOUT_S
    agent_message_rate: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_AGENT_MESSAGE_RATE",
            help="messages a second one agent connection may send, sustained; a connection "
            "over its budget is closed (1008) and the refusal recorded",
        ),
    ] = DEFAULT_BUDGET.messages_per_s
    agent_message_burst: Annotated[
        int,
        Parameter(
            converter=whole_number_flag,
            env_var="LLMGW_AGENT_MESSAGE_BURST",
            help="messages one agent connection may send at once above that rate",
        ),
    ] = DEFAULT_BUDGET.message_burst
    agent_connect_burst: Annotated[
        int,
        Parameter(
            converter=whole_number_flag,
            env_var="LLMGW_AGENT_CONNECT_BURST",
            help="connections one node (its certificate's common name) may open at once; "
            "one over its budget is closed (4004) before its hello, and its agent retries "
            "at its slowest pace",
        ),
    ] = DEFAULT_CONNECT_BURST
    agent_connects_per_minute: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_AGENT_CONNECTS_PER_MINUTE",
            help="connections one node earns back each minute after that burst",
        ),
    ] = DEFAULT_CONNECTS_PER_MINUTE
    agent_handshakes_per_address: Annotated[
        int,
        Parameter(
            converter=whole_number_flag,
            env_var="LLMGW_AGENT_HANDSHAKES_PER_ADDRESS",
            help="agent TLS handshakes one address (an IPv6 address: its /64) may have in "
            f"progress at once (1-{MAX_HANDSHAKES_PER_ADDRESS}); a connection over it is "
            "closed before its handshake starts, counted and logged. Raise it where many "
            "agents share an address (NAT)",
        ),
    ] = DEFAULT_HANDSHAKES_PER_ADDRESS
    admin_max_connections: Annotated[
        int,
        Parameter(
            converter=whole_number_flag,
            env_var="LLMGW_ADMIN_MAX_CONNECTIONS",
            help="connections the admin listener holds at once; one more is answered 503",
        ),
    ] = DEFAULT_ADMIN_MAX_CONNECTIONS
    admin_keep_alive_timeout: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_ADMIN_KEEP_ALIVE_TIMEOUT",
            help="seconds a kept-alive admin listener connection may sit idle between "
            "requests; then it is closed without an answer. Keep it longer than a client in "
            "front keeps an idle connection (a load balancer's pool), so that the client lets "
            "go first rather than send its next request on a connection being closed",
        ),
    ] = DEFAULT_ADMIN_KEEP_ALIVE_S
    client_max_connections: Annotated[
        int,
        Parameter(
            converter=whole_number_flag,
            env_var="LLMGW_CLIENT_MAX_CONNECTIONS",
            help="connections the gateway's client listener holds at once; one more is "
            "answered 503",
        ),
    ] = DEFAULT_MAX_CONNECTIONS
    gateway_settings: GatewaySettings = field(default_factory=GatewaySettings)
    allow_privileged_role: AllowPrivilegedRole = False
    log_level: Annotated[str, Parameter(env_var="LLMGW_LOG_LEVEL")] = "info"

    def problems(self) -> list[str]:
        """What is wrong with these settings, one line each; empty when they can be used."""
        intervals = (
            ("--heartbeat-interval", self.heartbeat_interval),
            ("--reconcile-interval", self.reconcile_interval),
        )
        waits = (
            ("--adoption-grace", self.adoption_grace),
            ("--adoption-quiet", self.adoption_quiet),
            ("--adoption-grace-max", self.adoption_grace_max),
            ("--lost-timeout", self.lost_timeout),
            ("--stability-window", self.stability_window),
            ("--drain-idle-timeout", self.drain_idle_timeout),
        )
        rates = (
            ("--agent-message-rate", self.agent_message_rate),
            ("--agent-message-burst", self.agent_message_burst),
        )
        keep_alive = ("--admin-keep-alive-timeout", self.admin_keep_alive_timeout)
        problems = [
            f"{flag} must be positive, not {value}"
            for flag, value in (*intervals, *rates, keep_alive)
            if not value > 0  # NaN too: it passes every comparison
        ]
        problems += [
            f"{flag} must not be negative, not {value}" for flag, value in waits if not value >= 0
        ]
        problems += [
            f"{flag} must be at most {MAX_TIMING_S:g} seconds, not {value:g}"
            for flag, value in (*intervals, *waits)
            if value > MAX_TIMING_S
        ]
        problems += limit_problems(self.agent_connect_burst, self.agent_connects_per_minute)
        handshakes = per_address_problem(self.agent_handshakes_per_address)
        if handshakes is not None:
            problems.append(f"--agent-handshakes-per-address {handshakes}")
        lease = lease_problem(self.leader_lease)
        if lease is not None:
            problems.append(f"--leader-lease: {lease}")
        url_problem = database_url_problem(self.database_url)
        if url_problem is not None:
            problems.append(url_problem)
        if self.gateway and not 0 <= self.client_port <= 65535:
            problems.append(f"--client-port must be between 0 and 65535, not {self.client_port}")
        if self.gateway:
            problems += self.gateway_settings.problems()
        if self.server_id is not None and not self.server_id.strip():
            # Blank names no server, with a gateway or without: leadership shows it too.
            problems.append(blank_id_problem("--server-id", "LLMGW_SERVER_ID"))
        elif self.gateway and self.server_id is not None:
            id_problem = gateway_id_problem(self.server_id, "--server-id", "LLMGW_SERVER_ID")
            if id_problem is not None:
                problems.append(id_problem)
        return problems
