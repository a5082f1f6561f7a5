"""What every route of the gateway's ASGI application shares: the ASGI types
(``wire.asgi``), request ids, the API key check, and writing an answer or an error in one
go."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable

from app.domain.keys import key_matches, prefix_of
from app.gateway.errors import (
    ApiError,
    expired_api_key,
    header_repeated,
    invalid_api_key,
    too_many_failed_authentications,
)
from app.gateway.table import GatewaySnapshot, KeyRecord
from app.listeners.throttle import FailureBudget
from wire.asgi import Message as Message
from wire.asgi import Receive as Receive
from wire.asgi import Scope as Scope
from wire.asgi import Send as Send

Header = tuple[bytes, bytes]

JSON = (b"content-type", b"application/json")

clock = time.perf_counter

AUTHORIZATION = b"authorization"
_BEARER = b"bearer "
_REQUEST_PREFIX = b"req_" + os.urandom(8).hex().encode()
_request_numbers = itertools.count(1)


def request_id() -> bytes:
    # Unique across gateways by the random per-process prefix; a counter is cheaper than
    # asking the kernel for random bytes on every request.
    return b"%s%012x" % (_REQUEST_PREFIX, next(_request_numbers))


def repeated_authorization() -> ApiError:
    """400 for a request with ``Authorization`` more than once (``authorization_of``)."""
    return header_repeated("Authorization")


def authorization_of(headers: Iterable[Header]) -> bytes | None:
    """The request's ``Authorization`` value, None without one; 400 when it comes more
    than once: a singleton field (RFC 9110 11.6.2), and which of two a proxy in front
    checked cannot be known. A route that walks the headers anyway finds it in that walk
    (``app.gateway.completions``) rather than here."""
    found: bytes | None = None
    for name, value in headers:
        if name == AUTHORIZATION:
            if found is not None:
                raise repeated_authorization()
            found = value
    return found


MAX_VERIFIED_KEYS = 10_000
"""Verified ``Authorization`` values kept per snapshot; past it, the memory starts over."""


class KeyCheck:
    """Checks the key each request presents (``authenticate``), and remembers the
    ``Authorization`` values that verified against the current snapshot, so that a key's
    SHA-256 is computed once per snapshot, not once per request: a revoked key or a
    changed scope arrives in a new snapshot, which starts the memory over. Only values that
    verified are kept (a client without a key cannot grow it), and looking one up costs
    nothing that depends on a secret: the dictionary compares bytes only when their
    (per-process keyed) hashes match.

    Expiry arrives in no snapshot (no event marks it), so it is checked on every request,
    remembered keys included, against the database's clock: ``wall_clock`` (this machine's)
    moved by the snapshot's ``clock_offset_s``, as far as the database's was from it when
    the snapshot was read. A key that never expires costs one comparison with None, one that
    does a read of the clock as well."""

    def __init__(
        self, failures: FailureBudget | None = None, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.failures = failures if failures is not None else FailureBudget()
        self._wall_clock = wall_clock
        self._snapshot: GatewaySnapshot | None = None
        self._verified: dict[bytes, KeyRecord] = {}

    def authenticate(self, snapshot: GatewaySnapshot, scope: Scope) -> KeyRecord:
        """The live key the request presents as ``Authorization: Bearer``; else 401, or
        429 once the client's address has spent its failures. A valid key is served
        whatever its address has failed: its secret cannot be guessed, and behind a load
        balancer that address is every client's. An expired key is 401 saying so, and
        spends nothing of the address's failures: whoever sent it knew the secret.
        ``Authorization`` more than once is 400, before any key is checked: nothing is
        learnt of either value, so it spends nothing either (as a request without a
        key)."""
        return self.check(snapshot, authorization_of(scope["headers"]), scope)

    def check(self, snapshot: GatewaySnapshot, header: bytes | None, scope: Scope) -> KeyRecord:
        """``authenticate`` for the request's ``Authorization`` value, ``header``, found by
        the caller's own walk of the headers (``authorization_of`` says how)."""
        if snapshot is not self._snapshot:
            self._snapshot = snapshot
            self._verified = {}
        elif header is not None:
            known = self._verified.get(header)
            if known is not None:
                return self._unexpired(known, snapshot)
        key = self._verify(snapshot, header, scope)
        if header is not None:
            if len(self._verified) >= MAX_VERIFIED_KEYS:
                self._verified = {}
            self._verified[header] = key
        return self._unexpired(key, snapshot)

    def _unexpired(self, key: KeyRecord, snapshot: GatewaySnapshot) -> KeyRecord:
        if (
            key.expires_at is not None
            and self._wall_clock() + snapshot.clock_offset_s >= key.expires_at
        ):
            raise expired_api_key(key.expires_at)
        return key

    def _verify(self, snapshot: GatewaySnapshot, header: bytes | None, scope: Scope) -> KeyRecord:
        presented = None
        if header is not None and header[:7].lower() == _BEARER:
            presented = header[7:].strip().decode("latin-1")
        elif header is not None and header.strip():
            # Checked no further, so it spends nothing: a key pasted as the whole header
            # (or another scheme's credentials) is a slip, not a guess. Not told back: it
            # may hold a secret.
            raise invalid_api_key(
                "The Authorization header is not in the form `Authorization: Bearer <key>`: "
                "send the API key after `Bearer `."
            )
        if not presented:
            raise invalid_api_key("Missing API key: send it as `Authorization: Bearer <key>`.")
        prefix = prefix_of(presented)
        key = snapshot.keys.get(prefix) if prefix is not None else None
        if key is None or not key_matches(presented, key.secret_hash):
            client = scope.get("client")
            wait_s = self.failures.spend(client[0] if client else None)
            if wait_s:
                raise too_many_failed_authentications(wait_s)
            raise invalid_api_key("Incorrect API key provided.")
        return key


def takes(method: str, route_method: str) -> bool:
    """Whether a route of ``route_method`` serves a request of ``method``: HEAD is served by
    every GET route, as GET would be (RFC 9110 9.3.2), which is what probes send; its
    answer goes out without a body (``bodiless``)."""
    return method == route_method or (method == "HEAD" and route_method == "GET")


def bodiless(scope: Scope, send: Send) -> Send:
    """``send`` for the request of ``scope``; for a HEAD request, one that sends every
    answer with its head as GET's (``content-length`` included, RFC 9110 9.3.2) and no body.
    The routes themselves never ask which method came."""
    if scope["method"] != "HEAD":
        return send

    async def send_head(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return send_head


def gateway_headers(started: float) -> list[Header]:
    """``x-request-id`` and ``x-llmgw-gateway-ms`` of an answer that needed no engine."""
    return [
        (b"x-request-id", request_id()),
        (b"x-llmgw-gateway-ms", b"%.3f" % ((clock() - started) * 1000)),
    ]


async def respond(send: Send, status: int, body: bytes, headers: list[Header]) -> None:
    """A whole answer: ``headers`` (content type included) and ``body``."""
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def refuse(send: Send, error: ApiError, headers: list[Header]) -> None:
    """``error`` in OpenAI's shape, after ``headers``."""
    headers += [JSON, *error.headers]
    await respond(send, error.status, error.body(), headers)
