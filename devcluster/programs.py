"""The command lines of llmgw's programs as a cluster starts them: ``llmgw-server serve``
and ``gateway``, ``llmgw-agent``, ``llmgw-agent stop-engines`` and the engine simulator.

Each is a frozen description with ``argv()``, and the URLs it answers on where a cluster
needs them (``gateway_url``: a gateway's, wherever one serves). Secrets (the database URL,
admin tokens) are not part of any: they travel in the environment (``secrets()``), where
``ps`` does not show them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from devcluster.pki import ClusterPki, NodeCredentials
from devcluster.ports import LOOPBACK
from devcluster.processes import program

LOOPBACK_ENGINES = "127.0.0.0/8"
"""Every engine of a local cluster listens on loopback: nothing else is ever contacted."""
EnginesOnExit = Literal["keep", "stop"]


def gateway_url(port: int) -> str:
    """Base URL of the OpenAI-compatible API a gateway serves on loopback ``port``, as the
    ``openai`` SDK takes it."""
    return f"http://{LOOPBACK}:{port}/v1"


def simulator_command(*flags: str) -> str:
    """The model command that runs the engine simulator, placeholders left for the control
    plane to fill in."""
    return " ".join((program("llmgw-sim-engine"), "--port", "{port}", "--model", "{model}", *flags))


@dataclass(frozen=True, kw_only=True)
class ServeCommand:
    """``llmgw-server serve`` on loopback with the cluster's certificates."""

    pki: ClusterPki
    admin_port: int
    agent_port: int
    client_port: int | None
    """Where its gateway serves clients; None: no gateway (``--no-gateway``)."""
    database_url: str
    admin_tokens: tuple[tuple[str, str], ...] = ()
    """``(name, token)`` pairs the admin API accepts."""
    server_id: str | None = None
    admin_tls: bool = False
    """Serve the admin API over HTTPS with the server certificate."""
    engine_networks: str = LOOPBACK_ENGINES
    flags: tuple[str, ...] = ()
    """Any other flags, as given."""

    @property
    def agent_uri(self) -> str:
        return f"wss://{LOOPBACK}:{self.agent_port}"

    @property
    def admin_url(self) -> str:
        return f"{'https' if self.admin_tls else 'http'}://{LOOPBACK}:{self.admin_port}"

    def argv(self) -> list[str]:
        pki = self.pki
        gateway = (
            ["--no-gateway"]
            if self.client_port is None
            else ["--client-host", LOOPBACK, "--client-port", str(self.client_port)]
        )
        certificate, key = str(pki.server_certificate), str(pki.server_key)
        admin_tls = (
            ["--admin-tls-cert", certificate, "--admin-tls-key", key] if self.admin_tls else []
        )
        server_id = [] if self.server_id is None else ["--server-id", self.server_id]
        return [
            program("llmgw-server"),
            "serve",
            *server_id,
            *("--admin-host", LOOPBACK, "--admin-port", str(self.admin_port)),
            *("--agent-host", LOOPBACK, "--agent-port", str(self.agent_port)),
            *gateway,
            *admin_tls,
            *("--tls-cert", str(pki.server_certificate), "--tls-key", str(pki.server_key)),
            *("--tls-ca", str(pki.ca), "--engine-networks", self.engine_networks),
            *self.flags,
        ]

    def secrets(self) -> dict[str, str]:
        tokens = ",".join(f"{name}:{token}" for name, token in self.admin_tokens)
        return {"LLMGW_DATABASE_URL": self.database_url} | (
            {"LLMGW_ADMIN_TOKENS": tokens} if tokens else {}
        )


@dataclass(frozen=True, kw_only=True)
class GatewayCommand:
    """A standalone ``llmgw-server gateway`` on loopback."""

    gateway_id: str
    port: int
    database_url: str
    refresh_interval_s: float = 1.0
    queue_timeout_s: float = 5.0
    engine_networks: str = LOOPBACK_ENGINES
    metrics_port: int = 0
    """Its /metrics listener's port; 0: one the kernel picks, so that gateways on one
    machine never meet on the default."""

    @property
    def url(self) -> str:
        return gateway_url(self.port)

    def argv(self) -> list[str]:
        return [
            program("llmgw-server"),
            "gateway",
            *("--gateway-id", self.gateway_id),
            *("--host", LOOPBACK, "--port", str(self.port)),
            *("--metrics-port", str(self.metrics_port)),
            *("--engine-networks", self.engine_networks),
            *("--refresh-interval", str(self.refresh_interval_s)),
            *("--queue-timeout", str(self.queue_timeout_s)),
        ]

    def secrets(self) -> dict[str, str]:
        return {"LLMGW_DATABASE_URL": self.database_url}


@dataclass(frozen=True, kw_only=True)
class AgentCommand:
    """``llmgw-agent`` with fake GPUs, its engines on loopback."""

    servers: tuple[str, ...]
    """Control planes to dial, in turn."""
    node_id: str
    credentials: NodeCredentials
    state_dir: Path
    fake_gpus: str = "2x80GB"
    port_range: str = "1024-65535"
    labels: Mapping[str, str] = field(default_factory=dict)
    reconnect_max_delay_s: float | None = None
    engines_on_exit: EnginesOnExit = "keep"

    def argv(self) -> list[str]:
        credentials = self.credentials
        servers = [flag for uri in self.servers for flag in ("--server", uri)]
        labels = [flag for k, v in self.labels.items() for flag in ("--label", f"{k}={v}")]
        reconnect = (
            []
            if self.reconnect_max_delay_s is None
            else ["--reconnect-max-delay", str(self.reconnect_max_delay_s)]
        )
        return [
            program("llmgw-agent"),
            *servers,
            *("--node-id", self.node_id),
            *("--cert", str(credentials.certificate), "--key", str(credentials.key)),
            *("--ca", str(credentials.ca), "--state-dir", str(self.state_dir)),
            *("--fake-gpus", self.fake_gpus, "--address", LOOPBACK),
            *("--port-range", self.port_range, *labels, *reconnect),
            *("--engines-on-exit", self.engines_on_exit),
        ]


def stop_engines_argv(state_dirs: Iterable[Path], grace_s: float) -> list[str]:
    """``llmgw-agent stop-engines``: stop every engine recorded in ``state_dirs``."""
    directories = [flag for directory in state_dirs for flag in ("--state-dir", str(directory))]
    return [program("llmgw-agent"), "stop-engines", *directories, "--grace", str(grace_s)]
