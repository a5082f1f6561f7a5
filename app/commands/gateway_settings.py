"""What a gateway is, wherever it runs: its flags, declared once, and the one function that
turns them into its options.

``GatewaySettings`` holds the flags ``llmgw-server gateway`` and ``llmgw-server serve`` share
for the gateway they run (the engines it may contact, when it ejects a replica, how long an
engine and a client may take, the biggest upload, how long open requests may finish once it
is told to stop), each with its environment variable, help
and default; both commands flatten it into their own flags. Where a gateway listens is not
among them: the two commands name it their own way (``gateway --host``, ``--port``,
``--max-connections``; ``serve --client-host``, ``--client-port``,
``--client-max-connections``), and only a standalone gateway has a routing table refresh, a
queue timeout and a /metrics listener of its own. ``app.commands.gateway`` and
``app.settings`` hold each command's whole flag set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, TypedDict, Unpack

from cyclopts import Parameter

from app.domain.egress import EngineNetworks
from app.gateway.ejection import (
    DEFAULT_BASE_COOL_OFF_S,
    DEFAULT_CONSECUTIVE_FAILURES,
    DEFAULT_MAX_COOL_OFF_S,
    DEFAULT_MAX_EJECTED_PERCENT,
    EjectionPolicy,
)
from app.gateway.engine_bounds import DEFAULT_HEAD_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S, EngineTimeouts
from app.gateway.postgres import GatewayOptions, max_upload_problem, shutdown_grace_problem
from app.gateway.server import DEFAULT_SHUTDOWN_GRACE_S
from app.gateway.uploads import DEFAULT_MAX_UPLOAD_BYTES
from app.listeners.limits import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_SEND_TIMEOUT_S,
    ListenerLimits,
)
from app.listeners.throttle import DEFAULT_BURST, DEFAULT_PER_MINUTE, FailureLimits
from app.usage_errors import finite_number_flag, whole_number_flag


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """A gateway's flags, the same under ``gateway`` and ``serve``. Under ``serve`` the
    client timeouts and the auth failure budget hold for its admin listener too, and the
    shutdown grace bounds the admin listener's own."""

    engine_networks: Annotated[
        str,
        Parameter(
            env_var="LLMGW_ENGINE_NETWORKS",
            help="where engines may live, comma-separated: networks (10.20.0.0/16), addresses, "
            "DNS names (gpu-07.internal) or *.domain; the gateway contacts no engine elsewhere. "
            "[default: only the address each node's agent connects from, and loopback if it "
            "connects over loopback]",
            show_default=False,
        ),
    ] = ""
    eject_after_failures: Annotated[
        int,
        Parameter(
            converter=whole_number_flag,
            env_var="LLMGW_EJECT_AFTER_FAILURES",
            help="requests in a row a replica fails (no answer, or a 5xx before the first "
            "byte) before the gateway takes it out of rotation for a cool-off; 0: never",
        ),
    ] = DEFAULT_CONSECUTIVE_FAILURES
    ejection_cool_off: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_EJECTION_COOL_OFF",
            help="seconds an ejected replica stays out the first time; doubled with each "
            "ejection in a row. Then one request probes it: a success returns it",
        ),
    ] = DEFAULT_BASE_COOL_OFF_S
    max_ejection_cool_off: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_MAX_EJECTION_COOL_OFF",
            help="the longest cool-off, however many ejections in a row",
        ),
    ] = DEFAULT_MAX_COOL_OFF_S
    max_ejected_percent: Annotated[
        int,
        Parameter(
            converter=whole_number_flag,
            env_var="LLMGW_MAX_EJECTED_PERCENT",
            help="at most this share of a model's replicas is ejected at once (at least "
            "one of two or more; never the last one in rotation)",
        ),
    ] = DEFAULT_MAX_EJECTED_PERCENT
    auth_failure_burst: Annotated[
        int,
        Parameter(
            converter=whole_number_flag,
            env_var="LLMGW_AUTH_FAILURE_BURST",
            help="wrong keys or tokens one client address may send at once before it gets 429 "
            "with Retry-After",
        ),
    ] = DEFAULT_BURST
    auth_failures_per_minute: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_AUTH_FAILURES_PER_MINUTE",
            help="wrong keys or tokens an address earns back each minute",
        ),
    ] = DEFAULT_PER_MINUTE
    header_timeout: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_HEADER_TIMEOUT",
            help="seconds a client has to send a request's headers (from connecting, or from "
            "the first byte of the next request); then it gets 408 and is disconnected, or, "
            "having sent nothing at all, is disconnected without an answer",
        ),
    ] = DEFAULT_HEADER_TIMEOUT_S
    body_timeout: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_BODY_TIMEOUT",
            help="seconds a client has to send a request's body once its headers are in, not "
            "counting the time the server does not read it (the request waits for a "
            "replica); then it gets 408 and is disconnected",
        ),
    ] = DEFAULT_BODY_TIMEOUT_S
    send_timeout: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_SEND_TIMEOUT",
            help="seconds a client may take in nothing of an answer the server has for it (a "
            "stream it stopped reading); then it is disconnected and its request ends, "
            "freeing what it held",
        ),
    ] = DEFAULT_SEND_TIMEOUT_S
    engine_head_timeout: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_ENGINE_HEAD_TIMEOUT",
            help="seconds an engine may take to send its answer's head, and a stream's first "
            "piece, after the request (an answer that is not streamed comes only once it is "
            "generated whole, after its time in the engine's queue); then the client gets "
            "504, the engine's connection is closed and the attempt counts as the replica's "
            "failure",
        ),
    ] = DEFAULT_HEAD_TIMEOUT_S
    engine_idle_timeout: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_ENGINE_IDLE_TIMEOUT",
            help="seconds an engine may send nothing once its answer has begun (the gateway "
            "not reading it, its client being slow, does not count); then the answer ends as "
            "one whose engine broke off (a stream gets an error event and [DONE]) and the "
            "engine's connection is closed",
        ),
    ] = DEFAULT_IDLE_TIMEOUT_S
    max_upload_mib: Annotated[
        int,
        Parameter(
            converter=whole_number_flag,
            env_var="LLMGW_GATEWAY_MAX_UPLOAD_MIB",
            help="an upload's body at most (/v1/audio/transcriptions and translations), in "
            "MiB; a larger one is 413. A large upload must also arrive within --body-timeout",
        ),
    ] = DEFAULT_MAX_UPLOAD_BYTES >> 20
    shutdown_grace: Annotated[
        float,
        Parameter(
            converter=finite_number_flag,
            env_var="LLMGW_SHUTDOWN_GRACE",
            help="seconds a gateway told to stop (SIGTERM, SIGINT) lets its open requests "
            "finish; then each is cancelled, and its client told the gateway stopped, within a "
            "second more. Keep it below the termination grace of what runs the gateway "
            "(Kubernetes' terminationGracePeriodSeconds, systemd's TimeoutStopSec), which "
            "kills the process when it runs out",
        ),
    ] = DEFAULT_SHUTDOWN_GRACE_S

    def problems(self) -> list[str]:
        """What is wrong with how this gateway ejects replicas, waits for engines, bounds
        uploads and stops, one line each naming its flag; empty when they can be used."""
        problems = self.ejection_policy().problems() + self.engine_timeouts().problems()
        for problem in (
            max_upload_problem(self.max_upload_bytes),
            shutdown_grace_problem(self.shutdown_grace),
        ):
            if problem is not None:
                problems.append(problem)
        return problems

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mib << 20

    def ejection_policy(self) -> EjectionPolicy:
        """When the gateway takes a replica that keeps failing out of rotation."""
        return EjectionPolicy(
            consecutive_failures=self.eject_after_failures,
            base_cool_off_s=self.ejection_cool_off,
            max_cool_off_s=self.max_ejection_cool_off,
            max_ejected_percent=self.max_ejected_percent,
        )

    def engine_timeouts(self) -> EngineTimeouts:
        """How long an engine may take to answer the gateway, and be silent."""
        return EngineTimeouts(head_s=self.engine_head_timeout, idle_s=self.engine_idle_timeout)

    def auth_failures(self) -> FailureLimits:
        """Wrong keys or tokens one client address may send before it gets 429."""
        return FailureLimits(
            burst=self.auth_failure_burst, per_minute=self.auth_failures_per_minute
        )

    def listener_limits(self, max_connections: int) -> ListenerLimits:
        """A listener's limits: these client timeouts, and its own cap on connections."""
        return ListenerLimits(
            header_timeout_s=self.header_timeout,
            body_timeout_s=self.body_timeout,
            send_timeout_s=self.send_timeout,
            max_connections=max_connections,
        )


class OwnOptions(TypedDict, total=False):
    """The gateway's options each command gives by flags of its own names (``--host``,
    ``--client-host``), or, for what only a standalone gateway has, not at all: those left
    out keep ``GatewayOptions``'s defaults."""

    host: str
    port: int
    gateway_id: str | None
    reuse_port: bool
    queue_timeout_s: float
    scrape_interval_s: float
    refresh_interval_s: float
    metrics_host: str
    metrics_port: int | None


def gateway_options(
    settings: GatewaySettings,
    engine_networks: EngineNetworks | None,
    *,
    max_connections: int,
    **own: Unpack[OwnOptions],
) -> GatewayOptions:
    """The options of a gateway with ``settings``, contacting engines in ``engine_networks``
    (parsed from ``settings.engine_networks``: each command says its own error) and holding
    at most ``max_connections`` clients: what both ``gateway`` and ``serve`` run."""
    return GatewayOptions(
        **own,
        engine_networks=engine_networks,
        limits=settings.listener_limits(max_connections),
        auth_failures=settings.auth_failures(),
        ejection=settings.ejection_policy(),
        max_upload_bytes=settings.max_upload_bytes,
        engine_timeouts=settings.engine_timeouts(),
        shutdown_grace_s=settings.shutdown_grace,
    )
