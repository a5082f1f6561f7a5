"""The agent's settings one value at a time: each parser takes the text of one setting,
from a flag, an ``LLMGW_AGENT_*`` variable or the config file, and returns its value or a
``ConfigError`` naming where it was given (``source``) and what is expected.

A node's address and labels are checked as a hello carries them (``wire.messages``): a
hello beyond them is malformed, and the agent would be refused at every connection.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, NamedTuple, get_args
from urllib.parse import urlsplit

from app.regular_file import irregular_kind
from wire.messages import (
    CONTROL_CHARACTER,
    MAX_HOST_CHARS,
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
)

EnginesOnExit = Literal["keep", "stop"]
ENGINES_ON_EXIT: tuple[EnginesOnExit, ...] = get_args(EnginesOnExit)

_LABEL_KEY = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._/-]{{0,{MAX_LABEL_KEY_CHARS - 1}}}")
_PORT_RANGE = re.compile(r"(\d+)\s*-\s*(\d+)")


class ConfigError(ValueError):
    """The settings are missing something or hold a value that cannot work."""


class ServerAddress(NamedTuple):
    uri: str
    host: str
    port: int


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
    return hello_labels(labels, source)


def hello_address(address: str | None, source: str) -> str | None:
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


def hello_labels(labels: Mapping[str, str], source: str) -> dict[str, str]:
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


def not_a_file(path: Path) -> str | None:
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
