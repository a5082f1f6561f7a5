"""Where the agent's settings are read from: the ``LLMGW_AGENT_*`` variables and the TOML
config file, each into an ``AgentSettings`` whose values are checked naming the variable,
or the file and its key; ``load_config`` puts the flags over the variables over the file
and resolves them (``agent.config``).
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import msgspec
from msgspec import UNSET
from msgspec import UnsetType as Unset

from agent.config import ENV_PREFIX, AgentConfig, AgentSettings, check_values, merge, resolve
from agent.config_values import ConfigError, hello_address, hello_labels, parse_labels
from app.regular_file import FileMissing, FileRefused, read_regular_text
from app.usage_words import finite_number, whole_number

CONFIG_ENV = f"{ENV_PREFIX}CONFIG"
MAX_CONFIG_BYTES = 64 * 1024
"""The most of a config file read: it holds a score of settings. A device such as /dev/zero,
or a file grown by mistake, would otherwise be read into memory whole."""

T = TypeVar("T")


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
        address=hello_address(get("ADDRESS"), f"{ENV_PREFIX}ADDRESS"),
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
    return check_values(from_env, lambda field: f"{ENV_PREFIX}{field.upper()}")


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
    unknown = _unknown_key(document)
    if unknown is not None:
        raise ConfigError(f"config file {path}: {unknown}")
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
        address=hello_address(_given(read.address), f"config file {path}: address"),
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
    return check_values(from_file, lambda field: f"config file {path}: {field}")


def _file_labels(labels: dict[str, str] | Unset, path: Path) -> dict[str, str] | None:
    """The config file's labels (a TOML table, not ``key=value`` items), checked as a hello
    needs them, an error naming the file and its ``labels`` key."""
    given = _given(labels)
    return None if given is None else hello_labels(given, f"config file {path}: labels")


def _unknown_key(document: Mapping[str, object]) -> str | None:
    """What is wrong with the first key of ``document`` that is no setting, naming the
    setting it is likely a misspelling of (``node-id``, ``nodeid``: ``node_id``); None when
    every key is one."""
    keys = _FileSettings.__struct_fields__
    for key in document:
        if key in keys:
            continue
        meant = difflib.get_close_matches(key.lower().replace("-", "_"), keys, n=1)
        hint = f": did you mean `{meant[0]}`?" if meant else ""
        return f"unknown field `{key}`{hint} (the keys are in docs/agent.md, Settings)"
    return None


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


def _given(value: T | Unset) -> T | None:
    return None if isinstance(value, Unset) else value


def _path_or_none(text: str | None) -> Path | None:
    return None if text is None else Path(text).expanduser()


def _under(base: Path, path: str | None) -> Path | None:
    return None if path is None else base / Path(path).expanduser()
