"""One agent connection, as seen by the control plane: a sans-I/O state machine.

The asyncio shell feeds it what arrives (``receive``), the passing of time (``tick``) and
the end of the connection (``connection_lost``), and carries out the outputs it returns, in
order: ``Send`` a message, ``Close`` the connection, hand an ``Observe`` to the services.
The session never touches a socket or reads a clock; ``now`` is monotonic seconds.

::

    AWAITING_HELLO --hello, identity ok--> ACTIVE --timeout, protocol error, lost--> CLOSED
          |                          over budget, revoked, expired, not reading      ^
          +--anything else, bad identity, unvouched claims, timeout, protocol error,-+
             over budget, lost, expired

A hello is accepted only from the node the certificate names, advertising an address the
node can vouch for, with an inventory a machine can have (``app.hub.claims``); every
message counts against the connection's budget (``app.hub.budget``). A heartbeat's GPU
health changes and memory readings are passed on only for GPUs the hello listed, and one
that reads more memory used than its GPU has is refused, as such a hello is; the first
heartbeat that names others says which (``AgentHeartbeat.ignored_gpus``), so they are
logged once a connection.
A shard status keeps the command it names as its cause only if that command was sent to its
node (``app.hub.commands_sent``); otherwise it goes on without one, and the first such status
of a connection says which id it named (``ShardStatusReported.unsent_command_id``). A
command result says in the same way whether its command was sent to the node
(``CommandCompleted.sent``): only the answer to one sent can fail the shard it starts; of
the others, only the first of the connection is passed on (to be logged), since they
change nothing.
The connection is closed (1008) once its client certificate expires: the
handshake checked the certificate's dates only when it connected.
A closed session ignores every further input. An agent that said hello is reported gone
exactly once, however its connection ends, unless a newer connection replaced it.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import assert_never

import msgspec

from app.domain.egress import EngineNetworks
from app.hub.budget import BudgetMeter, MessageBudget
from app.hub.claims import (
    address_refusal,
    inventory_refusal,
    listed_gpu_changes,
    listed_memory_readings,
    memory_reading_refusal,
)
from app.hub.commands_sent import CommandsSent
from app.hub.shard_lives import ShardLives
from wire.errors import ProtocolError, SessionStateError
from wire.messages import (
    PROTOCOL_VERSION,
    AgentCommand,
    AgentMessage,
    CloseCode,
    CommandResult,
    Heartbeat,
    HeartbeatAck,
    Hello,
    ServerMessage,
    ShardStatus,
    StartShard,
    Welcome,
    decode_from_agent,
    fit_close_reason,
    message_type,
)
from wire.outputs import Close as Close
from wire.outputs import Send as Send
from wire.outputs import close_code_for

NODE_CERTIFICATE_KIND = "node"
CERTIFICATE_EXPIRED = "the client certificate expired; issue a new one for this node"


class SessionState(Enum):
    AWAITING_HELLO = auto()
    ACTIVE = auto()
    CLOSED = auto()


class PeerCertificate(msgspec.Struct, frozen=True, kw_only=True):
    """What the TLS layer verified about the client certificate."""

    common_name: str | None
    subject: str
    kind: str
    serial: str = ""
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()


# -- observations, for the services layer ------------------------------------------------


class AgentHello(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    hello: Hello
    remote_address: str
    certificate_serial: str = ""


class AgentHeartbeat(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    heartbeat: Heartbeat
    """With only the GPU health changes of GPUs the hello listed."""
    ignored_gpus: tuple[str, ...] = ()
    """GPUs the hello did not list whose changes were dropped (``7 (GPU-7)``): said on the
    first heartbeat of the connection that names any, empty on every other."""


class ShardStatusReported(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    status: ShardStatus
    """With a ``command_id`` only when that command was sent to the node."""
    unsent_command_id: str | None = None
    """The cause the status named though no command with that id was sent to the node,
    dropped from ``status``: said on the first such status of the connection, None on every
    other."""


class CommandCompleted(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    result: CommandResult
    sent: bool = False
    """Whether a command with the result's id was sent to the node (on any of its
    connections): a result of any other is the node's word about nothing it was asked."""


class IdentityMismatch(msgspec.Struct, frozen=True, kw_only=True):
    claimed_node_id: str
    certificate_subject: str
    remote_address: str
    reason: str
    certificate_serial: str = ""
    suppressed: int = 0
    """Refusals like this one that were not recorded since the last one (the hub's count)."""


class ConnectionRefused(msgspec.Struct, frozen=True, kw_only=True):
    """A connection that proved its node was refused (its hello) or cut off (its budget)."""

    node_id: str
    remote_address: str
    certificate_serial: str
    reason: str
    suppressed: int = 0
    over_budget: bool = False
    """Cut off for sending too much: the hub then refuses the node for a while."""


class AgentGone(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    reason: str


Observation = (
    AgentHello
    | AgentHeartbeat
    | ShardStatusReported
    | CommandCompleted
    | IdentityMismatch
    | ConnectionRefused
    | AgentGone
)


# -- outputs -----------------------------------------------------------------------------


class Observe(msgspec.Struct, frozen=True):
    observation: Observation


# Send and Close come from wire.outputs (the agent's session has the same two), re-exported here.
Output = Send[ServerMessage] | Close | Observe


def check_heartbeat_timing(interval_s: float, timeout_s: float) -> None:
    """Raise ``ValueError`` unless ``0 < interval_s < timeout_s``: an agent must have a
    chance to be heard before its silence counts against it."""
    if not 0 < interval_s < timeout_s:
        raise ValueError(
            f"need 0 < heartbeat_interval_s ({interval_s}) < heartbeat_timeout_s ({timeout_s})"
        )


class AgentSession:
    def __init__(
        self,
        *,
        peer: PeerCertificate | None,
        remote_address: str,
        require_identity: bool,
        heartbeat_interval_s: float,
        heartbeat_timeout_s: float,
        server_id: str,
        epoch: int,
        now: float,
        remote_host: str | None = None,
        budget: MessageBudget | None = None,
        engine_networks: EngineNetworks | None = None,
        commands_sent: CommandsSent | None = None,
        certificate_expires_at: float | None = None,
    ) -> None:
        """``commands_sent``: the commands sent to each node, shared by the connections of
        one hub (a status may answer a command sent on the node's previous connection).
        ``certificate_expires_at``: when the client certificate's validity ends, on the
        clock of ``now``."""
        check_heartbeat_timing(heartbeat_interval_s, heartbeat_timeout_s)
        self._peer = peer
        self._remote_address = remote_address
        self._remote_host = remote_host if remote_host is not None else _host(remote_address)
        self._budget = BudgetMeter(budget or MessageBudget(), now)
        self._engine_networks = engine_networks
        self._require_identity = require_identity
        self._heartbeat_interval_s = heartbeat_interval_s
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._server_id = server_id
        self._epoch = epoch
        self._state = SessionState.AWAITING_HELLO
        self._node_id: str | None = None
        self._last_heard = now
        self._listed_gpus: dict[int, str] = {}
        """The GPUs the hello listed, index to UUID."""
        self._gpu_memory_mib: dict[int, int] = {}
        """The memory of each GPU the hello listed, index to MiB."""
        self._said_ignored = False
        self._shard_lives = ShardLives()
        self._commands_sent = commands_sent or CommandsSent()
        self._said_unsent = False
        self._said_unsent_result = False
        self._certificate_expires_at = certificate_expires_at

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def node_id(self) -> str | None:
        """The node this connection speaks for, once its hello was accepted."""
        return self._node_id

    @property
    def remote_address(self) -> str:
        return self._remote_address

    @property
    def peer(self) -> PeerCertificate | None:
        return self._peer

    def receive(self, data: bytes | str, now: float) -> list[Output]:
        if self._state is SessionState.CLOSED:
            return []
        if self._expired(now):
            return self._close(CloseCode.POLICY_VIOLATION, CERTIFICATE_EXPIRED)
        self._last_heard = now
        over = self._budget.spend(len(data), now)
        if over is not None:
            return self._refuse(CloseCode.POLICY_VIOLATION, over, self._node_id, over_budget=True)
        try:
            message = decode_from_agent(data)
        except ProtocolError as exc:
            return self._close(close_code_for(exc), str(exc))
        if self._state is SessionState.AWAITING_HELLO:
            return self._greet(message)
        return self._handle(message)

    def tick(self, now: float) -> list[Output]:
        if self._state is SessionState.CLOSED:
            return []
        if self._expired(now):
            return self._close(CloseCode.POLICY_VIOLATION, CERTIFICATE_EXPIRED)
        silent_s = now - self._last_heard
        if silent_s <= self._heartbeat_timeout_s:
            return []
        if self._state is SessionState.AWAITING_HELLO:
            reason = f"no hello within {_secs(self._heartbeat_timeout_s)}s"
        else:
            reason = f"no heartbeat for {_secs(silent_s)}s"
        return self._close(CloseCode.TIMED_OUT, reason)

    def send_command(self, message: AgentCommand) -> list[Output]:
        if self._state is not SessionState.ACTIVE:
            raise SessionStateError(
                f"cannot send {message_type(message)} {message.command_id}: "
                f"the session is {self._state.name}, not ACTIVE"
            )
        assert self._node_id is not None, "an ACTIVE session knows its node"
        self._commands_sent.sent(self._node_id, message.command_id)
        if isinstance(message, StartShard):
            self._shard_lives.start_sent(message.replica_id, message.shard_index)
        return [Send(message)]

    def replaced(self) -> list[Output]:
        """A newer connection for the same node took over: close this one without
        reporting the node gone, since it is still connected."""
        if self._state is SessionState.CLOSED:
            return []
        self._state = SessionState.CLOSED
        return [Close(CloseCode.REPLACED, "replaced by a newer connection")]

    def connected_elsewhere(self, live_address: str) -> list[Output]:
        """The node's current connection, from ``live_address``, answered: two agents run
        with one certificate. Close this newer one, the node not reported gone (it never
        was connected through it)."""
        if self._state is SessionState.CLOSED:
            return []
        self._state = SessionState.CLOSED
        reason = (
            f"two agents run with node {self._node_id}'s certificate; stop one "
            f"(connected from {live_address}, which answers)"
        )
        return [Close(CloseCode.CONNECTED_ELSEWHERE, fit_close_reason(reason))]

    def not_reading(self, waited_s: float) -> list[Output]:
        """A message waited ``waited_s`` to be handed to the connection: the agent is not
        reading what it is sent (an honest one reads all the time). Close it, the node
        gone, so that no later command waits on it too."""
        if self._state is SessionState.CLOSED:
            return []
        reason = f"a message waited {_secs(waited_s)}s to be sent: the agent reads nothing"
        return self._close(CloseCode.TIMED_OUT, reason)

    def revoked(self, reason: str) -> list[Output]:
        """The certificate of this connection was revoked: close it (the node is gone)."""
        if self._state is SessionState.CLOSED:
            return []
        return self._close(CloseCode.POLICY_VIOLATION, reason)

    def connection_lost(self, reason: str, now: float) -> list[Output]:
        """The transport ended. ``now`` is accepted so every input is timed alike."""
        was_active = self._state is SessionState.ACTIVE
        self._state = SessionState.CLOSED
        if was_active and self._node_id is not None:
            return [Observe(AgentGone(node_id=self._node_id, reason=reason))]
        return []

    def _greet(self, message: AgentMessage) -> list[Output]:
        if not isinstance(message, Hello):
            return self._close(
                CloseCode.PROTOCOL_ERROR, f"expected hello, got {message_type(message)}"
            )
        mismatch = self._identity_mismatch(message.node_id)
        if mismatch is not None:
            self._state = SessionState.CLOSED
            return [
                Close(CloseCode.POLICY_VIOLATION, fit_close_reason(mismatch)),
                Observe(
                    IdentityMismatch(
                        claimed_node_id=message.node_id,
                        certificate_subject=self._peer.subject if self._peer else "",
                        remote_address=self._remote_address,
                        reason=mismatch,
                        certificate_serial=self._peer.serial if self._peer else "",
                    )
                ),
            ]
        impossible = inventory_refusal(message)
        if impossible is not None:
            return self._refuse(CloseCode.PROTOCOL_ERROR, impossible, message.node_id)
        unvouched = address_refusal(
            message.address,
            remote_host=self._remote_host,
            dns_names=self._peer.dns_names if self._peer else (),
            ip_addresses=self._peer.ip_addresses if self._peer else (),
            engine_networks=self._engine_networks,
        )
        if unvouched is not None:
            return self._refuse(CloseCode.POLICY_VIOLATION, unvouched, message.node_id)
        self._state = SessionState.ACTIVE
        self._node_id = message.node_id
        self._listed_gpus = {gpu.index: gpu.uuid for gpu in message.gpus}
        self._gpu_memory_mib = {gpu.index: gpu.memory_total_mib for gpu in message.gpus}
        self._shard_lives.listed(message.shards)
        welcome = Welcome(
            protocol_version=PROTOCOL_VERSION,
            heartbeat_interval_s=self._heartbeat_interval_s,
            server_id=self._server_id,
            epoch=self._epoch,
        )
        hello = AgentHello(
            node_id=message.node_id,
            hello=message,
            remote_address=self._remote_address,
            certificate_serial=self._peer.serial if self._peer else "",
        )
        return [Send(welcome), Observe(hello)]

    def _handle(self, message: AgentMessage) -> list[Output]:
        node_id = self._node_id
        assert node_id is not None, "an ACTIVE session knows its node"
        match message:
            case Heartbeat():
                readings = listed_memory_readings(self._listed_gpus, message.gpu_memory)
                impossible = memory_reading_refusal(self._gpu_memory_mib, readings)
                if impossible is not None:
                    return self._refuse(CloseCode.PROTOCOL_ERROR, impossible, node_id)
                if len(readings) != len(message.gpu_memory):
                    message = msgspec.structs.replace(message, gpu_memory=readings)
                return [
                    Observe(self._heartbeat(node_id, message)),
                    Send(HeartbeatAck(seq=message.seq)),
                ]
            case ShardStatus():
                out_of_turn = self._shard_lives.refusal(message)
                if out_of_turn is not None:
                    return self._close(CloseCode.PROTOCOL_ERROR, out_of_turn)
                return [Observe(self._shard_status(node_id, message))]
            case CommandResult():
                sent = self._commands_sent.knows(node_id, message.command_id)
                if not sent:
                    if self._said_unsent_result:
                        return []  # it changes nothing, and its line was written once
                    self._said_unsent_result = True
                return [Observe(CommandCompleted(node_id=node_id, result=message, sent=sent))]
            case Hello():
                return self._close(CloseCode.PROTOCOL_ERROR, "hello twice")
            case _:
                assert_never(message)

    def _heartbeat(self, node_id: str, heartbeat: Heartbeat) -> AgentHeartbeat:
        kept, others = listed_gpu_changes(self._listed_gpus, heartbeat.gpu_changes)
        if not others:
            return AgentHeartbeat(node_id=node_id, heartbeat=heartbeat)
        ignored: tuple[str, ...] = ()
        if not self._said_ignored:
            self._said_ignored = True
            ignored = tuple(sorted({f"{c.index} ({c.uuid})" for c in others}))
        return AgentHeartbeat(
            node_id=node_id,
            heartbeat=msgspec.structs.replace(heartbeat, gpu_changes=kept),
            ignored_gpus=ignored,
        )

    def _shard_status(self, node_id: str, status: ShardStatus) -> ShardStatusReported:
        cause = status.command_id
        if cause is None or self._commands_sent.knows(node_id, cause):
            return ShardStatusReported(node_id=node_id, status=status)
        unsent: str | None = None
        if not self._said_unsent:
            self._said_unsent = True
            unsent = cause
        return ShardStatusReported(
            node_id=node_id,
            status=msgspec.structs.replace(status, command_id=None),
            unsent_command_id=unsent,
        )

    def _identity_mismatch(self, node_id: str) -> str | None:
        if not self._require_identity:
            return None
        if self._peer is None:
            return "no client certificate"
        if self._peer.kind != NODE_CERTIFICATE_KIND:
            return f"a certificate of kind {self._peer.kind!r} cannot connect as a node"
        if self._peer.common_name != node_id:
            return (
                f"certificate common name {self._peer.common_name!r} "
                f"does not match node id {node_id!r}"
            )
        return None

    def _refuse(
        self, code: CloseCode, reason: str, node_id: str | None, *, over_budget: bool = False
    ) -> list[Output]:
        """Close, and say why for the record: the node is the one the hello named, or the
        one the certificate names when the connection never said hello."""
        outputs = self._close(code, reason)
        node = node_id or (self._peer.common_name if self._peer else None)
        if node:
            refusal = ConnectionRefused(
                node_id=node,
                remote_address=self._remote_address,
                certificate_serial=self._peer.serial if self._peer else "",
                reason=reason,
                over_budget=over_budget,
            )
            outputs.append(Observe(refusal))
        return outputs

    def _expired(self, now: float) -> bool:
        expires_at = self._certificate_expires_at
        return expires_at is not None and now >= expires_at

    def _close(self, code: CloseCode, reason: str) -> list[Output]:
        """Close for a reason of our own; an agent that had said hello is now gone."""
        outputs: list[Output] = [Close(code, fit_close_reason(reason))]
        if self._state is SessionState.ACTIVE and self._node_id is not None:
            outputs.append(Observe(AgentGone(node_id=self._node_id, reason=reason)))
        self._state = SessionState.CLOSED
        return outputs


def _host(remote_address: str) -> str:
    """The host of ``host:port`` or ``[v6]:port``."""
    host, _, port = remote_address.rpartition(":")
    if not host or not port.isdigit():
        return remote_address
    return host.removeprefix("[").removesuffix("]")


def _secs(seconds: float) -> str:
    return f"{seconds:.1f}".removesuffix(".0")
