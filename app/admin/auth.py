"""Who is calling the admin API. Every request needs an identity; it becomes the actor of
every event the request causes.

Tokens for automation are configured as ``name:token`` pairs; the token is compared in
constant time and its name is the actor.
"""

from __future__ import annotations

import hmac
from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler

ACTOR_KEY = "llmgw_actor"


def parse_tokens(spec: str) -> dict[str, str]:
    """``"ci:s3cret,alice:t0ken"`` -> ``{"s3cret": "ci", "t0ken": "alice"}``."""
    tokens: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, token = item.partition(":")
        if not sep or not name or len(token) < 16:
            raise ValueError(
                "admin tokens are NAME:TOKEN pairs separated by commas, tokens of at "
                f"least 16 characters; got {item.split(':')[0]!r}..."
            )
        tokens[token] = name
    return tokens


class TokenAuthenticator:
    def __init__(self, tokens: dict[str, str]) -> None:
        self._tokens = tokens

    def actor_for(self, header: str | None) -> str | None:
        if not header or not header.lower().startswith("bearer "):
            return None
        presented = header[7:].strip().encode()
        actor = None
        for token, name in self._tokens.items():
            if hmac.compare_digest(token.encode(), presented):
                actor = name
        return actor


def require_actor(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard: a request without a valid identity is refused before any handler runs."""
    authenticator: TokenAuthenticator = connection.app.state.authenticator
    actor = authenticator.actor_for(connection.headers.get("authorization"))
    if actor is None:
        raise NotAuthorizedException(
            "authentication required: send 'Authorization: Bearer <admin token>' "
            "(llmgw-cli reads it from LLMGW_ADMIN_TOKEN)"
        )
    connection.scope["state"][ACTOR_KEY] = actor
