"""One agent's WebSocket and its session, as the hub holds it: the registry's handle for a
node.

Closing one does not wait for its closing handshake (``AgentConnection.close``), so that
what its session says next (the agent is gone) is recorded at once, even if the peer is
dead; one whose close frame cannot even be sent within the send timeout is dropped. While
the hub waits for the close, what still arrives is read and dropped.

Before a newer connection for its node replaces one, the hub asks whether it still answers
(``answers_ping``, within ``LIVENESS_TIMEOUT_S``): one that does has a live agent behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from time import monotonic

import structlog
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from app.domain.revocations import PresentedCertificate
from app.hub.session import AgentSession

CLOSE_TIMEOUT_S = 2.0
LIVENESS_TIMEOUT_S = 2.0
"""How long a node's connection has to answer a ping before a newer one for the node takes
its place. A live agent answers within a round trip (milliseconds on a LAN, under a second
across continents), its pongs sent by its WebSocket library whatever its own code does; a
half-open connection (its agent restarted, the server not told) never answers. Longer would
only delay a restarted agent's return by as much."""
log = structlog.get_logger(__name__)


class AgentConnection:
    """One accepted WebSocket and its session; the registry's handle for a node."""

    def __init__(
        self,
        websocket: ServerConnection,
        session: AgentSession,
        certificate: PresentedCertificate,
        send_timeout_s: float,
        certificate_ends_at: datetime | None = None,
    ) -> None:
        self.websocket = websocket
        self.session = session
        self.certificate = certificate
        self.certificate_ends_at = certificate_ends_at
        self._send_timeout_s = send_timeout_s
        self._closing: asyncio.Task[None] | None = None

    def close(self, code: int, reason: str) -> None:
        """Start the closing handshake without waiting for it, so that what the session
        says next (the agent is gone) is recorded at once, even if the peer is dead."""
        if self._closing is None:
            self._closing = asyncio.create_task(self._close(code, reason))

    async def _close(self, code: int, reason: str) -> None:
        """The closing handshake, or the connection dropped if the close frame cannot even
        be sent: to a peer that reads nothing, every send waits (the hub's send timeout),
        this one too, and the library's close timeout starts only once it is sent."""
        try:
            async with asyncio.timeout(self._send_timeout_s + CLOSE_TIMEOUT_S):
                await self.websocket.close(code, reason)
        except TimeoutError:
            self.websocket.transport.abort()
            log.warning(
                "agent_connection_dropped",
                node_id=self.session.node_id,
                remote_address=self.session.remote_address,
                code=code,
                reason="the close could not be sent: the agent reads nothing",
            )

    async def answers_ping(self, timeout_s: float = LIVENESS_TIMEOUT_S) -> bool:
        """Whether the peer answers a ping within ``timeout_s``: False when it does not, or
        the connection is closing or closed."""
        if self._closing is not None:
            return False
        try:
            async with asyncio.timeout(timeout_s):
                pong = await self.websocket.ping()
                await pong
        except (TimeoutError, ConnectionClosed, OSError):
            return False
        return True

    def drop(self) -> None:
        """End the connection at once, without a closing handshake."""
        self.websocket.transport.abort()

    async def closed(self) -> None:
        """Wait for the closing handshake. Frames still arriving are read and dropped
        meanwhile: a peer that floods without reading would otherwise fill both ways and
        hold the connection until the close timeout."""
        if self._closing is None:
            return
        discarding = asyncio.create_task(self._discard_incoming())
        try:
            await self._closing
        finally:
            discarding.cancel()

    def how_it_ended(self) -> str:
        """How the connection ended, as its node's disconnection is recorded."""
        code, reason = self.websocket.close_code, self.websocket.close_reason
        if code is None:
            return "connection lost"
        return f"connection closed ({code}{': ' + reason if reason else ''})"

    async def _discard_incoming(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await self.websocket.recv()


def on_monotonic_clock(moment: datetime | None) -> float | None:
    """``moment`` (a certificate's expiry) as the sessions' ``monotonic()`` will read it."""
    if moment is None:
        return None
    return monotonic() + (moment - datetime.now(UTC)).total_seconds()
