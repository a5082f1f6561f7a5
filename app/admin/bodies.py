"""Request bodies of the admin API, checked before a handler sees them.

A body's size is bounded by the app (``MAX_BODY_BYTES``, 413 above it). ``check_body``, a
guard that runs after the caller's identity is known, then refuses:

- JSON nested deeper than ``MAX_BODY_DEPTH`` (400). No admin body nests more than a few
  levels, and what a body carries is kept in the log, where every later read of it would
  have to recurse as deep;
- a body that does not decode *strictly* into the type its handler declares (400 naming
  the field). Litestar converts bodies leniently, so ``{"grace_s": "10"}`` would become 10
  seconds; a string where a number belongs is a mistake to report, not to guess at;
- a body of nothing or of whitespace where the handler needs one, and a body of whitespace
  where it may have none (400 saying a JSON object is wanted);
- a JSON object that holds one key twice (400 naming the key). Decoders keep the last one
  silently, so ``{"replicas": 0, "replicas": 20}`` would mean whatever the reader of it
  keeps, and a proxy that checked the first would have passed another request.

A request that takes no body declares ``NoBody`` as its ``data``: nothing or ``{}`` is
read as no body, and a field sent to it is refused as any unknown field is, rather than
ignored (``{"grace_s": 60}`` to a replica's drain, which has none). A ``DELETE`` is checked
so too: ``{"revoke_certificates": true}`` sent to a model's removal would otherwise remove
the model while the caller believed it had asked for something more.

Model specs are read by their handlers (``app.admin.models``), strictly too; they get the
depth check here all the same.

Before any of that, ``app.admin.middleware`` drops the UTF-8 byte order mark a body may
start with, so that every reader of it sees the JSON alone.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import ValidationException
from litestar.handlers.base import BaseRouteHandler

MAX_BODY_BYTES = 1024 * 1024
"""The largest request body the admin API reads; a spec is bounded far lower."""
MAX_BODY_DEPTH = 32
"""Arrays and objects inside each other; a spec nests three levels, a bench summary a few."""

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_OPENING = bytes.maketrans(b"[{]}", b"[[]]")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_MSGSPEC_PATH = re.compile(r"^(?P<reason>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?$")


class NoBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of a request that takes none: nothing, or ``{}``."""


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> None:
    if len(pairs) > 1 and len({key for key, _ in pairs}) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)


def duplicated_key(body: bytes) -> str | None:
    """A key that some object of the JSON in ``body`` holds twice, if any. ``body`` is JSON
    a strict decoder read already, at most ``MAX_BODY_DEPTH`` deep; objects are not kept."""
    try:
        json.loads(body, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as duplicate:
        return duplicate.key
    return None


def twice_reason(key: str) -> str:
    """What is wrong with an object holding ``key`` twice."""
    return f"holds the key {key!r} twice in one object: which one is meant is not clear"


def nested_deeper_than(body: bytes, limit: int) -> bool:
    """Whether the JSON in ``body`` nests arrays and objects more than ``limit`` deep."""
    # Depth never exceeds the number of opening brackets: most bodies stop here.
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    brackets = _STRINGS.sub(b"", body).translate(_OPENING, _NOT_BRACKETS)
    depth = 0
    for bracket in brackets:
        if bracket == 0x5B:  # [
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def blank_body(body: bytes, *, optional: bool) -> str:
    """What is wrong with a body of nothing or of whitespace only (``must be ...``)."""
    wanted = "a JSON object, or nothing" if optional else "a JSON object"
    held = "only whitespace" if body else "nothing"
    return f"must be {wanted}; it holds {held}"


async def check_body(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Guard: the body is shallow enough and, where the handler declares ``data``, of
    exactly that type."""
    if not isinstance(connection, Request) or connection.method not in _BODY_METHODS:
        return
    body = await connection.body()
    if nested_deeper_than(body, MAX_BODY_DEPTH):
        raise ValidationException(
            f"the request body nests arrays and objects more than {MAX_BODY_DEPTH} levels deep"
        )
    data = handler.parsed_fn_signature.parameters.get("data")
    if data is None or (body == b"" and data.has_default):
        return
    if not body.strip():
        # Litestar's own words for these are "'data'" and "Input data was truncated".
        raise ValidationException(f"the request body {blank_body(body, optional=data.has_default)}")
    try:
        msgspec.json.decode(body, type=data.annotation, strict=True)
    except msgspec.ValidationError as exc:
        parsed = _MSGSPEC_PATH.match(str(exc))
        field = (parsed["path"] if parsed else "") or "(body)"
        reason = parsed["reason"] if parsed else str(exc)
        raise ValidationException(
            f"{field}: {reason}",
            extra=[{"key": field, "message": reason, "source": "body"}],
        ) from exc
    except msgspec.DecodeError as exc:
        raise ValidationException(f"the request body is not valid JSON: {exc}") from exc
    twice = duplicated_key(body)
    if twice is not None:
        reason = twice_reason(twice)
        raise ValidationException(
            f"the request body {reason}",
            extra=[{"key": "(body)", "message": reason, "source": "body"}],
        )
