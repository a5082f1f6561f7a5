"""Engines' errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``.

Engines do not all answer errors that way: FastAPI-based servers write ``{"detail": ...}``,
older vLLM releases ``{"object": "error", "message", ..., "code": 400}``, others a bare
``{"message": ...}`` or plain text. ``engine_error`` rewrites whatever an engine sent into
the same shape, so a client sees one error format whichever engine served it, and
``stream_errors`` an error event inside a stream. The engine's ``type`` is kept
only where it is one of OpenAI's (vLLM's ``BadRequestError`` is not): else it is the
status's (``app.gateway.errors.type_for_status``), as the gateway's own errors have it.
What the client does not get of the engine's type and code is for the request's log line
(``EngineError.unrelayed``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from app.gateway.context_overflow import (
    CONTEXT_LENGTH_EXCEEDED,
    CONTEXT_LENGTH_PARAM,
    is_context_overflow,
)
from app.gateway.errors import TYPE_BY_STATUS, type_for_status
from wire.openai_error import ErrorBody, ErrorDetail

MAX_ENGINE_MESSAGE_CHARS = 2000
"""An engine's error text longer than this (an HTML error page, a traceback) is cut."""

_encode = msgspec.json.Encoder().encode


OPENAI_ERROR_TYPES = frozenset(
    {*TYPE_BY_STATUS.values(), "server_error", "insufficient_quota", "api_error"}
)
"""The ``type`` values OpenAI answers with, which its clients branch on. An engine's own
(vLLM's ``BadRequestError``, llama.cpp's ``exceed_context_size_error``) is none of them."""


class EngineError(msgspec.Struct, frozen=True):
    """An engine's error answer as the client gets it, and what of it the client does not."""

    body: bytes
    """In OpenAI's shape."""
    unrelayed: str | None = None
    """The engine's own ``type`` and ``code`` where they are not OpenAI's, for the request's
    log line (``type=BadRequestError code=400``); None when the client got all it said."""


def normalize_engine_error(status: int, body: bytes) -> bytes:
    """An engine's error ``body`` (any of the shapes engines use) in OpenAI's shape."""
    return engine_error(status, body).body


def engine_error(status: int, body: bytes) -> EngineError:
    """An engine's error ``body`` (any of the shapes engines use) in OpenAI's shape: its
    message, param and a string code kept, its type kept where it is one of OpenAI's and
    derived from ``status`` where it is not."""
    try:
        decoded: Any = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        decoded = None
    fields = _fields_of(decoded) if isinstance(decoded, dict) else None
    if fields is None:
        text = body.decode("utf-8", errors="replace").strip()
        detail = ErrorDetail(
            _shorten(text) or f"The engine answered HTTP {status} with no message.",
            type_for_status(status),
        )
        return EngineError(_encode(ErrorBody(detail)))
    message, kind, param, code = fields
    if isinstance(message, str):
        text = _shorten(message)
    else:
        text = "" if message is None else _shorten(_encode(message).decode())
    known = kind if isinstance(kind, str) and kind in OPENAI_ERROR_TYPES else None
    relayed_param = param if isinstance(param, str) else None
    # OpenAI's codes are strings; an integer code is an engine repeating the status.
    relayed_code = code if isinstance(code, str) else None
    if is_context_overflow(status, kind, text):
        relayed_param, relayed_code = CONTEXT_LENGTH_PARAM, CONTEXT_LENGTH_EXCEEDED
    detail = ErrorDetail(
        text or f"The engine answered HTTP {status} with no message.",
        known or type_for_status(status),
        relayed_param,
        relayed_code,
    )
    unrelayed = [
        f"{name}={_shorten_field(value)}"
        for name, value, relayed in (("type", kind, known), ("code", code, detail.code))
        if value not in (None, "") and value != relayed
    ]
    return EngineError(_encode(ErrorBody(detail)), " ".join(unrelayed) or None)


ERROR_MARK = b'"error"'
"""In every error event of a stream (``{"error": ...}``, or ``"object": "error"``), and in
few others: a stream's events are looked at only where their bytes hold it."""
_DATA = b"data:"


class StreamErrors(msgspec.Struct, frozen=True):
    """Whole events of a stream with its error events in OpenAI's shape, and what they said."""

    events: bytes
    unrelayed: str | None
    """What of their types and codes the client does not get, as ``EngineError``'s."""
    status: int | None
    """The highest status the error events name (an integer ``code``, else 500); None
    when there is none: how the stream counts against its replica."""


def stream_errors(events: bytes) -> StreamErrors:
    """Whole server-sent ``events`` of a stream, with the error in each error event in
    OpenAI's shape, as ``engine_error`` writes a whole answer's (by the status its integer
    code names, else 500); what of their types and codes the client does not get; and the
    status the error events name."""
    lines = events.splitlines(keepends=True)
    unrelayed: list[str] = []
    worst: int | None = None
    for index, line in enumerate(lines):
        if ERROR_MARK not in line or not line.startswith(_DATA):
            continue
        payload = line[len(_DATA) :]
        content = payload.strip()
        try:
            decoded: Any = msgspec.json.decode(content)
        except (msgspec.DecodeError, RecursionError):
            continue
        if not _is_error_event(decoded):
            continue
        code = decoded.get("code") if "error" not in decoded else None
        inner = decoded.get("error")
        if isinstance(inner, dict):
            code = inner.get("code")
        status = code if isinstance(code, int) and 400 <= code <= 599 else 500
        worst = status if worst is None else max(worst, status)
        error = engine_error(status, content)
        if error.unrelayed is not None:
            unrelayed.append(error.unrelayed)
        end = payload[len(payload.rstrip(b"\r\n")) :]
        lines[index] = _DATA + b" " + error.body + end
    return StreamErrors(b"".join(lines), "; ".join(unrelayed) or None, worst)


def _is_error_event(decoded: Any) -> bool:
    """An event that is an error, not a chunk (whose content may be the word "error")."""
    if not isinstance(decoded, dict) or "choices" in decoded:
        return False
    return isinstance(decoded.get("error"), (dict, str)) or decoded.get("object") == "error"


def _fields_of(decoded: dict[str, Any]) -> tuple[Any, Any, Any, Any] | None:
    """The message, type, param and code of an engine's error, as it wrote them; None for
    a JSON object that is none of the shapes engines use."""
    error = decoded.get("error")
    if isinstance(error, dict):
        # OpenAI's shape, or vLLM's newer one with an integer code.
        fields = error
    elif isinstance(error, str):
        # {"error": "...", "error_type": "..."} as text-generation-inference writes it.
        return error, decoded.get("error_type"), None, None
    elif "detail" in decoded:
        detail = decoded["detail"]
        return (detail if isinstance(detail, str) else _encode(detail).decode()), None, None, None
    elif "message" in decoded:
        fields = decoded
    else:
        return None
    return fields.get("message"), fields.get("type"), fields.get("param"), fields.get("code")


MAX_UNRELAYED_CHARS = 64
"""An engine's type or code is logged up to this many characters."""


def _shorten_field(value: object) -> str:
    text = value if isinstance(value, str) else _encode(value).decode()
    return text[:MAX_UNRELAYED_CHARS] + ("..." if len(text) > MAX_UNRELAYED_CHARS else "")


def _shorten(text: str) -> str:
    if len(text) <= MAX_ENGINE_MESSAGE_CHARS:
        return text
    return text[:MAX_ENGINE_MESSAGE_CHARS] + "..."
