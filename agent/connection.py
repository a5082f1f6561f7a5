"""Staying connected to the control plane: dial, serve, and after a failure wait and dial
again, until a failure shows that trying again cannot help.

Each attempt dials the next configured server in turn, in two steps with their own
timeouts (``DialTimeouts``): the TCP connect, short, so that a server that is down or
black-holed costs little before the next is tried; then the TLS handshake and the
WebSocket upgrade, long, because a control plane just elected is dialled by every agent at
once and its handshakes queue on one loop: an agent that gives up on a slow handshake and
dials again only adds to the queue (at 3,000 agents a 10 s limit made every agent redial
four times; 60 s had them all welcomed in 15 s). Between attempts the agent waits a
jittered, exponentially growing delay (``Backoff``: 0.5 s doubling up to 30 s, each delay
drawn from its upper half); the growth starts over once a connection has stayed up for
``STABLE_AFTER_S``. websockets' own ``async for ws in connect(uri)`` is not used because it
dials one URI only and forgets its backoff at every opening handshake, so two agents
claiming one node id would replace each other (4001) in a tight loop.

Every failure is sorted in one place, ``classify_failure`` (dialling) and ``classify_close``
(the server closing an open connection)::

    retryable                                  fatal: ConnectionFatal, the agent exits
    ---------------------------------------    ------------------------------------------
    connection refused, reset, unreachable     the server certificate fails verification
    timeouts (TCP, TLS, opening handshake)       (not issued by our CA, expired, lacks the
    TLS errors unrelated to certificates         dialled host or IP): ServerCertificateRejected
    HTTP statuses other than 401/403           our certificate refused: a TLS alert naming
    close 1001, 1002, 1011, 4001, 4002, ...      it, HTTP 401/403, close 1008, or the server
    the server hanging up right after the        hanging up right after the TLS handshake
      TLS handshake, fewer than 3 times          REFUSAL_STRIKES times in a row:
                                                 ClientCertificateRejected

An asyncio TLS server that refuses a client certificate closes the connection without
sending the TLS alert, so for the client the handshake succeeds and the server then hangs
up; that is why hang-ups are counted rather than trusted at once. Exceptions::

    ConnectionFatal
     ├── ServerCertificateRejected
     └── ClientCertificateRejected
"""

from __future__ import annotations

import asyncio
import itertools
import random
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import NoReturn

import structlog
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidMessage, InvalidStatus, WebSocketException

from agent.config import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_OPEN_TIMEOUT_S, ServerAddress
from app.pki import explain_tls_failure, fetch_presented_certificate, ssl_error_in
from wire.messages import MAX_MESSAGE_BYTES, CloseCode

log = structlog.get_logger("llmgw.agent")

STABLE_AFTER_S = 10.0
REFUSAL_STRIKES = 3
CLOSE_TIMEOUT_S = 2.0

# TLS alerts by which a server refuses the client certificate (OpenSSL reason names).
CLIENT_CERTIFICATE_ALERTS = frozenset(
    {
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV1_ALERT_UNKNOWN_CA",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)
_REFUSING_STATUSES = frozenset({401, 403})

NODE_CERTIFICATE_HINT = (
    "issue a node certificate for this node id on the control plane "
    "(`llmgw-cli cert node <node-id>`) and check the files with `llmgw-cli cert show`"
)


class ConnectionFatal(Exception):
    """Connecting again cannot succeed until someone changes the configuration."""


class ServerCertificateRejected(ConnectionFatal):
    """The control plane's certificate failed verification."""


class ClientCertificateRejected(ConnectionFatal):
    """The control plane refused this agent's certificate or node id."""


class Failure(Enum):
    RETRYABLE = auto()
    HUNG_UP_AFTER_TLS = auto()  # retryable, but REFUSAL_STRIKES in a row are fatal
    SERVER_CERTIFICATE = auto()  # fatal
    CLIENT_REFUSED = auto()  # fatal


def classify_failure(exc: BaseException) -> Failure:
    """What a failed dial means, the websockets ``process_exception`` decision made explicit."""
    error = ssl_error_in(exc)
    if isinstance(error, ssl.SSLCertVerificationError):
        return Failure.SERVER_CERTIFICATE
    if error is not None and getattr(error, "reason", None) in CLIENT_CERTIFICATE_ALERTS:
        return Failure.CLIENT_REFUSED
    if isinstance(exc, InvalidStatus) and exc.response.status_code in _REFUSING_STATUSES:
        return Failure.CLIENT_REFUSED
    if isinstance(exc, InvalidMessage) and isinstance(exc.__cause__, EOFError):
        return Failure.HUNG_UP_AFTER_TLS
    return Failure.RETRYABLE


def classify_close(code: int) -> Failure:
    """What it means that the server closed an open connection with ``code``."""
    return Failure.CLIENT_REFUSED if code == CloseCode.POLICY_VIOLATION else Failure.RETRYABLE


class Backoff:
    """Delays that double from ``initial_s`` up to ``cap_s``, each drawn at random from the
    upper half of its step so that agents cut off together do not return together."""

    def __init__(
        self,
        initial_s: float = 0.5,
        cap_s: float = 30.0,
        factor: float = 2.0,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        self._initial_s = initial_s
        self._cap_s = cap_s
        self._factor = factor
        self._uniform = uniform
        self._step = 0

    def next_delay(self) -> float:
        ceiling = min(self._cap_s, self._initial_s * self._factor**self._step)
        self._step += 1
        return ceiling * (0.5 + 0.5 * self._uniform())

    def reset(self) -> None:
        self._step = 0


Serve = Callable[[ClientConnection], Awaitable[bool]]


@dataclass(frozen=True)
class DialTimeouts:
    """``connect_s``: the TCP connect (name resolution included); ``open_s``: the TLS
    handshake and the WebSocket upgrade after it."""

    connect_s: float = DEFAULT_CONNECT_TIMEOUT_S
    open_s: float = DEFAULT_OPEN_TIMEOUT_S


@dataclass(frozen=True)
class _Ending:
    failure: Failure
    detail: str
    connected: bool = False
    stable: bool = False


async def stay_connected(
    servers: Sequence[ServerAddress],
    ssl_context: ssl.SSLContext,
    serve: Serve,
    *,
    backoff: Backoff | None = None,
    timeouts: DialTimeouts | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> NoReturn:
    """Dial the servers in turn and hand each connection to ``serve`` (which returns True if
    the control plane welcomed the agent), for ever; raise ``ConnectionFatal`` when trying
    again cannot help."""
    backoff = backoff or Backoff()
    timeouts = timeouts or DialTimeouts()
    hang_ups = 0
    delay = 0.0
    for server in itertools.cycle(servers):
        if delay:
            await asyncio.sleep(delay)
        # Every line logged while this server is dialled or connected names it.
        with structlog.contextvars.bound_contextvars(server=server.uri):
            ending = await _connect_once(server, ssl_context, serve, timeouts, clock)
        hang_ups = hang_ups + 1 if ending.failure is Failure.HUNG_UP_AFTER_TLS else 0
        if hang_ups >= REFUSAL_STRIKES:
            raise ClientCertificateRejected(
                f"{server.host} closed {hang_ups} connections in a row right after the TLS "
                "handshake, which is how it refuses a client certificate (issued by another "
                f"CA, expired, or not a node certificate): {NODE_CERTIFICATE_HINT}"
            )
        if ending.stable:
            backoff.reset()
        delay = backoff.next_delay()
        retry_in_s = round(delay, 2)
        if ending.connected:
            log.warning(
                "disconnected", server=server.uri, reason=ending.detail, retry_in_s=retry_in_s
            )
        else:
            log.warning(
                "connect_failed", server=server.uri, reason=ending.detail, retry_in_s=retry_in_s
            )
    raise ConnectionFatal("no server to connect to")


async def _connect_once(
    server: ServerAddress,
    ssl_context: ssl.SSLContext,
    serve: Serve,
    timeouts: DialTimeouts,
    clock: Callable[[], float],
) -> _Ending:
    try:
        sock = await tcp_connect(server.host, server.port, timeouts.connect_s)
        async with connect(
            server.uri,
            sock=sock,
            ssl=ssl_context,
            max_size=MAX_MESSAGE_BYTES,
            open_timeout=timeouts.open_s,
            ssl_handshake_timeout=timeouts.open_s,
            close_timeout=CLOSE_TIMEOUT_S,
            proxy=None,
        ) as websocket:
            log.info("connected")
            opened_at = clock()
            welcomed = await serve(websocket)
            stable = welcomed and clock() - opened_at >= STABLE_AFTER_S
            return _ending_of(server, websocket, stable)
    except (OSError, TimeoutError, WebSocketException) as exc:
        failure = classify_failure(exc)
        if failure is Failure.SERVER_CERTIFICATE:
            presented = await asyncio.to_thread(
                fetch_presented_certificate, server.host, server.port
            )
            raise ServerCertificateRejected(
                explain_tls_failure(exc, server.host, presented)
            ) from exc
        if failure is Failure.CLIENT_REFUSED:
            raise ClientCertificateRejected(_refusal(exc, server)) from exc
        return _Ending(failure, explain_tls_failure(exc, server.host))


async def tcp_connect(host: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP connection to ``host``:``port``, trying each address it resolves to, within
    ``timeout_s`` in all; raises ``TimeoutError`` (saying so) or the last ``OSError``."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            failure: OSError = OSError(f"{host} resolves to no address")
            for family, kind, proto, _, address in addresses:
                sock = socket.socket(family, kind, proto)
                try:
                    sock.setblocking(False)
                    await loop.sock_connect(sock, address)
                except OSError as exc:
                    sock.close()
                    failure = exc
                    continue
                except BaseException:  # cancelled, or the timeout: the socket is ours to close
                    sock.close()
                    raise
                return sock
            raise failure
    except TimeoutError as exc:
        raise TimeoutError(f"TCP connect to {host}:{port} timed out after {timeout_s:g}s") from exc


def _ending_of(server: ServerAddress, websocket: ClientConnection, stable: bool) -> _Ending:
    protocol = websocket.protocol
    received = protocol.close_rcvd
    if received is None or protocol.close_rcvd_then_sent is False:
        sent = protocol.close_sent
        what = "connection lost" if sent is None else f"closed by this agent: {sent}"
        return _Ending(Failure.RETRYABLE, what, connected=True, stable=stable)
    if classify_close(received.code) is Failure.CLIENT_REFUSED:
        raise ClientCertificateRejected(
            f"{server.host} refused this node (close code {received.code}): {received.reason}"
            f"{_refusal_advice(received.reason)}"
        )
    return _Ending(
        Failure.RETRYABLE, f"closed by the server: {received}", connected=True, stable=stable
    )


def _refusal_advice(reason: str) -> str:
    """What fixes the refusal the server named, when the reason says which it was."""
    if "common name" in reason or "certificate of kind" in reason:
        return f". The certificate's common name must equal --node-id: {NODE_CERTIFICATE_HINT}"
    if "advertised address" in reason:
        return (
            ". Set --address to the address this agent connects from, or reissue the node "
            "certificate naming the address: llmgw-cli cert node <node-id> --ip <address>"
        )
    if "revoked" in reason:
        return f". Issue a new certificate for this node: {NODE_CERTIFICATE_HINT}"
    return ""


def _refusal(exc: BaseException, server: ServerAddress) -> str:
    if isinstance(exc, InvalidStatus):
        return (
            f"{server.host} refused the connection with HTTP {exc.response.status_code}: "
            f"{NODE_CERTIFICATE_HINT}"
        )
    return explain_tls_failure(exc, server.host)
