"""Staying connected to the control plane: dial, serve, and after a failure wait and dial
again, until a failure shows that trying again cannot help.

Each attempt dials the next configured server in turn, in two steps with their own
timeouts (``DialTimeouts``): the TCP connect, short, so that a server that is down or
black-holed costs little before the next is tried; then the TLS handshake and the
WebSocket upgrade, long, because a control plane just elected is dialled by every agent at
once and its handshakes queue on one loop: an agent that gives up on a slow handshake and
dials again only adds to the queue (at 3,000 agents a 10 s limit made every agent redial
four times; 60 s had them all welcomed in 15 s).

A frozen control plane looks the same from outside: its kernel accepts TCP and its
handshakes never finish. So rather than shorten the open timeout, which would bring the
redials back, an attempt that has opened nothing after ``next_server_after_s`` dials the
next server as well, keeping the slow dial going (as happy eyeballs does for addresses,
RFC 8305): the first connection to open is served and the others are abandoned. A slow
leader keeps every dial it was sent, the next server is typically a standby that refuses
at once, and an agent whose leader froze reaches the new one in seconds. Between attempts
the agent waits a
jittered, exponentially growing delay (``Backoff``: 0.5 s doubling up to 30 s, each delay
drawn from its upper half); the growth starts over once a connection has stayed up for
``STABLE_AFTER_S``. A server that refuses the node for connecting too often (4004), or
because another agent is connected as this node and still answers (4005: two agents run
with one certificate), is dialled again only after the longest delay, whatever the step.
websockets' own
``async for ws in connect(uri)`` is not used because it dials one URI only and forgets its
backoff at every opening handshake, so two agents claiming one node id would replace each
other (4001) in a tight loop.

Every failure is sorted in one place, ``classify_failure`` (dialling) and ``classify_close``
(the server closing an open connection)::

    retryable                                  fatal: ConnectionFatal, the agent exits
    ---------------------------------------    ------------------------------------------
    connection refused, reset, unreachable     the server certificate fails verification
    timeouts (TCP, TLS, opening handshake)       (not issued by our CA, expired, lacks the
    TLS errors unrelated to certificates         dialled host or IP): ServerCertificateRejected
    HTTP statuses other than 401/403           our certificate refused: a TLS alert naming
    close 1001, 1002, 1011, 4001, 4002, ...      it, HTTP 401/403, close 1008, or the server
    close 4004 (this node connects too           hanging up right after the TLS handshake
      often), 4005 (another agent is this      REFUSAL_STRIKES times in a row:
      node), after the longest delay
    the server hanging up right after the        ClientCertificateRejected
      TLS handshake, fewer than 3 times

An asyncio TLS server that refuses a client certificate closes the connection without
sending the TLS alert, so for the client the handshake succeeds and the server then hangs
up; that is why hang-ups are counted rather than trusted at once. Exceptions::

    ConnectionFatal
     ├── ServerCertificateRejected
     └── ClientCertificateRejected
"""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum, auto
from typing import NoReturn

import structlog
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidMessage, InvalidStatus, WebSocketException

from agent.config import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_NEXT_SERVER_AFTER_S,
    DEFAULT_OPEN_TIMEOUT_S,
)
from agent.config_values import ServerAddress
from agent.refusal_advice import (
    NodeClaim,
    certificate_dates_note,
    node_certificate_hint,
    refusal_advice,
)
from app.pki.explain import explain_tls_failure, ssl_error_in
from app.pki.tls import fetch_presented_certificate
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


class ConnectionFatal(Exception):
    """Connecting again cannot succeed until someone changes the configuration."""


class ServerCertificateRejected(ConnectionFatal):
    """The control plane's certificate failed verification."""


class ClientCertificateRejected(ConnectionFatal):
    """The control plane refused this agent's certificate or node id."""


class Failure(Enum):
    RETRYABLE = auto()
    TOO_OFTEN = auto()  # retryable, after the longest delay: the server rations our connects
    CONNECTED_ELSEWHERE = auto()  # retryable, after the longest delay: another agent is the node
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
    if code == CloseCode.POLICY_VIOLATION:
        return Failure.CLIENT_REFUSED
    if code == CloseCode.TOO_OFTEN:
        return Failure.TOO_OFTEN
    if code == CloseCode.CONNECTED_ELSEWHERE:
        return Failure.CONNECTED_ELSEWHERE
    return Failure.RETRYABLE


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
        if ceiling < self._cap_s:
            # Past the cap the step stays put: a float power overflows (OverflowError) at
            # the 1,025th failure in a row, some nine hours of a control plane away.
            self._step += 1
        return ceiling * (0.5 + 0.5 * self._uniform())

    def longest_delay(self) -> float:
        """A delay drawn from the upper half of the cap, whatever the step."""
        return self._cap_s * (0.5 + 0.5 * self._uniform())

    def reset(self) -> None:
        self._step = 0


Serve = Callable[[ClientConnection], Awaitable[bool]]


@dataclass(frozen=True)
class DialTimeouts:
    """``connect_s``: the TCP connect (name resolution included); ``open_s``: the TLS
    handshake and the WebSocket upgrade after it; ``next_server_after_s``: how long an
    attempt waits for a connection to open before it dials the next server as well."""

    connect_s: float = DEFAULT_CONNECT_TIMEOUT_S
    open_s: float = DEFAULT_OPEN_TIMEOUT_S
    next_server_after_s: float = DEFAULT_NEXT_SERVER_AFTER_S


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
    node: NodeClaim,
    backoff: Backoff | None = None,
    timeouts: DialTimeouts | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> NoReturn:
    """Dial the servers in turn and hand each connection to ``serve`` (which returns True if
    the control plane welcomed the agent), for ever; raise ``ConnectionFatal`` when trying
    again cannot help, its advice naming ``node``."""
    if not servers:
        raise ConnectionFatal("no server to connect to")
    backoff = backoff or Backoff()
    timeouts = timeouts or DialTimeouts()
    hang_ups = 0
    delay = 0.0
    first = 0
    while True:
        if delay:
            await asyncio.sleep(delay)
        turn = [(first + step) % len(servers) for step in range(len(servers))]
        position, ending = await _connect_once(
            [(p, servers[p]) for p in turn], ssl_context, serve, timeouts, clock, node
        )
        server = servers[position]
        first = (position + 1) % len(servers)
        hang_ups = hang_ups + 1 if ending.failure is Failure.HUNG_UP_AFTER_TLS else 0
        if hang_ups >= REFUSAL_STRIKES:
            raise ClientCertificateRejected(
                f"{server.host} closed {hang_ups} connections in a row right after the TLS "
                "handshake, which is how it refuses a client certificate (issued by another "
                "CA, expired or not valid yet by its clock, or not a node certificate; its "
                "agent_certificate_refused log line says which): "
                f"{certificate_dates_note(node, datetime.now(UTC))}"
                f"{node_certificate_hint(node)}"
            )
        if ending.stable:
            backoff.reset()
        delay = backoff.next_delay()
        if ending.failure in _AT_THE_SLOWEST_PACE:
            # The server refused this node for connecting too often, or because another
            # agent is connected as this node and answers: dialling again at the next step
            # would only be refused again.
            delay = max(delay, backoff.longest_delay())
        if ending.failure is Failure.CONNECTED_ELSEWHERE:
            log.warning(
                "node_connected_elsewhere",
                node_id=node.node_id,
                server=server.uri,
                reason=ending.detail,
                advice=f"another agent runs with node {node.node_id}'s certificate and is "
                "connected: stop one of them (a cloned machine, a copied state directory); "
                "this one keeps trying",
                retry_in_s=round(delay, 2),
            )
        retry_in_s = round(delay, 2)
        if ending.connected:
            log.warning(
                "disconnected", server=server.uri, reason=ending.detail, retry_in_s=retry_in_s
            )
        else:
            log.warning(
                "connect_failed", server=server.uri, reason=ending.detail, retry_in_s=retry_in_s
            )


_AT_THE_SLOWEST_PACE = frozenset({Failure.TOO_OFTEN, Failure.CONNECTED_ELSEWHERE})
"""Refusals the server repeats until something changes: retried after the longest delay."""

Candidate = tuple[int, ServerAddress]
"""A server and its place among the configured ones."""


async def _connect_once(
    candidates: Sequence[Candidate],
    ssl_context: ssl.SSLContext,
    serve: Serve,
    timeouts: DialTimeouts,
    clock: Callable[[], float],
    node: NodeClaim,
) -> tuple[int, _Ending]:
    """One attempt: open a connection to the first of ``candidates`` that answers, serve
    it until it ends, and say how it ended and on which server (where the next attempt
    carries on from)."""
    dialled = await _open_first(candidates, ssl_context, timeouts)
    if isinstance(dialled, _Failed):
        return dialled.position, await _ending_of_failure(dialled.server, dialled.error, node)
    position, server = dialled.position, dialled.server
    # Every line logged while this server is connected names it.
    with structlog.contextvars.bound_contextvars(server=server.uri):
        try:
            async with dialled.websocket as websocket:
                log.info("connected")
                opened_at = clock()
                welcomed = await serve(websocket)
                stable = welcomed and clock() - opened_at >= STABLE_AFTER_S
                return position, _ending_of(server, websocket, stable, node)
        except (OSError, TimeoutError, WebSocketException) as exc:
            return position, await _ending_of_failure(server, exc, node)


@dataclass(frozen=True)
class _Opened:
    position: int
    server: ServerAddress
    websocket: ClientConnection


@dataclass(frozen=True)
class _Failed:
    position: int
    server: ServerAddress
    error: Exception


async def _open_first(
    candidates: Sequence[Candidate], ssl_context: ssl.SSLContext, timeouts: DialTimeouts
) -> _Opened | _Failed:
    """Dial the first candidate; each time ``timeouts.next_server_after_s`` passes without
    a connection opened, dial the next candidate that is not being dialled already (round
    the list again if need be), every dial keeping its own timeouts. The first connection
    to open wins and every other dial is abandoned (closed). Otherwise the failure that
    ended the attempt: a fatal one at once, else the last one once no dial is left.

    So a frozen first server is passed over in ``next_server_after_s``, and a next server
    that refuses at first (a standby that leads only seconds later) is dialled again every
    ``next_server_after_s`` while the slow dial goes on; a dial that fails with none other
    going ends the attempt, and the caller waits its backoff as after any failure."""
    loop = asyncio.get_running_loop()
    patience = timeouts.next_server_after_s
    dials: dict[asyncio.Task[ClientConnection], Candidate] = {}
    turn = 0

    def dial_next() -> ServerAddress:
        nonlocal turn
        dialling = {position for position, _ in dials.values()}
        while candidates[turn % len(candidates)][0] in dialling:
            turn += 1
        position, server = candidates[turn % len(candidates)]
        turn += 1
        # The dial's own task: every line it logs names its server.
        with structlog.contextvars.bound_contextvars(server=server.uri):
            task = asyncio.create_task(_open(server, ssl_context, timeouts))
        dials[task] = (position, server)
        return server

    dial_next()
    next_dial_at = loop.time() + patience
    failed: _Failed | None = None
    try:
        while dials:
            idle = len(dials) < len(candidates)
            wait_s = max(0.0, next_dial_at - loop.time()) if idle else None
            done, _ = await asyncio.wait(dials, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                slow = [server.uri for _, server in dials.values()]
                log.info("dialling_next_server", server=dial_next().uri, still_dialling=slow)
                next_dial_at = loop.time() + patience
                continue
            ended = [(dials.pop(task), task) for task in done]
            opened = [
                _Opened(position, server, task.result())
                for (position, server), task in ended
                if task.exception() is None
            ]
            if opened:
                for later in opened[1:]:
                    await _abandon(later.websocket)
                return opened[0]
            for (position, server), task in ended:
                error = task.exception()
                if not isinstance(error, Exception):
                    raise AssertionError(f"a dial ended with {error!r}")
                failed = _Failed(position, server, error)
                if classify_failure(error) in _FATAL:
                    return failed
                if dials:
                    log.warning(
                        "connect_failed",
                        server=server.uri,
                        reason=explain_tls_failure(error, server.host),
                        still_dialling=[s.uri for _, s in dials.values()],
                    )
            # A server that just failed is not dialled again at once.
            next_dial_at = max(next_dial_at, loop.time() + patience)
    finally:
        for task in dials:
            task.cancel()
        for result in await asyncio.gather(*dials, return_exceptions=True):
            if isinstance(result, ClientConnection):
                await _abandon(result)
    assert failed is not None, "a dial was made, and every one of them failed"
    return failed


_FATAL = frozenset({Failure.SERVER_CERTIFICATE, Failure.CLIENT_REFUSED})


async def _open(
    server: ServerAddress, ssl_context: ssl.SSLContext, timeouts: DialTimeouts
) -> ClientConnection:
    """A WebSocket connection to ``server``, opened: TCP, then TLS and the upgrade."""
    sock = await tcp_connect(server.host, server.port, timeouts.connect_s)
    try:
        return await connect(
            server.uri,
            sock=sock,
            ssl=ssl_context,
            max_size=MAX_MESSAGE_BYTES,
            open_timeout=timeouts.open_s,
            ssl_handshake_timeout=timeouts.open_s,
            close_timeout=CLOSE_TIMEOUT_S,
            proxy=None,
        )
    except BaseException:
        sock.close()
        raise


async def _abandon(websocket: ClientConnection) -> None:
    """Close a connection that opened after another had won."""
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await websocket.close(CloseCode.GOING_AWAY, "connected to another server")
    except (OSError, TimeoutError, WebSocketException):
        pass


async def _ending_of_failure(server: ServerAddress, exc: BaseException, node: NodeClaim) -> _Ending:
    """A retryable failure's ending; raises the ``ConnectionFatal`` a fatal one means."""
    failure = classify_failure(exc)
    if failure is Failure.SERVER_CERTIFICATE:
        presented = await asyncio.to_thread(fetch_presented_certificate, server.host, server.port)
        raise ServerCertificateRejected(explain_tls_failure(exc, server.host, presented)) from exc
    if failure is Failure.CLIENT_REFUSED:
        raise ClientCertificateRejected(_refusal(exc, server, node)) from exc
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


def _ending_of(
    server: ServerAddress, websocket: ClientConnection, stable: bool, node: NodeClaim
) -> _Ending:
    protocol = websocket.protocol
    received = protocol.close_rcvd
    if received is None or protocol.close_rcvd_then_sent is False:
        sent = protocol.close_sent
        what = "connection lost" if sent is None else f"closed by this agent: {sent}"
        return _Ending(Failure.RETRYABLE, what, connected=True, stable=stable)
    failure = classify_close(received.code)
    if failure is Failure.CLIENT_REFUSED:
        raise ClientCertificateRejected(
            f"{server.host} refused this node (close code {received.code}): {received.reason}"
            f"{refusal_advice(received.reason, node)}"
        )
    return _Ending(failure, f"closed by the server: {received}", connected=True, stable=stable)


def _refusal(exc: BaseException, server: ServerAddress, node: NodeClaim) -> str:
    if isinstance(exc, InvalidStatus):
        return (
            f"{server.host} refused the connection with HTTP {exc.response.status_code}: "
            f"{node_certificate_hint(node)}"
        )
    return explain_tls_failure(exc, server.host)
