"""The agent hub: the asyncio shell around ``AgentSession``, one per mTLS WebSocket.

For every connection the hub has it admitted (``app.hub.refusals``: a node's certificate,
not revoked, its node neither cut off nor connecting too often), feeds the session each
frame and the passing of time, and carries out what it returns, in order: ``Send`` goes out
as a text frame, ``Close`` closes the connection, ``Observe`` goes to the fleet service.
A ``ConnectionRegistry`` keeps which connection speaks for a node: a hello replaces it
unless it answers a ping (``Admission.live_elsewhere``). If the fleet service cannot record
what a connection observed (the database failed), that connection is closed with 1013 (try
again later) and one line logged: the agent's next hello says it all again.

Before any of that, a connection from an address that has as many TLS handshakes in
progress as it may is closed before its own starts (``app.hub.accepting``, ``app.hub.gate``).

A connection that misbehaves (garbage, binary frames, an oversized frame, an unknown
message, more than its budget) is closed and logged; the other connections and the server
carry on. A node cut off for its budget is refused for a while (``CoolDown``); refusals are
recorded as events at most once a minute per certificate (``RefusalThrottle``). When a
certificate is revoked, ``enforce_revocations`` closes the live connections that use it;
one whose certificate expires is closed by its session.

A message the agent does not read within ``SEND_TIMEOUT_S`` (its socket's buffers full)
drops its connection: a send never waits on a peer for longer, and only that node's own
later commands wait with it (the reconciler sends to each node apart,
``app.services.command_sending``).

``send_command`` takes the domain's commands (converted at the edge, ``app.hub.edge``) and
raises the domain's ``NodeNotConnected`` when the node has no live connection; what the
sessions observe reaches the handler as ``app.domain.reports``, converted there too.
"""

from __future__ import annotations

import asyncio
import ssl
from datetime import datetime
from time import monotonic
from typing import Protocol, assert_never

import structlog
from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode as WebSocketCloseCode

from app.domain.commands import CommandNotSent, NodeNotConnected, StartShard, StopShard
from app.domain.egress import EngineNetworks
from app.domain.reports import AgentReport
from app.hub.accepting import Accepting, format_address, host_of
from app.hub.arrivals import OpeningConnections
from app.hub.budget import MessageBudget
from app.hub.commands_sent import CommandsSent
from app.hub.connection import CLOSE_TIMEOUT_S, AgentConnection, on_monotonic_clock
from app.hub.edge import command_to_wire, report_of
from app.hub.gate import DEFAULT_PER_ADDRESS as DEFAULT_HANDSHAKES_PER_ADDRESS
from app.hub.gate import HandshakeGate
from app.hub.reconnects import ConnectLimits
from app.hub.refusals import Admission, CoolDown, RefusalThrottle, RevocationCheck
from app.hub.registry import ConnectionRegistry
from app.hub.session import (
    AgentGone,
    AgentHeartbeat,
    AgentHello,
    AgentSession,
    Close,
    ConnectionRefused,
    IdentityMismatch,
    Observation,
    Observe,
    Output,
    Send,
    SessionState,
    ShardStatusReported,
    check_heartbeat_timing,
)
from app.listeners.binding import CannotListen
from app.store.errors import FencedError, StoreError
from wire.errors import ProtocolError, SessionStateError
from wire.messages import CloseCode, encode

DEFAULT_HEARTBEAT_INTERVAL_S = 5.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 15.0
MAX_TICK_S = 1.0
DEPOSED_REASON = "this server no longer leads; connect to another"
"""Why a deposed leader closes an agent's connection (with 1013, try again later): agents
dial their other servers, the new leader among them."""
UNRECORDED_REASON = "the control plane could not record what this node said; reconnect"
"""Why the hub closes an agent's connection when the database failed to record one of its
reports (unreachable, or an append of unknown outcome): with 1013, try again later. The
agent's next hello says again all that it runs, and that is recorded as usual."""

SEND_TIMEOUT_S = 2.0
"""How long sending one message may wait for its agent to read what it was sent before.
Once a peer that reads nothing has filled its socket's buffers, every send to it waits,
the keepalive's pings and the close frame included, for as long as the peer likes: the
reconciler, which sends every node's commands in turn, waited with it and no node was sent
a command again, and the peer's own connection was never timed out. Past this, its
connection is dropped (its close, 4002, is queued behind what it does not read) and the
message counts as not sent.
An honest agent reads all the time, and a command of 1 MiB, the channel's largest, leaves
within it over 4 Mbit/s and more."""

TLS_HANDSHAKE_TIMEOUT_S = 60.0
"""How long the hub gives a peer's TLS handshake (asyncio's default, written down because
a connection still opening is counted for as long: ``app.hub.arrivals``)."""
log = structlog.get_logger(__name__)


class ReportHandler(Protocol):
    """What the hub hands agents' reports to: the control plane's live view."""

    async def handle(self, report: AgentReport) -> None: ...


class AgentNotReading(Exception):
    """A message to an agent waited ``send_timeout_s`` to be sent: its connection was
    dropped."""

    def __init__(self, node_id: str | None) -> None:
        super().__init__(f"{node_id or 'an agent'} reads nothing it is sent")


class AgentHub:
    def __init__(
        self,
        handler: ReportHandler,
        ssl_context: ssl.SSLContext,
        *,
        require_identity: bool = True,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
        server_id: str = "llmgw-server",
        epoch: int = 0,
        budget: MessageBudget | None = None,
        revocations: RevocationCheck | None = None,
        refusals: RefusalThrottle | None = None,
        cool_down: CoolDown | None = None,
        engine_networks: EngineNetworks | None = None,
        connects: ConnectLimits | None = None,
        handshakes_per_address: int = DEFAULT_HANDSHAKES_PER_ADDRESS,
        send_timeout_s: float = SEND_TIMEOUT_S,
    ) -> None:
        check_heartbeat_timing(heartbeat_interval_s, heartbeat_timeout_s)
        self._send_timeout_s = send_timeout_s
        self._handler = handler
        self._require_identity = require_identity
        self._heartbeat_interval_s = heartbeat_interval_s
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._tick_s = min(MAX_TICK_S, heartbeat_timeout_s / 10)
        self._server_id = server_id
        self._epoch = epoch
        self._budget = budget or MessageBudget()
        self._engine_networks = engine_networks
        self._admission = Admission(
            handler.handle,
            revocations=revocations,
            refusals=refusals,
            cool_down=cool_down,
            connects=connects,
        )
        self._registry: ConnectionRegistry[AgentConnection] = ConnectionRegistry()
        self._served: set[AgentConnection] = set()
        """Every connection past its certificate checks, with or without a hello: the ones a
        revocation must reach (the registry knows only those that said hello)."""
        self._commands_sent = CommandsSent()
        """What each node was sent, over its connections: the causes its statuses may name."""
        self._opening = OpeningConnections(TLS_HANDSHAKE_TIMEOUT_S)
        self._accepting = Accepting(
            ssl_context,
            HandshakeGate(handshakes_per_address),
            self._opening,
            handshake_timeout_s=TLS_HANDSHAKE_TIMEOUT_S,
            close_timeout_s=CLOSE_TIMEOUT_S,
        )
        self._server: Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host``:``port`` (0 picks a free port); returns the port. Raises
        ``CannotListen`` when it cannot bind them."""
        try:
            self._server = await self._accepting.listen(self._serve_connection, host, port)
        except OSError as exc:
            raise CannotListen("agent hub (--agent-host, --agent-port)", host, port, exc) from exc
        bound = self.port
        log.info("agent_hub_listening", host=host, port=bound)
        return bound

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the agent hub is not started")
        port: int = next(iter(self._server.sockets)).getsockname()[1]
        return port

    async def stop(self) -> None:
        """Close every connection (1001) and wait until each is accounted for."""
        if self._server is None:
            return
        self._server.close()
        self._accepting.stop()
        await self._server.wait_closed()
        self._server = None
        log.info("agent_hub_stopped")

    def connected_nodes(self) -> list[str]:
        return self._registry.connected_nodes()

    def connections_opening(self) -> int:
        """Connections accepted whose TLS and WebSocket handshakes have not finished: agents
        still arriving (they keep the adoption grace open)."""
        return self._opening.count(monotonic())

    def handshakes_refused(self) -> int:
        """Connections closed before their TLS handshake since the hub was made: their
        address had as many handshakes in progress as it may (``app.hub.gate``)."""
        return self._accepting.gate.refused

    def earliest_certificate_end(self) -> datetime | None:
        """When the first of the connected agents' certificates ends (its agent is cut off
        then), or None with no agent connected."""
        ends = [c.certificate_ends_at for c in self._registry.connections()]
        return min((end for end in ends if end is not None), default=None)

    def connected_elsewhere(self) -> int:
        """Hellos refused since the hub was made because their node's connection still
        answered: two agents with one node's certificate (``Admission.live_elsewhere``)."""
        return self._admission.connected_elsewhere

    def certificates_refused(self) -> int:
        """TLS handshakes that failed on the node certificate since the hub was made: expired,
        not yet valid, not issued by the CA (logged as ``agent_certificate_refused``)."""
        return self._accepting.certificates_refused

    async def send_command(self, node_id: str, command: StartShard | StopShard) -> None:
        """Send ``command`` on the node's current connection; raises ``NodeNotConnected``
        when there is none, it closes under the send, or its agent reads nothing (the send
        waited ``send_timeout_s``: the connection is then dropped)."""
        connection = self._registry.get(node_id)
        if connection is None:
            raise NodeNotConnected(node_id)
        try:
            outputs = connection.session.send_command(command_to_wire(command))
            await self._carry_out(connection, outputs)
        except (SessionStateError, ConnectionClosed, AgentNotReading) as exc:
            raise NodeNotConnected(node_id) from exc
        except ProtocolError as exc:  # too large a message for the channel, say
            raise CommandNotSent(f"{command.command_id} to {node_id}: {exc}") from exc

    async def enforce_revocations(self) -> int:
        """Close every live connection whose certificate is now revoked; returns how many.

        Those still waiting for their hello too: one checked just before the revocation
        would otherwise be welcomed after it, and kept for as long as its agent likes."""
        closed = 0
        for connection in list(self._served):
            reason = self._admission.revoked(connection.certificate)
            if reason is None:
                continue
            outputs = connection.session.revoked(reason)
            if not outputs:
                continue  # closed already
            closed += 1
            node_id = connection.session.node_id or connection.certificate.common_name
            log.warning("agent_certificate_revoked", node_id=node_id)
            await self._carry_out(connection, outputs)
            await self._admission.record(
                IdentityMismatch(
                    claimed_node_id=node_id,
                    certificate_subject=connection.session.peer.subject
                    if connection.session.peer
                    else "",
                    remote_address=connection.session.remote_address,
                    reason=reason,
                    certificate_serial=connection.certificate.serial,
                )
            )
        return closed

    # -- one connection ------------------------------------------------------------------

    async def _serve_connection(self, websocket: ServerConnection) -> None:
        self._opening.finished(id(websocket))
        remote = format_address(websocket.remote_address)
        # Every line about this connection names its peer; the node, once it says hello.
        with structlog.contextvars.bound_contextvars(remote_address=remote):
            await self._serve_peer(websocket, remote)

    async def _serve_peer(self, websocket: ServerConnection, remote: str) -> None:
        admitted = await self._admission.admit(websocket, remote)
        if admitted is None:
            return
        session = AgentSession(
            peer=admitted.peer,
            remote_address=remote,
            remote_host=host_of(websocket.remote_address),
            require_identity=self._require_identity,
            heartbeat_interval_s=self._heartbeat_interval_s,
            heartbeat_timeout_s=self._heartbeat_timeout_s,
            server_id=self._server_id,
            epoch=self._epoch,
            now=monotonic(),
            budget=self._budget,
            engine_networks=self._engine_networks,
            commands_sent=self._commands_sent,
            certificate_expires_at=on_monotonic_clock(admitted.expires_at),
        )
        connection = AgentConnection(
            websocket, session, admitted.certificate, self._send_timeout_s, admitted.expires_at
        )
        # Nothing awaited since the revocation check: a revocation enforced from here on
        # finds this connection.
        self._served.add(connection)
        try:
            await self._converse(connection)
        except (ConnectionClosed, AgentNotReading):
            pass  # the agent went away, or was dropped: _end below reports it gone
        except FencedError as exc:
            # Another leader took over: this server steps down, its agents go to that one.
            log.warning("agent_connection_closed_deposed", reason=str(exc))
            connection.close(WebSocketCloseCode.TRY_AGAIN_LATER, DEPOSED_REASON)
        except StoreError as exc:
            log.warning("agent_connection_closed_unrecorded", error=str(exc))
            connection.close(WebSocketCloseCode.TRY_AGAIN_LATER, UNRECORDED_REASON)
        except Exception:
            log.exception("agent_connection_failed")
            connection.close(WebSocketCloseCode.INTERNAL_ERROR, "internal error")
        finally:
            self._served.discard(connection)
            await self._end(connection)

    async def _converse(self, connection: AgentConnection) -> None:
        session = connection.session
        while session.state is not SessionState.CLOSED:
            try:
                async with asyncio.timeout(self._tick_s):
                    frame = await connection.websocket.recv()
            except TimeoutError:
                await self._carry_out(connection, session.tick(monotonic()))
                continue
            if isinstance(frame, bytes):
                reason = "binary frames are not part of the protocol; send JSON text"
                await self._carry_out(connection, [Close(CloseCode.PROTOCOL_ERROR, reason)])
                return
            await self._carry_out(connection, session.receive(frame, monotonic()))

    async def _end(self, connection: AgentConnection) -> None:
        try:
            await connection.closed()
            reason = connection.how_it_ended()
            await self._carry_out(
                connection, connection.session.connection_lost(reason, monotonic())
            )
        except StoreError as exc:
            # The reconciler's next pass records it: the log says the node is connected,
            # and the live view no longer has it (``replica_outcomes.nodes_gone``).
            log.warning("agent_disconnect_unrecorded", error=str(exc))
        except Exception:
            log.exception("agent_connection_end_failed")

    async def _carry_out(self, connection: AgentConnection, outputs: list[Output]) -> None:
        for output in outputs:
            match output:
                case Send(message=message):
                    await self._send(connection, encode(message))
                case Close(code=code, reason=reason):
                    _log_close(connection.session, code, reason)
                    connection.close(code, reason)
                case Observe(observation=observation):
                    await self._observe(connection, observation)
                case _:
                    assert_never(output)

    async def _send(self, connection: AgentConnection, data: bytes) -> None:
        """Send ``data`` as a text frame, waiting at most ``send_timeout_s`` for the agent
        to read what it was sent before; past that, drop the connection (the node is gone)
        and raise ``AgentNotReading``."""
        try:
            async with asyncio.timeout(self._send_timeout_s):
                await connection.websocket.send(data, text=True)
        except TimeoutError as exc:
            dropped = connection.session.not_reading(self._send_timeout_s)
            await self._carry_out(connection, dropped)
            connection.drop()  # the close frame would wait behind what it does not read
            raise AgentNotReading(connection.session.node_id) from exc

    async def _observe(self, connection: AgentConnection, observation: Observation) -> None:
        match observation:
            case AgentHello(node_id=node_id):
                structlog.contextvars.bind_contextvars(node_id=node_id)
                if await self._admission.live_elsewhere(connection, self._registry.get(node_id)):
                    return
                previous = self._registry.register(node_id, connection)
                if previous is not None:
                    await self._carry_out(previous, previous.session.replaced())
                replaced = previous is not None
                log.info("agent_connected", replaced_previous=replaced)
                await self._handler.handle(report_of(observation, replaced_previous=replaced))
            case AgentGone(node_id=node_id, reason=reason):
                if not self._registry.unregister(node_id, connection):
                    return  # a newer connection speaks for the node now
                log.info("agent_disconnected", reason=reason)
                await self._handler.handle(report_of(observation))
            case AgentHeartbeat(ignored_gpus=ignored) if ignored:
                log.warning(
                    "agent_gpu_changes_ignored",
                    gpus=list(ignored),
                    reason="health changes of GPUs its hello did not list (index and UUID)",
                )
                await self._handler.handle(report_of(observation))
            case ShardStatusReported(unsent_command_id=unsent) if unsent:
                log.info(
                    "agent_causation_ignored",
                    command_id=unsent,
                    reason="the status named a command this control plane did not send the "
                    "node (another leader's, or none); recorded without a cause",
                )
                await self._handler.handle(report_of(observation))
            case ConnectionRefused(over_budget=True, node_id=node_id):
                self._admission.cut_off(node_id)
                await self._admission.record(observation)
            case IdentityMismatch() | ConnectionRefused():
                await self._admission.record(observation)
            case _:
                await self._handler.handle(report_of(observation))


def _log_close(session: AgentSession, code: CloseCode, reason: str) -> None:
    # Named, not from the context: the connection closed may not be the calling task's.
    fields = {"node_id": session.node_id, "remote_address": session.remote_address}
    if code in (CloseCode.REPLACED, CloseCode.TIMED_OUT):
        log.info("agent_connection_closing", code=int(code), reason=reason, **fields)
    else:
        log.warning("agent_connection_closing", code=int(code), reason=reason, **fields)
