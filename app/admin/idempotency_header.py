"""The ``Idempotency-Key`` header of a change (IETF httpapi draft "The Idempotency-Key HTTP
Header Field"): read, checked, and paired with what the request asks.

A change (POST, PUT, DELETE) may carry one key: a bad one, or two, is a 400 naming the
header, before anything is decided. What the key does is ``app.domain.idempotency``'s; a
request that only reads ignores it.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.exceptions import ValidationException

from app.domain.idempotency import IdempotencyKey, key_problem, request_digest, unquoted

HEADER = "idempotency-key"
_CHANGING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


async def idempotency_of(request: Request[Any, Any, Any]) -> IdempotencyKey | None:
    """The request's key and what it asks; None when it sent none or only reads. Raises
    ``ValidationException`` (400) for a key that is malformed or sent more than once."""
    if request.method not in _CHANGING_METHODS:
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
