"""The hub's connections from their accept to their WebSocket handshake: TLS started by the
hub itself, behind a cap on handshakes in progress per address (``app.hub.gate``).

Given a TLS context, asyncio starts each connection's handshake the moment it accepts it
and tells the protocol nothing until the handshake is over: the hub could not see who is
connecting before paying for the handshake. So the hub listens on plain TCP, and each
connection (``Accepting.connection_class()``, the class websockets makes for every accepted
socket) checks its peer's address against the gate as soon as it is accepted:

- over the cap: closed at once (reset: nothing read, nothing sent, no TLS), counted, and
  logged as ``agent_handshake_over_cap`` at most once per address per minute (the line
  says how many went unlogged since the last);
- otherwise: its TLS handshake is started by ``loop.start_tls`` and holds a place at the
  gate until it finishes, fails or times out; a connection whose handshake finished is
  handed to websockets, as asyncio would have handed it, and becomes an agent's.

Until the handshake is over, the TLS layer speaks to a stand-in (``_Handshake``) that keeps
what arrives with its end (a client may send its first request with its last handshake
message), and the connection is given it once websockets has it.

Every connection counts as opening (``app.hub.arrivals``) from its accept until it is
refused, its handshake fails, or the hub's handler takes it.

The listener (``Accepting.listen``) answers ``/healthz`` and ``/readyz`` itself, in place of
a WebSocket handshake; any other request goes on to one.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import Any, cast

import structlog
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from app.domain.log_throttle import LogThrottle
from app.hub.arrivals import OpeningConnections
from app.hub.gate import HandshakeGate
from app.hub.refusals import DEFAULT_MAX_KEYS
from app.listeners.throttle import address_group
from app.pki.explain import explain_node_certificate_refusal
from wire.messages import MAX_MESSAGE_BYTES

OVER_CAP_LOG_INTERVAL_S = 60.0
LISTEN_BACKLOG = 4096
HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
log = structlog.get_logger(__name__)

ConnectionHandler = Callable[[ServerConnection], Awaitable[None]]


class _Handshake(asyncio.Protocol):
    """What the TLS layer speaks to while its handshake runs: what comes with its end is
    kept for the connection it is handed to."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.ended = False
        self.lost = False

    def data_received(self, data: bytes) -> None:
        self.received.append(data)

    def eof_received(self) -> None:
        self.ended = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def hand_over(self, connection: asyncio.Protocol) -> None:
        for data in self.received:
            connection.data_received(data)
        self.received.clear()
        if self.ended:
            connection.eof_received()


class Accepting:
    """The hub listener's accepted connections: its gate, its TLS and what is opening."""

    def __init__(
        self,
        tls: ssl.SSLContext,
        gate: HandshakeGate,
        opening: OpeningConnections,
        *,
        handshake_timeout_s: float,
        close_timeout_s: float,
    ) -> None:
        """``close_timeout_s``: how long a peer's close is waited for, of its TLS as of its
        WebSocket."""
        self.gate = gate
        self._tls = tls
        self._opening = opening
        self._handshake_timeout_s = handshake_timeout_s
        self._close_timeout_s = close_timeout_s
        self._over_cap = LogThrottle(OVER_CAP_LOG_INTERVAL_S, DEFAULT_MAX_KEYS)
        self._certificates = LogThrottle(OVER_CAP_LOG_INTERVAL_S, DEFAULT_MAX_KEYS)
        self.certificates_refused = 0
        """Handshakes that failed on the client certificate, since the hub was made."""
        self._handshakes: set[asyncio.Task[None]] = set()

    async def listen(self, handler: ConnectionHandler, host: str, port: int) -> Server:
        """Listen on ``host``:``port``; each connection past its handshakes goes to
        ``handler``. Raises ``OSError`` when it cannot bind them."""
        return await serve(
            handler,
            host,
            port,
            # Plain TCP: each connection starts its own TLS once past the per-address cap on
            # handshakes in progress.
            create_connection=self.connection_class(),
            process_request=_answer_health_checks,
            max_size=MAX_MESSAGE_BYTES,
            # A restarted control plane is dialled by every agent at once; the default
            # backlog of 100 drops most of a thousand and they retry seconds later.
            backlog=LISTEN_BACKLOG,
            # A refused or cut-off peer that does not answer the close is not waited for
            # long: honest agents answer at once.
            close_timeout=self._close_timeout_s,
        )

    def stop(self) -> None:
        """Abandon the handshakes in progress (their connections close): the hub stops."""
        for task in list(self._handshakes):
            task.cancel()

    def connection_class(self) -> type[ServerConnection]:
        """The connection class websockets makes for each accepted socket (before TLS)."""
        accepting = self

        class _AcceptedConnection(ServerConnection):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                accepting._opening.opened(id(self), monotonic())

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                # Plain TCP, just accepted: nothing is read or sent yet.
                transport = cast(asyncio.Transport, transport)
                address = host_of(transport.get_extra_info("peername"))
                if not accepting.gate.enter(address):
                    accepting._opening.finished(id(self))
                    accepting._refused(address)
                    transport.abort()
                    return
                transport.pause_reading()  # what the peer sends waits for the TLS layer
                task = self.loop.create_task(self._secure(transport, address))
                accepting._handshakes.add(task)
                task.add_done_callback(accepting._handshakes.discard)

            async def _secure(self, transport: asyncio.Transport, address: str) -> None:
                handshake = _Handshake()
                secured: asyncio.Transport | None = None
                try:
                    secured = await self.loop.start_tls(
                        transport,
                        handshake,
                        accepting._tls,
                        server_side=True,
                        ssl_handshake_timeout=accepting._handshake_timeout_s,
                        ssl_shutdown_timeout=accepting._close_timeout_s,
                    )
                except ssl.SSLCertVerificationError as exc:
                    accepting._certificate_refused(address, exc)
                except OSError:
                    pass  # timed out, cut off, not TLS (ssl.SSLError is an OSError)
                except Exception:
                    log.exception("agent_tls_not_started")
                finally:
                    accepting.gate.leave(address)
                    if secured is None or handshake.lost:
                        accepting._opening.finished(id(self))
                if secured is None or handshake.lost:
                    return  # start_tls closed what it could not secure
                secured.set_protocol(self)
                super().connection_made(secured)
                handshake.hand_over(self)

            def connection_lost(self, exc: Exception | None) -> None:
                accepting._opening.finished(id(self))
                super().connection_lost(exc)

        return _AcceptedConnection

    def _certificate_refused(self, address: str, error: ssl.SSLCertVerificationError) -> None:
        """A node certificate the TLS handshake refused: expired, not yet valid, not issued
        by the CA. The agent sees only the connection closed (asyncio sends no alert), so
        this line is the one place that says why: one a minute per address and reason, with
        the count left unlogged, so that an agent dialling in a loop cannot flood the log."""
        self.certificates_refused += 1
        reason = explain_node_certificate_refusal(error)
        group = address_group(address)
        unlogged = self._certificates.admit(f"{group} {error.verify_code}", monotonic())
        if unlogged is not None:
            log.warning(
                "agent_certificate_refused",
                address=address,
                reason=reason,
                refused_unlogged=unlogged,
            )

    def _refused(self, address: str) -> None:
        group = address_group(address)  # what the cap counts: one line a minute for a /64
        unlogged = self._over_cap.admit(group, monotonic())
        if unlogged is not None:
            log.warning(
                "agent_handshake_over_cap",
                address=address,
                counted_as=group,
                cap=self.gate.per_address,
                refused_unlogged=unlogged,
            )


def _answer_health_checks(connection: ServerConnection, request: Request) -> Response | None:
    """``/healthz`` and ``/readyz`` on the hub's listener, as on every listener: the hub
    listens only while its server leads, so answering at all means alive and leading.
    Anything else goes on to the WebSocket handshake."""
    path = request.path.split("?", 1)[0]
    if path not in HEALTH_PATHS:
        return None
    body = b'{"status":"ok","role":"leader"}\n'
    headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return Response(200, "OK", headers, body)


def host_of(peername: object) -> str:
    """The address of a peer (its host, without the port)."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return str(peername)


def format_address(peername: object) -> str:
    """A peer's address as its log lines and records name it: ``host:port``, ``[v6]:port``."""
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peername)
