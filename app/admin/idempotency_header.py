"""The ``Idempotency-Key`` header of a change (IETF httpapi draft "The Idempotency-Key HTTP
Header Field"): read, checked, and paired with what the request asks.

A change (POST, PUT, DELETE) may carry one key: a bad one, or two, is a 400 naming the
header, before anything is decided. What the key does is ``app.domain.idempotency``'s; a
request that only reads ignores it.

The OpenAPI schema declares the header (``SCHEMA_PARAMETER``) on the operations that read
it (``app.admin.operation_schema``).
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.exceptions import ValidationException
from litestar.openapi.spec import OpenAPIType, Parameter, Schema

from app.domain.idempotency import (
    KEY_CHARACTERS,
    MAX_KEY_CHARS,
    IdempotencyKey,
    key_problem,
    request_digest,
    unquoted,
)

HEADER = "idempotency-key"
CHANGING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CALLER_PARAMETER = "caller"
"""The handler parameter whose dependency (``app.admin.app.provide_caller``) reads the key."""

_KEY = f"{KEY_CHARACTERS}{{1,{MAX_KEY_CHARS}}}"
SCHEMA_PARAMETER = Parameter(
    name="Idempotency-Key",
    param_in="header",
    required=False,
    schema=Schema(
        type=OpenAPIType.STRING,
        pattern=f'^(?:{_KEY}|"{_KEY}")$',
        max_length=MAX_KEY_CHARS + 2,
    ),
    description=(
        f"A key of the client's (1 to {MAX_KEY_CHARS} letters, digits and . _ : + / = -, a "
        "UUID will do; bare or in double quotes), so that this change sent again with it is "
        "carried out once and answered as the first time; a key creation sent again is a "
        "409 carried-out-already naming the key. The same key with another request is a "
        "422 idempotency-key-reused; a malformed key, or the header twice, a 400. See "
        'docs/admin-api.md, "Sending a change again".'
    ),
)


async def idempotency_of(request: Request[Any, Any, Any]) -> IdempotencyKey | None:
    """The request's key and what it asks; None when it sent none or only reads. Raises
    ``ValidationException`` (400) for a key that is malformed or sent more than once."""
    if request.method not in CHANGING_METHODS:
        return None
    sent = request.headers.getall(HEADER, [])
    if not sent:
        return None
    if len(sent) > 1:
        raise ValidationException(
            "the Idempotency-Key header appears more than once: send one key per change"
        )
    problem = key_problem(sent[0])
    if problem is not None:
        raise ValidationException(f"the Idempotency-Key header {problem}; nothing was recorded")
    target = request.scope.get("raw_path") or request.scope["path"].encode()
    query = request.scope.get("query_string") or b""
    if query:
        target = target + b"?" + query
    body = await request.body()
    return IdempotencyKey(
        key=unquoted(sent[0]), request_digest=request_digest(request.method, target, body)
    )
