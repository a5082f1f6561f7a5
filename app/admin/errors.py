"""The one table from exceptions to HTTP problem details (RFC 9457)."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import msgspec
import structlog
from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.status_codes import (
    HTTP_400_BAD_REQUEST,
    HTTP_404_NOT_FOUND,
    HTTP_409_CONFLICT,
    HTTP_422_UNPROCESSABLE_ENTITY,
    HTTP_500_INTERNAL_SERVER_ERROR,
    HTTP_503_SERVICE_UNAVAILABLE,
)
from litestar.types import ExceptionHandlersMap

from app.admin.middleware import requested_method, with_head
from app.domain.describe import describe
from app.domain.envelope import Recorded
from app.domain.idempotency import KeyReused, KeyShownOnce
from app.domain.keys import InvalidKey, UnknownKey
from app.domain.operation_results import (
    InvalidDrain,
    InvalidFields,
    InvalidOperation,
    InvalidSpec,
    InvalidText,
    NoRoomToDrain,
    UnknownDrain,
    UnknownModel,
    UnknownNode,
    UnknownReplica,
    UnknownThing,
)
from app.domain.replica_retention import InvalidCutoff
from app.domain.revocations import InvalidRevocation
from app.services.conflicts import ChangeConflict
from app.store.errors import (
    AppendOutcomeUnknown,
    ClockOff,
    ConcurrencyError,
    FencedError,
    StoreError,
    StoreUnavailable,
)

log = structlog.get_logger(__name__)

PROBLEM_TABLE: tuple[tuple[type[Exception], int, str], ...] = (
    (UnknownModel, HTTP_404_NOT_FOUND, "unknown-model"),
    (UnknownNode, HTTP_404_NOT_FOUND, "unknown-node"),
    (UnknownReplica, HTTP_404_NOT_FOUND, "unknown-replica"),
    (UnknownDrain, HTTP_404_NOT_FOUND, "unknown-drain"),
    (UnknownKey, HTTP_404_NOT_FOUND, "unknown-key"),
    (InvalidKey, HTTP_422_UNPROCESSABLE_ENTITY, "invalid-key"),
    (InvalidRevocation, HTTP_422_UNPROCESSABLE_ENTITY, "invalid-revocation"),
    (InvalidSpec, HTTP_422_UNPROCESSABLE_ENTITY, "invalid-spec"),
    (InvalidDrain, HTTP_422_UNPROCESSABLE_ENTITY, "invalid-drain"),
    (InvalidText, HTTP_422_UNPROCESSABLE_ENTITY, "invalid-text"),
    (NoRoomToDrain, HTTP_409_CONFLICT, "no-room-to-drain"),
    (KeyReused, HTTP_422_UNPROCESSABLE_ENTITY, "idempotency-key-reused"),
    (KeyShownOnce, HTTP_409_CONFLICT, "carried-out-already"),
    (InvalidOperation, HTTP_409_CONFLICT, "invalid-operation"),
    (InvalidCutoff, HTTP_400_BAD_REQUEST, "invalid-cutoff"),
    (ConcurrencyError, HTTP_409_CONFLICT, "conflict"),
    (FencedError, HTTP_503_SERVICE_UNAVAILABLE, "not-leader"),
    (ClockOff, HTTP_503_SERVICE_UNAVAILABLE, "clock-off"),
    (AppendOutcomeUnknown, HTTP_503_SERVICE_UNAVAILABLE, "outcome-unknown"),
    (StoreUnavailable, HTTP_503_SERVICE_UNAVAILABLE, "database-unavailable"),
    (StoreError, HTTP_500_INTERNAL_SERVER_ERROR, "store-error"),
)


PROBLEM_MEDIA_TYPE = "application/problem+json"
_LITESTAR_VALIDATION = "Validation failed for "
"""How Litestar begins the detail of a path or query parameter it could not convert."""


class FieldProblem(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong with a request, in a 400's ``errors``."""

    message: str
    key: str | msgspec.UnsetType = msgspec.UNSET
    """The field or parameter to blame (``replicas``, ``routing.weight``, ``limit``);
    ``(body)`` where no one field is."""
    source: str | msgspec.UnsetType = msgspec.UNSET
    """Where it was sent: ``body``, ``query``, ``path`` or ``header``."""


class ValidationProblem(msgspec.Struct, frozen=True, kw_only=True):
    """A 400 as ``problem`` writes it, for the OpenAPI schema to say
    (``app.admin.operation_schema``): a request of the wrong shape."""

    type: str
    title: str
    """What kind of 400: ``validation`` for a body, a parameter or a header of the wrong
    shape; docs/admin-api.md lists the others."""
    status: int
    detail: str
    errors: list[FieldProblem] | msgspec.UnsetType = msgspec.UNSET
    """Each field to blame, where one is."""


def _problem_document(status: int, kind: str, detail: str, **extra: Any) -> dict[str, Any]:
    """The problem details (RFC 9457) of an answer with ``status``, of the ``kind`` named."""
    return {
        "type": f"https://llmgw.dev/problems/{kind}",
        "title": kind,
        "status": status,
        "detail": detail,
        **extra,
    }


def problem(
    status: int,
    kind: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response[dict[str, Any]]:
    return Response(
        _problem_document(status, kind, detail, **extra),
        status_code=status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


def problem_body(status: int, detail: str) -> tuple[bytes, bytes]:
    """A problem document written before any request reached the app (a slow client cut
    off at the listener): its content type and body."""
    kind = HTTPStatus(status).phrase.lower().replace(" ", "-")
    document = _problem_document(status, kind, detail)
    return PROBLEM_MEDIA_TYPE.encode(), msgspec.json.encode(document)


def handle_http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[dict[str, Any]]:
    extra: dict[str, Any] = {}
    if isinstance(exc, ValidationException) and exc.extra:
        extra["errors"] = exc.extra
    headers = exc.headers
    if isinstance(exc, MethodNotAllowedException) and headers and "allow" in headers:
        headers = {**headers, "allow": with_head(headers["allow"])}
    return problem(exc.status_code, _slug(exc), _detail(request, exc, headers), headers, **extra)


def _detail(
    request: Request[Any, Any, Any], exc: HTTPException, headers: dict[str, str] | None
) -> str:
    """The exception's detail; the router's own (``Not Found``, ``Method Not Allowed``)
    replaced by one naming the path, and the methods it takes (as ``headers``' ``Allow``)."""
    raw_path: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    path = raw_path.decode("ascii", "backslashreplace")
    if isinstance(exc, MethodNotAllowedException):
        allowed = (headers or {}).get("allow", "")
        method = requested_method(request.scope)
        return f"{method} is not a method of {path}; it takes {allowed}"
    if isinstance(exc, NotFoundException) and exc.detail == HTTPStatus.NOT_FOUND.phrase:
        return f"no such path: {path}"
    if isinstance(exc, ValidationException) and exc.detail.startswith(_LITESTAR_VALIDATION):
        return _named_errors(exc) or exc.detail
    return exc.detail


def _named_errors(exc: ValidationException) -> str:
    """Litestar's detail for a path or query parameter of the wrong shape only repeats
    the request line (``Validation failed for GET /admin/v1/keys?limit=0``); each field
    and what is wrong with it (``limit: Expected `int` >= 1``) says what to change."""
    errors = exc.extra if isinstance(exc.extra, list) else []
    return "; ".join(
        f"{error['key']}: {error['message']}"
        for error in errors
        if isinstance(error, dict) and "key" in error and "message" in error
    )


def handle_domain(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    for kind, status, slug in PROBLEM_TABLE:
        if isinstance(exc, kind):
            return problem(status, slug, str(exc), **_details(exc))
    log.exception("admin_request_failed", error=str(exc))
    return problem(
        HTTP_500_INTERNAL_SERVER_ERROR, "internal-error", "internal error; see the server log"
    )


def _details(exc: Exception) -> dict[str, Any]:
    """What a client needs besides the message: every field of an invalid spec, the id of
    an unknown thing (its first 100 characters and "…" when longer, and then how long it
    was), each replica of a drain refused for want of room, the changes a conflicting request
    met."""
    match exc:
        case InvalidFields():
            return {"errors": [{"field": e.field, "reason": e.reason} for e in exc.errors]}
        case UnknownThing():
            shown = {"id": exc.shown_key}
            return shown if exc.shown_key == exc.key else {**shown, "id_length": len(exc.key)}
        case NoRoomToDrain():
            return {"room": [msgspec.to_builtins(r) for r in exc.room]}
        case ChangeConflict():
            return {"conflicts_with": [_change(r) for r in exc.met]}
        case KeyShownOnce():
            return {"key_id": exc.key_id}
    return {}


def _change(recorded: Recorded) -> dict[str, Any]:
    """A change a conflicting request met, as a history shows it, in brief."""
    return {
        "position": recorded.position,
        "stream": recorded.stream,
        "actor": recorded.meta.actor,
        "summary": describe(recorded.event),
    }


def _slug(exc: HTTPException) -> str:
    name = type(exc).__name__.removesuffix("Exception")
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in name).lstrip("-") or "error"


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    HTTPException: handle_http,
    Exception: handle_domain,
}
