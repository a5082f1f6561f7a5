"""Where llmgw-cli finds the admin API and the credentials to call it.

Each setting comes from the first place that has it: a flag, an environment variable,
the config file (``$LLMGW_CONFIG``, else ``$XDG_CONFIG_HOME/llmgw/cli.toml``, else
``~/.config/llmgw/cli.toml``), then the default. A setting given empty (the admin API URL,
the token, a certificate or key), in any of them, is refused (exit code 2) naming where,
rather than taken for one not given; one not given at all is the default. The admin API
URL is where the server is and nothing more: one holding a user or password (repeated in
no message), a query or a fragment is refused the same way; so is, for an https URL, a
certificate, key or CA path that is no file this process can read. The file is TOML
(UTF-8, at most 64 KiB) with top-level keys::

    admin_url = "https://llmgw.internal:8081"
    token = "..."                              # prefer LLMGW_ADMIN_TOKEN
    client_cert = "operator-alice.crt"         # relative paths are relative to the file
    client_key = "operator-alice.key"
    ca_cert = "ca.crt"
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from cyclopts import Parameter

from app.pki.limits import MAX_PEM_FILE_BYTES
from app.regular_file import FileMissing, FileRefused, irregular_kind, read_file_or_pipe
from cli.render import warn

DEFAULT_ADMIN_URL = "http://127.0.0.1:8081"
CONFIG_ENV = "LLMGW_CONFIG"
MAX_CONFIG_BYTES = 64 * 1024
"""The most of a config file read: it holds five settings. A device such as /dev/zero, or
a file grown by mistake, would otherwise be read into memory whole; a pipe (``<(...)``)
is still read as a file, and a named pipe nothing writes to is refused, not waited on."""

SETTING_ENV = {
    "admin_url": "LLMGW_ADMIN_URL",
    "token": "LLMGW_ADMIN_TOKEN",
    "client_cert": "LLMGW_ADMIN_CERT",
    "client_key": "LLMGW_ADMIN_KEY",
    "ca_cert": "LLMGW_ADMIN_CA",
}
FORMER_SETTING_ENV = {
    "client_cert": "LLMGW_CLIENT_CERT",
    "client_key": "LLMGW_CLIENT_KEY",
    "ca_cert": "LLMGW_CA_CERT",
}
"""Names these settings had before; still read, after the current ones."""
_PATH_SETTINGS = ("client_cert", "client_key", "ca_cert")
_SETTING_FLAGS = {
    "token": "--token",
    "client_cert": "--client-cert",
    "client_key": "--client-key",
    "ca_cert": "--ca-cert",
}
_SETTING_NAMES = {
    "token": "the admin token",
    "client_cert": "the operator certificate's path",
    "client_key": "its private key's path",
    "ca_cert": "the llmgw CA certificate's path",
}
"""What each credential setting is, as a refusal of an empty one names it."""
_SETTING_FILES = {
    "client_cert": "the operator certificate",
    "client_key": "the operator certificate's key",
    "ca_cert": "the llmgw CA certificate",
}
"""What each file setting holds, as a refusal of one that cannot be read names it."""


MAX_GIVEN_KEY_CHARS = 120
"""The longest --idempotency-key: the admin API takes 128 characters, and the key of a
command's later changes carries a suffix (``.2``)."""
GIVEN_KEY = re.compile(rf"[A-Za-z0-9._:+/=-]{{1,{MAX_GIVEN_KEY_CHARS}}}")
"""An --idempotency-key as the admin API takes one (docs/admin-api.md#sending-a-change-again)."""


class ConfigError(Exception):
    """The configuration cannot be used as given (a usage error: exit code 2)."""


@Parameter(name="*", group="Connection")
@dataclass(frozen=True)
class ConnectionFlags:
    """The connection flags every command that calls the admin API takes."""

    admin_url: Annotated[
        str | None,
        Parameter(
            name="--admin-url",
            help="Admin API URL; an empty one is refused, wherever it is given. [default: "
            f"$LLMGW_ADMIN_URL, else admin_url in the config file, else {DEFAULT_ADMIN_URL}]",
        ),
    ] = None
    token: Annotated[
        str | None,
        Parameter(
            name="--token",
            help="Admin token (visible to other local users in the process list: prefer "
            "$LLMGW_ADMIN_TOKEN); an empty one is refused, wherever it is given.",
        ),
    ] = None
    client_cert: Annotated[
        str | None,
        Parameter(
            name="--client-cert",
            metavar="PATH",
            help="Operator certificate for https (`llmgw-cli cert operator <name>`); an "
            "empty path, here or for the key or CA, is refused wherever it is given. "
            "[$LLMGW_ADMIN_CERT]",
        ),
    ] = None
    client_key: Annotated[
        str | None,
        Parameter(name="--client-key", metavar="PATH", help="Its private key. [$LLMGW_ADMIN_KEY]"),
    ] = None
    ca_cert: Annotated[
        str | None,
        Parameter(
            name="--ca-cert",
            metavar="PATH",
            help="The llmgw CA that issued the server's certificate. [$LLMGW_ADMIN_CA]",
        ),
    ] = None
    idempotency_key: Annotated[
        str | None,
        Parameter(
            name="--idempotency-key",
            metavar="KEY",
            help="Send the command's change with this Idempotency-Key (its second change, if "
            "any, with KEY.2, and so on), so that running the same command again with it is "
            "carried out once: for a script that retries across runs. 1 to "
            f"{MAX_GIVEN_KEY_CHARS} letters, digits and . _ : + / = - (a UUID will do); "
            "reads ignore it. [default: a new key for each change]",
        ),
    ] = None


@dataclass(frozen=True)
class ConnectionSettings:
    admin_url: str
    token: str | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    ca_cert: Path | None = None
    config_file: Path | None = None
    """The config file consulted (whether it exists or not); advice names it."""
    idempotency_key: str | None = None
    """The key of the command's first change (``--idempotency-key``); None: a new one each."""


def resolve_settings(
    flags: ConnectionFlags, environ: Mapping[str, str] = os.environ
) -> ConnectionSettings:
    """The settings to connect with: flags, then environment, then config file, then
    defaults. Raises ConfigError for an unreadable or malformed config file."""
    config_file = config_path(environ)
    from_file = read_config_file(config_file, required=CONFIG_ENV in environ)

    def pick(name: str) -> str | None:
        given = _given_credential(name, flags, environ, from_file, config_file)
        return None if given is None else given[0]

    def pick_path(name: str) -> Path | None:
        given = _given_credential(name, flags, environ, from_file, config_file)
        if given is None:
            return None
        path = Path(given[0]).expanduser()
        if https:
            _check_readable_file(path, _SETTING_FILES[name], given[1])
        return path

    given, source = _given_admin_url(flags, environ, from_file, config_file)
    https = given.startswith("https://")
    # Checked as given: with its slashes stripped first, "http://" would be refused as
    # not starting with http://.
    if not given.startswith(("http://", "https://")):
        raise ConfigError(
            "the admin API URL must start with http:// or https://, not "
            f"{without_credentials(given)!r} (from {source})"
        )
    _check_host_and_port(given, source)
    _check_address_alone(given, source)
    token = _given_credential("token", flags, environ, from_file, config_file)
    if token is not None and token[1] == f"token in {config_file}":
        _warn_if_others_read(config_file)
    return ConnectionSettings(
        admin_url=given.rstrip("/"),
        token=None if token is None else token[0],
        client_cert=pick_path("client_cert"),
        client_key=pick_path("client_key"),
        ca_cert=pick_path("ca_cert"),
        config_file=config_file,
        idempotency_key=_given_key(flags.idempotency_key),
    )


def _given_key(key: str | None) -> str | None:
    """``--idempotency-key`` once checked; a ConfigError naming the flag for one the admin
    API would refuse, before anything is sent."""
    if key is None or GIVEN_KEY.fullmatch(key):
        return key
    raise ConfigError(
        f"--idempotency-key must be 1 to {MAX_GIVEN_KEY_CHARS} letters, digits and "
        f". _ : + / = - (a UUID will do); got {len(key)} character(s)"
    )


def _given_admin_url(
    flags: ConnectionFlags,
    environ: Mapping[str, str],
    from_file: Mapping[str, str],
    config_file: Path,
) -> tuple[str, str]:
    """The admin API URL from the first place that gives one, and that place: the flag,
    the environment, the config file, else the default. An environment variable that is
    not set gives none."""
    env = SETTING_ENV["admin_url"]
    given = _first_given(
        (
            (flags.admin_url, "--admin-url", "leave the flag out"),
            (environ.get(env), f"${env}", "unset it"),
            (from_file.get("admin_url"), f"admin_url in {config_file}", "leave it out of the file"),
        ),
        "the admin API URL, like https://llmgw.internal:8081",
    )
    return given or (DEFAULT_ADMIN_URL, "the default")


def _warn_if_others_read(config_file: Path) -> None:
    """A warning when the config file the admin token was read from is readable by other
    users than its owner: the token acts as its operator. Not a refusal, as ssh's for a
    key would be: a file shared by a team's group on purpose keeps working."""
    try:
        mode = config_file.stat().st_mode & 0o777
    except OSError:
        return  # it was read just now; a file gone since has nothing left to warn about
    if mode & 0o077:
        warn(
            f"warning: {config_file} holds the admin token and other users can read it "
            f"(mode {mode:04o}): chmod 600 {config_file}, or give the token in "
            f"${SETTING_ENV['token']}"
        )


def _given_credential(
    name: str,
    flags: ConnectionFlags,
    environ: Mapping[str, str],
    from_file: Mapping[str, str],
    config_file: Path,
) -> tuple[str, str] | None:
    """The token, certificate or key setting ``name`` from the first place that gives
    one, with that place: the flag, the environment (the current name, then the former
    one), the config file; else None."""
    env = SETTING_ENV[name]
    former = FORMER_SETTING_ENV.get(name)
    given = _first_given(
        (
            (getattr(flags, name), _SETTING_FLAGS[name], "leave the flag out"),
            (environ.get(env), f"${env}", "unset it"),
            (environ.get(former) if former else None, f"${former}", "unset it"),
            (from_file.get(name), f"{name} in {config_file}", "leave it out of the file"),
        ),
        _SETTING_NAMES[name],
    )
    return given


def _first_given(
    places: Sequence[tuple[str | None, str, str]], wanted: str
) -> tuple[str, str] | None:
    """The first value given among ``places`` (value, where, how not to give it) with its
    place; None when none gives one. One given empty (or blank) is a ``ConfigError``: the
    operator meant some value, and taken for none it would end in the default, or in a
    refusal that names no place."""
    for value, source, otherwise in places:
        if value is None:
            continue
        if not value.strip():
            raise ConfigError(f"{source} is empty: give {wanted}, or {otherwise}")
        return str(value), source
    return None


def _check_readable_file(path: Path, what: str, source: str) -> None:
    """A ``ConfigError`` when ``path``, ``what`` as ``source`` gave it, is no file this
    process can read: a path mistyped is bad usage, as ``llmgw-server`` and
    ``llmgw-agent`` take a missing certificate, not a connection that failed."""
    if not path.exists():
        problem = "does not exist"
    elif not path.is_file():
        kind = irregular_kind(path.stat().st_mode)
        problem = f"is not a regular file but {kind}" if kind else "is not a regular file"
    elif not os.access(path, os.R_OK):
        problem = "cannot be read"
    elif (size := path.stat().st_size) > MAX_PEM_FILE_BYTES:
        # Refused here, as bad usage, rather than later by TLS set-up as a failure.
        problem = f"is {size:,} bytes, over the {MAX_PEM_FILE_BYTES // 1024} KiB it may hold"
    else:
        return
    raise ConfigError(f"{what} {path} (from {source}) {problem}")


def _check_host_and_port(admin_url: str, source: str) -> None:
    """A ``ConfigError`` when ``admin_url`` names no host, or a port that is not a number
    from 0 to 65535: a typo that no connection could follow."""
    try:
        parts = urlsplit(admin_url)
        parts.port  # noqa: B018 (reading it checks it)
    except ValueError:
        parts = None
    if parts is None or not parts.hostname:
        raise ConfigError(
            f"the admin API URL needs a host and port like https://llmgw.internal:8081, not "
            f"{without_credentials(admin_url)!r} (from {source})"
        )


def _check_address_alone(admin_url: str, source: str) -> None:
    """A ``ConfigError`` when ``admin_url`` holds more than where the admin API is: a user
    and password (which would be written out in every message naming the URL, and which
    the admin API never reads: it takes a token), a query or a fragment (which every
    request's path would be appended after, so no request would reach the API)."""
    parts = urlsplit(admin_url)
    shown = without_credentials(admin_url)
    if "@" in parts.netloc:
        raise ConfigError(
            f"the admin API URL must not hold a user or password ({shown!r}, from {source}): "
            f"give the token in ${SETTING_ENV['token']} (or --token, or token in the config "
            "file) and the URL as https://HOST:PORT"
        )
    if parts.query or parts.fragment or admin_url.endswith(("?", "#")):
        raise ConfigError(
            f"the admin API URL cannot have a query or fragment ({shown!r}, from {source}): "
            "give the server's address alone, like https://llmgw.internal:8081"
        )


_USER_INFO = re.compile(r"(?<=//)[^/?#]*@")


def without_credentials(url: str) -> str:
    """``url`` with any user and password in it written as ``***``: what a message may
    repeat of a URL given with them."""
    return _USER_INFO.sub("***@", url, count=1)


def config_path(environ: Mapping[str, str] = os.environ) -> Path:
    if explicit := environ.get(CONFIG_ENV):
        return Path(explicit).expanduser()
    config_home = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "llmgw" / "cli.toml"


def read_config_file(path: Path, *, required: bool) -> dict[str, str]:
    """The settings in ``path`` (paths made absolute); empty if it does not exist and was
    not asked for by name. At most ``MAX_CONFIG_BYTES`` of it are read."""
    try:
        content = read_file_or_pipe(path, MAX_CONFIG_BYTES)
    except FileMissing:
        if required:
            raise ConfigError(f"config file {path} (from ${CONFIG_ENV}) does not exist") from None
        return {}
    except FileRefused as exc:
        source = f" (from ${CONFIG_ENV})" if required else ""
        raise ConfigError(f"cannot read config file {path}{source}: {exc.reason}") from exc
    if len(content) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config file {path} is over {MAX_CONFIG_BYTES // 1024} KiB: a config file is a "
            "few lines"
        )
    try:
        document = tomllib.loads(content.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(document) - set(SETTING_ENV))
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown setting(s) {', '.join(unknown)}; "
            f"known: {', '.join(SETTING_ENV)}"
        )
    settings: dict[str, str] = {}
    for name, value in document.items():
        if not isinstance(value, str):
            raise ConfigError(f"config file {path}: {name} must be a string")
        if name in _PATH_SETTINGS and value.strip():  # an empty one is refused as given
            value = str(path.parent / Path(value).expanduser())
        settings[name] = value
    return settings
