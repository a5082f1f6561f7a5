"""The agent's settings: command-line flags over ``LLMGW_AGENT_*`` variables over a TOML file
over defaults.

Each source is read into ``AgentSettings``, where None means "not set here"; ``merge`` takes
each field from the first source that sets it (lists and tables are replaced whole, never
combined), and ``resolve`` checks the result and fills in the defaults. Every problem is a
``ConfigError`` whose text names the setting and says what is expected.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, NamedTuple, TypeVar, get_args
from urllib.parse import urlsplit

import msgspec
from cyclopts import Token
from msgspec import UNSET
from msgspec import UnsetType as Unset

from agent.engines.readiness import DEFAULT_LIVENESS, Liveness
from agent.gpus import parse_fake_gpus
from app.pki.errors import InvalidRequest
from app.pki.names import check_subject_name
from app.regular_file import FileMissing, FileRefused, irregular_kind, read_regular_text
from app.usage_words import finite_number, whole_number
from wire.messages import (
    CONTROL_CHARACTER,
    MAX_HOST_CHARS,
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
)

ENV_PREFIX = "LLMGW_AGENT_"
CONFIG_ENV = f"{ENV_PREFIX}CONFIG"
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
MAX_CONFIG_BYTES = 64 * 1024
"""The most of a config file read: it holds a score of settings. A device such as /dev/zero,
or a file grown by mistake, would otherwise be read into memory whole."""
LOG_LEVELS = ("debug", "info", "warning", "error")
EnginesOnExit = Literal["keep", "stop"]
ENGINES_ON_EXIT: tuple[EnginesOnExit, ...] = get_args(EnginesOnExit)

T = TypeVar("T")

_LABEL_KEY = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._/-]{{0,{MAX_LABEL_KEY_CHARS - 1}}}")
_PORT_RANGE = re.compile(r"(\d+)\s*-\s*(\d+)")


class ConfigError(ValueError):
    """The settings are missing something or hold a value that cannot work."""


class FlagRefused(ValueError):
    """A flag's value refused by its converter. The usage error line names the flag and
    follows it with this message: ``llmgw-agent: --state-dir cannot be empty``."""


class ServerAddress(NamedTuple):
    uri: str
    host: str
    port: int


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


class _FileSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The config file as written: paths are still text, a single server may be a string
    and the port range a ``[lo, hi]`` pair."""

    servers: str | tuple[str, ...] | Unset = UNSET
    node_id: str | Unset = UNSET
    cert: str | Unset = UNSET
    key: str | Unset = UNSET
    ca: str | Unset = UNSET
    fake_gpus: str | Unset = UNSET
    state_dir: str | Unset = UNSET
    labels: dict[str, str] | Unset = UNSET
    address: str | Unset = UNSET
    port_range: str | tuple[int, int] | Unset = UNSET
    log_level: str | Unset = UNSET
    reconnect_max_delay: float | Unset = UNSET
    connect_timeout: float | Unset = UNSET
    open_timeout: float | Unset = UNSET
    next_server_after: float | Unset = UNSET
    engines_on_exit: str | Unset = UNSET
    liveness_interval: float | Unset = UNSET
    liveness_failures: int | Unset = UNSET


def fake_gpu_health_file(state_dir: Path) -> Path:
    """Where ``llmgw-agent fake-gpu mark`` writes and the running agent reads."""
    return state_dir / FAKE_GPU_HEALTH_FILE


def load_config(
    flags: AgentSettings, environ: Mapping[str, str], config_file: Path | None = None
) -> AgentConfig:
    """Flags over the environment over the config file (``config_file``, else
    ``$LLMGW_AGENT_CONFIG``) over defaults."""
    named = environ.get(CONFIG_ENV)
    if config_file is None and named is not None and not named.strip():
        # Path("") is the current directory: say what is wrong rather than refuse ".".
        raise ConfigError(f"{CONFIG_ENV} is empty: give the config file, or unset it")
    path = config_file or _path_or_none(named)
    from_file = settings_from_file(path) if path is not None else AgentSettings()
    return resolve(merge(flags, settings_from_env(environ), from_file), environ)


def settings_from_env(environ: Mapping[str, str]) -> AgentSettings:
    """The settings the ``LLMGW_AGENT_*`` variables give. One set empty or blank is refused
    naming it (``filled_variable``), never taken for unset."""

    def get(name: str) -> str | None:
        return filled_variable(environ, f"{ENV_PREFIX}{name}")

    def parsed(name: str, parse: Callable[[str, str], T]) -> T | None:
        value = get(name)
        return None if value is None else parse(value, f"{ENV_PREFIX}{name}")

    servers = get("SERVERS")
    labels = get("LABELS")
    from_env = AgentSettings(
        servers=None if servers is None else tuple(re.split(r"[\s,]+", servers)),
        node_id=get("NODE_ID"),
        cert=_path_or_none(get("CERT")),
        key=_path_or_none(get("KEY")),
        ca=_path_or_none(get("CA")),
        fake_gpus=get("FAKE_GPUS"),
        state_dir=_path_or_none(get("STATE_DIR")),
        labels=None if labels is None else parse_labels(labels.split(","), f"{ENV_PREFIX}LABELS"),
        address=_address(get("ADDRESS"), f"{ENV_PREFIX}ADDRESS"),
        port_range=get("PORT_RANGE"),
        log_level=get("LOG_LEVEL"),
        reconnect_max_delay=parsed("RECONNECT_MAX_DELAY", _seconds),
        connect_timeout=parsed("CONNECT_TIMEOUT", _seconds),
        open_timeout=parsed("OPEN_TIMEOUT", _seconds),
        next_server_after=parsed("NEXT_SERVER_AFTER", _seconds),
        engines_on_exit=get("ENGINES_ON_EXIT"),
        liveness_interval=parsed("LIVENESS_INTERVAL", _seconds),
        liveness_failures=parsed("LIVENESS_FAILURES", _count),
    )
    return _check_values(from_env, lambda field: f"{ENV_PREFIX}{field.upper()}")


def filled_variable(environ: Mapping[str, str], variable: str) -> str | None:
    """``variable``'s value, stripped; None when it is not set. Set empty or blank, it is a
    ``ConfigError`` naming it: a deployment manifest that left a value out (``NODE_ID=``,
    ``STATE_DIR=$UNSET``) would otherwise pass for one that never set it, and the agent
    would run with another node id, state directory or GPU source than the one meant."""
    value = environ.get(variable)
    if value is None:
        return None
    if not value.strip():
        raise ConfigError(f"{variable} is empty: give a value, or unset it")
    return value.strip()


def settings_from_file(path: Path) -> AgentSettings:
    """The settings in a TOML file (a regular file of UTF-8 text, at most
    ``MAX_CONFIG_BYTES``); relative paths in it are read from the file's folder."""
    try:
        document = tomllib.loads(read_regular_text(path, MAX_CONFIG_BYTES))
    except FileMissing as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.reason}") from exc
    except FileRefused as exc:
        raise ConfigError(f"config file {path} is refused: {exc.reason}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    try:
        read = msgspec.convert(document, _FileSettings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    for key in ("cert", "key", "ca", "state_dir"):
        value = getattr(read, key)
        if isinstance(value, str) and not value.strip():
            # Read from the file's folder, an empty path would be that folder.
            raise ConfigError(f"config file {path}: {key} is empty: give a path, or leave it out")
    base = path.parent
    from_file = AgentSettings(
        servers=_server_list(read.servers),
        node_id=_given(read.node_id),
        cert=_under(base, _given(read.cert)),
        key=_under(base, _given(read.key)),
        ca=_under(base, _given(read.ca)),
        fake_gpus=_given(read.fake_gpus),
        state_dir=_under(base, _given(read.state_dir)),
        labels=_file_labels(read.labels, path),
        address=_address(_given(read.address), f"config file {path}: address"),
        port_range=_port_range_text(read.port_range),
        log_level=_given(read.log_level),
        reconnect_max_delay=_given(read.reconnect_max_delay),
        connect_timeout=_given(read.connect_timeout),
        open_timeout=_given(read.open_timeout),
        next_server_after=_given(read.next_server_after),
        engines_on_exit=_given(read.engines_on_exit),
        liveness_interval=_given(read.liveness_interval),
        liveness_failures=_given(read.liveness_failures),
    )
    return _check_values(from_file, lambda field: f"config file {path}: {field}")


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
    _check_values(settings, _flag)
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
        labels=_hello_labels(settings.labels or {}, "--label"),
        # Each source's address was checked where it was read too, naming it.
        address=_address(settings.address, "--address"),
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


def _check_values(settings: AgentSettings, where: Callable[[str], str]) -> AgentSettings:
    """``settings`` if no value they set is one the agent cannot use; else the error names
    where the value was given, ``where(field)``: the flag, the environment variable, or the
    config file and its key (a value from the file is no flag the operator typed)."""
    for server in settings.servers or ():
        parse_server(server, where("servers"))
    for field in ("cert", "key", "ca"):
        path = getattr(settings, field)
        if path is not None and (problem := _not_a_file(path)) is not None:
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


def parse_server(text: str, source: str = "--server") -> ServerAddress:
    """``wss://HOST[:PORT][/PATH]``; the port defaults to 443. ``source`` names where the
    text was given, for the error."""
    parts = urlsplit(text.strip())
    if parts.scheme != "wss":
        raise ConfigError(
            f"{source} {text!r}: expected wss://HOST:PORT (the agent channel always uses TLS)"
        )
    try:
        port = parts.port or 443
    except ValueError as exc:
        raise ConfigError(f"{source} {text!r}: {exc}") from exc
    if not parts.hostname:
        raise ConfigError(f"{source} {text!r}: no host; expected wss://HOST:PORT")
    if parts.query or parts.fragment or parts.username:
        raise ConfigError(f"{source} {text!r}: expected wss://HOST:PORT[/PATH] and nothing else")
    return ServerAddress(uri=text.strip(), host=parts.hostname, port=port)


def parse_engines_on_exit(text: str, source: str = "--engines-on-exit") -> EnginesOnExit:
    """``keep`` or ``stop``; an error names ``source``, where the text was given."""
    for choice in ENGINES_ON_EXIT:
        if text.strip().lower() == choice:
            return choice
    raise ConfigError(
        f"{source} {text!r}: expected {' or '.join(ENGINES_ON_EXIT)} (keep: engines "
        "run on while the agent is away, as for an upgrade; stop: stop them and report it)"
    )


def parse_port_range(text: str, source: str = "--port-range") -> tuple[int, int]:
    """``LO-HI``, both 1-65535 and LO <= HI; an error names ``source``, where the text was
    given."""
    match = _PORT_RANGE.fullmatch(text.strip())
    if match is None:
        raise ConfigError(f"{source} {text!r}: expected LO-HI, such as 20000-20999")
    low, high = int(match[1]), int(match[2])
    if not 1 <= low <= high <= 65535:
        raise ConfigError(
            f"{source} {text!r}: ports must be 1-65535 with the first no greater than the last"
        )
    return low, high


def parse_labels(items: Sequence[str], source: str = "--label") -> dict[str, str]:
    """``key=value`` items; a key may appear once."""
    labels: dict[str, str] = {}
    for item in items:
        key, equals, value = item.strip().partition("=")
        key = key.strip()
        if not equals or not _LABEL_KEY.fullmatch(key):
            raise ConfigError(
                f"{source} {item!r}: expected key=value, the key made of letters, digits, "
                "'.', '_', '/' or '-'"
            )
        if key in labels:
            raise ConfigError(f"{source}: label {key!r} is given twice")
        labels[key] = value.strip()
    return _hello_labels(labels, source)


def default_state_dir(environ: Mapping[str, str], *, is_root: bool | None = None) -> Path:
    """``/var/lib/llmgw-agent`` for root, else ``$XDG_STATE_HOME/llmgw-agent`` (by default
    ``~/.local/state/llmgw-agent``)."""
    if os.geteuid() == 0 if is_root is None else is_root:
        return Path("/var/lib/llmgw-agent")
    state_home = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "llmgw-agent"


def _address(address: str | None, source: str) -> str | None:
    """``address`` if a hello can carry it; ``source`` says where it was given: the flag,
    the environment variable, the config file's path and key."""
    if address is None:
        return None
    if not address.strip() or any(character.isspace() for character in address.strip()):
        raise ConfigError(f"{source} {address!r}: expected a host name or IP address")
    if len(address.strip()) > MAX_HOST_CHARS:
        raise ConfigError(
            f"{source} {address[:40]!r}...: {len(address.strip())} characters; a hello "
            f"carries at most {MAX_HOST_CHARS}, as a host name has"
        )
    return address.strip()


def _file_labels(labels: dict[str, str] | Unset, path: Path) -> dict[str, str] | None:
    """The config file's labels (a TOML table, not ``key=value`` items), checked as a hello
    needs them, an error naming the file and its ``labels`` key."""
    given = _given(labels)
    return None if given is None else _hello_labels(given, f"config file {path}: labels")


def _hello_labels(labels: Mapping[str, str], source: str) -> dict[str, str]:
    """``labels`` if a hello can carry them; a hello beyond them is malformed, and the agent
    would be refused at every connection. ``source`` says where they were given: a flag,
    an environment variable, the config file's path and key."""
    if len(labels) > MAX_LABELS:
        raise ConfigError(f"{source}: {len(labels)} labels; a node may have at most {MAX_LABELS}")
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(key):
            raise ConfigError(
                f"{source} {key[:80]!r}: a key is 1-{MAX_LABEL_KEY_CHARS} letters, digits, "
                "'.', '_', '/' or '-', starting with a letter or digit"
            )
        if len(value) > MAX_LABEL_VALUE_CHARS:
            raise ConfigError(
                f"{source} {key}: the value has {len(value)} characters; a label's value "
                f"has at most {MAX_LABEL_VALUE_CHARS}"
            )
        if CONTROL_CHARACTER.search(value):
            raise ConfigError(
                f"{source} {key}: the value {value[:80]!r} holds a control character; "
                "a label's value is one line of text"
            )
    return dict(labels)


def _existing_file(path: Path | None, flag: str, env: str, key: str) -> Path:
    if path is None:
        raise ConfigError(_missing(flag, env, key, "FILE"))
    if (problem := _not_a_file(path)) is not None:
        raise ConfigError(f"{flag} {path}: {problem}")
    return path


def _not_a_file(path: Path) -> str | None:
    """Why ``path`` is no file to load a certificate or key from, or None when it is one.
    Said as it is: "no such file" of a directory sends the operator looking for a typo in a
    path that exists."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return exc.strerror or str(exc)
    kind = irregular_kind(mode)
    return None if kind is None else f"not a regular file but {kind}"


def _required(value: str | None, flag: str, env: str, key: str) -> str:
    if value is None or not value.strip():
        raise ConfigError(_missing(flag, env, key, key.upper()))
    return value.strip()


def _missing(flag: str, env: str, key: str, example: str) -> str:
    return f"{flag} {example} is required (or {ENV_PREFIX}{env}, or {key!r} in the config file)"


def _server_list(servers: str | tuple[str, ...] | Unset) -> tuple[str, ...] | None:
    if isinstance(servers, Unset):
        return None
    return (servers,) if isinstance(servers, str) else servers


def _port_range_text(port_range: str | tuple[int, int] | Unset) -> str | None:
    if isinstance(port_range, Unset):
        return None
    return port_range if isinstance(port_range, str) else f"{port_range[0]}-{port_range[1]}"


def _seconds(text: str, source: str) -> float:
    """``text`` in decimal: ``float`` would take ``1_0`` for 10, non-ASCII digits for their
    value, and ``nan`` (``usage_words.finite_number``)."""
    seconds = finite_number(text)
    if seconds is None:
        raise ConfigError(f"{source} {text!r}: expected a number of seconds")
    return seconds


def _count(text: str, source: str) -> int:
    """``text`` in decimal digits: ``int`` would take ``1_0`` for 10 and non-ASCII digits
    for their value (``usage_words.whole_number``)."""
    count = whole_number(text)
    if count is None:
        raise ConfigError(f"{source} {text!r}: expected a whole number")
    return count


def filled_path(_type: object, tokens: Sequence[Token]) -> Path:
    """cyclopts' converter for a file or directory flag: never empty or blank. ``Path("")``
    is the current directory: ``--state-dir "$DIR"`` with the variable unset would otherwise
    keep the agent's records, and engine logs, wherever it was started."""
    if not tokens[0].value.strip():
        raise FlagRefused("cannot be empty")
    return Path(tokens[0].value)


_GPU_INDEX = re.compile(r"-?[0-9]{1,9}")


def gpu_index(_type: object, tokens: Sequence[Token]) -> int:
    """cyclopts' converter for a GPU index (``fake-gpu --gpu``): decimal digits, nothing
    else. cyclopts' own reading of an ``int`` rounds ``1.5`` to 2 and takes ``0x10`` for 16
    and ``1_0`` for 10: a mark on another GPU than the one meant. A negative one is left to
    the command, which says why it refuses it."""
    text = tokens[0].value.strip()
    if not _GPU_INDEX.fullmatch(text):
        raise FlagRefused(f"{tokens[0].value!r}: expected a GPU index, a whole number such as 3")
    return int(text)


def mebibytes(_type: object, tokens: Sequence[Token]) -> int:
    """cyclopts' converter for a size in MiB (``fake-gpu use --mib``): decimal digits,
    nothing else, for the reasons of ``gpu_index``. A negative one is left to the command."""
    text = tokens[0].value.strip()
    if not _GPU_INDEX.fullmatch(text):
        raise FlagRefused(f"{tokens[0].value!r}: expected MiB, a whole number such as 30000")
    return int(text)


def filled_paths(_type: object, tokens: Sequence[Token]) -> list[Path]:
    """``filled_path`` for a flag given several times."""
    for token in tokens:
        if not token.value.strip():
            raise FlagRefused("cannot be empty")
    return [Path(token.value) for token in tokens]


def _given(value: T | Unset) -> T | None:
    return None if isinstance(value, Unset) else value


def _path_or_none(text: str | None) -> Path | None:
    return None if text is None else Path(text).expanduser()


def _under(base: Path, path: str | None) -> Path | None:
    return None if path is None else base / Path(path).expanduser()
