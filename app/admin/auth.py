"""Who is calling the admin API. Every request needs an identity; it becomes the actor of
every event the request causes.

Two kinds of identity are accepted:

- an operator certificate from the llmgw CA (``llmgw-cli cert operator <name>``), presented
  in the TLS handshake of an HTTPS admin listener: its common name is the actor. A
  certificate of any other kind (a node's, most importantly) is refused outright, even
  with a valid token beside it: a client that presents the wrong certificate is
  misconfigured, and saying so beats guessing.
- a token for automation, configured as ``name:token`` pairs: compared in constant time,
  its name is the actor. It is consulted only when no certificate was presented, and
  sent once: a request carrying ``Authorization`` twice is a 400, neither compared. Wrong
  tokens are counted per client address (``app.listeners.throttle``): an address that has
  spent its budget of failures is answered 429 with ``Retry-After`` before its token is
  even compared, its right token included, so that a short token cannot be guessed at
  speed. Operator certificates are never throttled.

``/healthz``, ``/readyz`` and ``/metrics`` carry no guard: probes and scrapers read them.
"""

from __future__ import annotations

import functools
import hmac
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog
from cryptography import x509
from litestar.connection import ASGIConnection
from litestar.exceptions import (
    ClientException,
    NotAuthorizedException,
    PermissionDeniedException,
    TooManyRequestsException,
)
from litestar.handlers.base import BaseRouteHandler

from app.admin.middleware import ACTOR_KEY
from app.admin.tls import TLS_EXTENSION
from app.listeners.http11 import retry_after_header
from app.listeners.throttle import FailureBudget
from app.pki.errors import CertificateRejected
from app.pki.model import CertificateKind
from app.pki.tls import PeerIdentity, peer_identity

log = structlog.get_logger(__name__)


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


class DuplicateAuthorizationException(ClientException):
    """400 ``duplicate-authorization``: a request carried ``Authorization`` more than once."""


class TooManyFailures(Exception):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__(
            "too many requests with a wrong admin token from this address; retry after "
            f"{math.ceil(retry_after_s)} s (an operator certificate is not held up by this)"
        )
        self.retry_after_s = retry_after_s


class TokenAuthenticator:
    def __init__(self, tokens: dict[str, str], failures: FailureBudget | None = None) -> None:
        self._tokens = tokens
        self._failures = failures or FailureBudget()

    def actor_for(self, header: str | None, address: str | None = None) -> str | None:
        """The actor the bearer token in ``header`` names; None for none or a wrong one.
        Raises ``TooManyFailures`` when ``address`` has spent its budget of wrong ones."""
        if not header or not header.lower().startswith("bearer "):
            return None
        if wait_s := self._failures.wait_s(address):
            raise TooManyFailures(wait_s)
        presented = header[7:].strip().encode()
        actor = None
        for token, name in self._tokens.items():
            if hmac.compare_digest(token.encode(), presented):
                actor = name
        if actor is None:
            self._failures.spend(address)
        return actor


def operator_for(scope: Mapping[str, Any], now: datetime) -> str | None:
    """The operator named by the client certificate of the request's TLS connection; None
    when none was presented. Raises ``PermissionDeniedException`` for a certificate that
    is not an operator's, or that has expired by ``now``: the handshake checked its dates
    when the connection opened, and a kept-alive connection carries request after request."""
    chain = _client_chain(scope)
    if not chain:
        return None
    try:
        identity = _operator_identity(chain[0])
        if identity.expires_at is not None and now > identity.expires_at:
            raise CertificateRejected(_expired(identity.common_name, identity.expires_at))
    except CertificateRejected as exc:
        log.warning("admin_certificate_refused", reason=str(exc))
        raise PermissionDeniedException(_refusal(str(exc))) from exc
    return identity.common_name


class CertificateEnd(msgspec.Struct, frozen=True, kw_only=True):
    """When the operator certificate a request came with ends, and what a request would be
    refused with past it."""

    at: datetime
    refusal: str

    def passed(self, now: datetime) -> bool:
        return now > self.at


def operator_certificate_end(scope: Mapping[str, Any]) -> CertificateEnd | None:
    """The end of the operator certificate of the request's TLS connection (which
    ``require_actor`` accepted); None when the request came without one. Whatever the
    request keeps open (an event stream) ends with it: past it, a request is refused."""
    chain = _client_chain(scope)
    if not chain:
        return None
    try:
        identity = _operator_identity(chain[0])
    except CertificateRejected:
        return None  # refused by the guard already: no handler runs
    if identity.expires_at is None:
        return None
    refusal = _refusal(_expired(identity.common_name, identity.expires_at))
    return CertificateEnd(at=identity.expires_at, refusal=refusal)


def _client_chain(scope: Mapping[str, Any]) -> Any:
    tls = scope.get("extensions", {}).get(TLS_EXTENSION)
    return tls.get("client_cert_chain") if isinstance(tls, Mapping) else None


def _expired(common_name: str, expires_at: datetime) -> str:
    return (
        f"the operator certificate of {common_name!r} expired on {expires_at:%Y-%m-%d %H:%M:%S} UTC"
    )


def _refusal(reason: str) -> str:
    return f"{reason}; issue one with `llmgw-cli cert operator <name>`"


@functools.lru_cache(maxsize=256)
def _operator_identity(pem: str) -> PeerIdentity:
    # Parsed once per certificate, not once per request of a keep-alive connection.
    try:
        certificate = x509.load_pem_x509_certificate(pem.encode())
    except ValueError as exc:
        raise CertificateRejected(f"the client certificate cannot be parsed: {exc}") from exc
    return peer_identity(certificate, expect=CertificateKind.OPERATOR)


def require_actor(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard: a request without a valid identity is refused before any handler runs."""
    actor = operator_for(connection.scope, datetime.now(UTC))
    if actor is None:
        authenticator: TokenAuthenticator = connection.app.state.authenticator
        address = connection.client.host if connection.client else None
        headers = connection.headers.getall("authorization", [])
        if len(headers) > 1:
            # Sent once (RFC 9110, section 11.6.2): with two, a proxy in front may have
            # checked the other. Neither is compared, so no wrong token is counted.
            raise DuplicateAuthorizationException(
                "the Authorization header appears more than once: send it once"
            )
        try:
            actor = authenticator.actor_for(headers[0] if headers else None, address)
        except TooManyFailures as exc:
            raise TooManyRequestsException(
                str(exc), headers={"retry-after": retry_after_header(exc.retry_after_s).decode()}
            ) from exc
    if actor is None:
        raise NotAuthorizedException(
            "authentication required: present an operator certificate over HTTPS "
            "(`llmgw-cli cert operator <name>`; llmgw-cli reads LLMGW_ADMIN_CERT and "
            "LLMGW_ADMIN_KEY) or send 'Authorization: Bearer <admin token>' "
            "(llmgw-cli reads LLMGW_ADMIN_TOKEN)"
        )
    connection.scope["state"][ACTOR_KEY] = actor
