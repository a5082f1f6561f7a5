"""The agent's settings: command-line flags over ``LLMGW_AGENT_*`` variables over a TOML file
over defaults.

Each source is read into ``AgentSettings`` (``agent.config_sources``), where None means "not
set here"; ``merge`` takes each field from the first source that sets it (lists and tables
are replaced whole, never combined), and ``resolve`` checks the result and fills in the
defaults, into an ``AgentConfig``. Every problem is a ``ConfigError`` whose text names the
setting and says what is expected; each value is parsed by ``agent.config_values``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from agent.config_values import (
    ConfigError,
    EnginesOnExit,
    ServerAddress,
    hello_address,
    hello_labels,
    not_a_file,
    parse_engines_on_exit,
    parse_port_range,
    parse_server,
)
from agent.engines.readiness import DEFAULT_LIVENESS, Liveness
from agent.gpus import parse_fake_gpus
from app.pki.errors import InvalidRequest
from app.pki.names import check_subject_name

ENV_PREFIX = "LLMGW_AGENT_"
DEFAULT_PORT_RANGE = (20000, 20999)
DEFAULT_RECONNECT_MAX_DELAY_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
"""The TCP connect to a control plane: short, so a server that is down is skipped fast."""
DEFAULT_OPEN_TIMEOUT_S = 30.0
"""The TLS handshake and WebSocket upgrade after it: long, because a control plane just
elected is handshaking with every agent at once."""
DEFAULT_NEXT_SERVER_AFTER_S = 5.0
"""How long a dial waits for its connection to open before the next server is dialled as
well (the slow dial goes on): a frozen control plane, whose kernel still accepts TCP, costs
an agent this rather than the open timeout."""
FAKE_GPU_HEALTH_FILE = "fake-gpu-health.json"
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """One source of settings; None means the source does not set that field."""

    servers: tuple[str, ...] | None = None
    node_id: str | None = None
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    fake_gpus: str | None = None
    state_dir: Path | None = None
    labels: dict[str, str] | None = None
    address: str | None = None
    port_range: str | None = None
    log_level: str | None = None
    reconnect_max_delay: float | None = None
    connect_timeout: float | None = None
    open_timeout: float | None = None
    next_server_after: float | None = None
    engines_on_exit: str | None = None
    liveness_interval: float | None = None
    liveness_failures: int | None = None


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    servers: tuple[ServerAddress, ...]
    node_id: str
    cert: Path
    key: Path
    ca: Path
    fake_gpus: str | None
    state_dir: Path
    labels: dict[str, str]
    address: str | None
    """Where engines on this node are reachable; None: the address the connection to the
    control plane leaves from (which the control plane accepts without further proof)."""
    port_range: tuple[int, int]
    log_level: str
    reconnect_max_delay_s: float = DEFAULT_RECONNECT_MAX_DELAY_S
    """The longest wait between two connection attempts."""
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    """How long a TCP connect to a control plane may take."""
    open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S
    """How long the TLS handshake and WebSocket upgrade after it may take."""
    next_server_after_s: float = DEFAULT_NEXT_SERVER_AFTER_S
    """How long a dial may go without opening before the next server is dialled too."""
    engines_on_exit: EnginesOnExit = "keep"
    """What the agent does with its engines when it is stopped (SIGTERM, SIGINT): ``keep``
    them running, as an agent upgrade wants, or ``stop`` them and report each stop first."""
    liveness: Liveness = DEFAULT_LIVENESS
    """How a serving engine's health is checked (``agent.engines.readiness``)."""

    @property
    def fake_gpu_health_file(self) -> Path:
        return fake_gpu_health_file(self.state_dir)


def fake_gpu_health_file(state_dir: Path) -> Path:
    """Where ``llmgw-agent fake-gpu mark`` writes and the running agent reads."""
    return state_dir / FAKE_GPU_HEALTH_FILE


def merge(*sources: AgentSettings) -> AgentSettings:
    """Each field from the first source that sets it: pass the strongest source first."""
    merged = {
        field.name: next(
            (value for source in sources if (value := getattr(source, field.name)) is not None),
            None,
        )
        for field in fields(AgentSettings)
    }
    return AgentSettings(**merged)


def resolve(settings: AgentSettings, environ: Mapping[str, str]) -> AgentConfig:
    """Check every setting and fill in the defaults."""
    if not settings.servers:
        raise ConfigError(_missing("--server", "SERVERS", "servers", "wss://HOST:PORT"))
    node_id = _required(settings.node_id, "--node-id", "NODE_ID", "node_id")
    # Each source's values were checked as it was read, naming it; these checks name the
    # flags, and hold for settings built in code too.
    check_values(settings, _flag)
    fake_gpus = settings.fake_gpus
    log_level = (settings.log_level or "info").lower()
    interval_s = settings.liveness_interval
    failures = settings.liveness_failures
    return AgentConfig(
        servers=tuple(parse_server(server) for server in settings.servers),
        node_id=node_id,
        cert=_existing_file(settings.cert, "--cert", "CERT", "cert"),
        key=_existing_file(settings.key, "--key", "KEY", "key"),
        ca=_existing_file(settings.ca, "--ca", "CA", "ca"),
        fake_gpus=fake_gpus,
        state_dir=settings.state_dir or default_state_dir(environ),
        # Each source's labels were checked where they were read, naming it; this holds for
        # settings built in code too.
        labels=hello_labels(settings.labels or {}, "--label"),
        # Each source's address was checked where it was read too, naming it.
        address=hello_address(settings.address, "--address"),
        port_range=(
            DEFAULT_PORT_RANGE
            if settings.port_range is None
            else parse_port_range(settings.port_range)
        ),
        log_level=log_level,
        reconnect_max_delay_s=settings.reconnect_max_delay or DEFAULT_RECONNECT_MAX_DELAY_S,
        connect_timeout_s=settings.connect_timeout or DEFAULT_CONNECT_TIMEOUT_S,
        open_timeout_s=settings.open_timeout or DEFAULT_OPEN_TIMEOUT_S,
        next_server_after_s=settings.next_server_after or DEFAULT_NEXT_SERVER_AFTER_S,
        engines_on_exit=parse_engines_on_exit(settings.engines_on_exit or "keep"),
        liveness=Liveness(
            interval_s=DEFAULT_LIVENESS.interval_s if interval_s is None else interval_s,
            failures=failures or DEFAULT_LIVENESS.failures,
        ),
    )


def _flag(field: str) -> str:
    return "--server" if field == "servers" else f"--{field.replace('_', '-')}"


def check_values(settings: AgentSettings, where: Callable[[str], str]) -> AgentSettings:
    """``settings`` if no value they set is one the agent cannot use; else the error names
    where the value was given, ``where(field)``: the flag, the environment variable, or the
    config file and its key (a value from the file is no flag the operator typed)."""
    for server in settings.servers or ():
        parse_server(server, where("servers"))
    for field in ("cert", "key", "ca"):
        path = getattr(settings, field)
        if path is not None and (problem := not_a_file(path)) is not None:
            raise ConfigError(f"{where(field)} {path}: {problem}")
    if settings.node_id is not None and settings.node_id.strip():
        try:
            check_subject_name("node id", settings.node_id.strip())
        except InvalidRequest as exc:
            raise ConfigError(f"{where('node_id')}: {exc}") from exc
    if settings.fake_gpus is not None:
        try:
            parse_fake_gpus(settings.fake_gpus)
        except ValueError as exc:
            raise ConfigError(f"{where('fake_gpus')}: {exc}") from exc
    log_level = settings.log_level
    if log_level is not None and log_level.lower() not in LOG_LEVELS:
        raise ConfigError(
            f"{where('log_level')} {log_level!r}: expected one of {', '.join(LOG_LEVELS)}"
        )
    for field in ("reconnect_max_delay", "connect_timeout", "open_timeout", "next_server_after"):
        seconds = getattr(settings, field)
        # inf too: a delay that never ends, or a dial that never times out, would leave
        # the agent waiting for ever on one dead server.
        if seconds is not None and not 0 < seconds < math.inf:
            raise ConfigError(f"{where(field)} {seconds}: expected a positive number of seconds")
    interval_s = settings.liveness_interval
    if interval_s is not None and not (0 <= interval_s < math.inf):
        raise ConfigError(
            f"{where('liveness_interval')} {interval_s}: expected a number of seconds, "
            "0 for no checks"
        )
    failures = settings.liveness_failures
    if failures is not None and failures < 1:
        raise ConfigError(f"{where('liveness_failures')} {failures}: expected at least 1")
    if settings.port_range is not None:
        parse_port_range(settings.port_range, where("port_range"))
    if settings.engines_on_exit is not None:
        parse_engines_on_exit(settings.engines_on_exit, where("engines_on_exit"))
    return settings


def default_state_dir(environ: Mapping[str, str], *, is_root: bool | None = None) -> Path:
    """``/var/lib/llmgw-agent`` for root, else ``$XDG_STATE_HOME/llmgw-agent`` (by default
    ``~/.local/state/llmgw-agent``)."""
    if os.geteuid() == 0 if is_root is None else is_root:
        return Path("/var/lib/llmgw-agent")
    state_home = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "llmgw-agent"


def _existing_file(path: Path | None, flag: str, env: str, key: str) -> Path:
    if path is None:
        raise ConfigError(_missing(flag, env, key, "FILE"))
    if (problem := not_a_file(path)) is not None:
        raise ConfigError(f"{flag} {path}: {problem}")
    return path


def _required(value: str | None, flag: str, env: str, key: str) -> str:
    if value is None or not value.strip():
        raise ConfigError(_missing(flag, env, key, key.upper()))
    return value.strip()


def _missing(flag: str, env: str, key: str, example: str) -> str:
    return f"{flag} {example} is required (or {ENV_PREFIX}{env}, or {key!r} in the config file)"
