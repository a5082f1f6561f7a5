"""The agent channel's wire messages, imported by the control plane and the agent alike.

Every message is a frozen msgspec struct sent as one JSON text frame: an object whose
``type`` field names it. These are wire types, kept apart from ``app.domain`` (the services
convert at the edge), so that changing the log's events never changes the wire.

Version rule: ``hello`` and ``welcome`` carry ``protocol_version``; a peer in another
version is refused with close code 1002, the reason naming both versions. Receivers ignore
fields they do not know, so adding an optional field needs no new version; removing,
renaming or retyping a field does. See docs/protocol.md for the full description.

Decoding raises the ``ProtocolError`` subclasses of ``wire.errors``.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import IntEnum
from typing import Annotated, Literal, TypeVar, get_args

import msgspec

from wire.errors import (
    MalformedMessage,
    MessageTooLarge,
    ProtocolError,
    UnknownMessageType,
    UnsupportedVersion,
)

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1024 * 1024
"""Largest message either side accepts or sends, as UTF-8 bytes of the JSON text."""
MAX_LOG_TAIL_LINES = 100
MAX_LOG_LINE_CHARS = 1000
MAX_ERROR_CHARS = 2000
"""What the agent cuts a log line and an error to (``agent.session``), so a status stays far
below the size limit whatever an engine prints; longer ones are malformed."""
MAX_CLOSE_REASON_BYTES = 123
"""A WebSocket close frame holds at most 125 bytes: the 2-byte code and the reason."""
MAX_STOP_GRACE_S = 3_600
"""Longest grace a ``stop_shard`` may give an engine: an hour, the bound a model spec's
``stop_grace_s`` has too (``app.domain.spec_bounds``). A stop that asks for more (or for
less than nothing) is malformed: the agent closes the connection rather than hold a shard
stopping for days, or for ever."""
MAX_PID = 2**31 - 1
"""Linux pids stop at 2**22 (``pid_max``); 2**31 - 1 is what the ``shards`` table's pid
column holds. A larger one reached the log and failed the append of every reconcile pass
that adopted it, stalling the whole cluster."""
MAX_EXIT_CODE = 255
"""An exit status is 0-255; minus a signal's number (down to -255) is a death by signal, as
Python's ``returncode`` says it."""
MAX_HEARTBEAT_SEQ = 2**63 - 1
"""An agent counts its heartbeats from 0 on each connection, one every interval: it would
take billions of years to reach this. Before, any integer msgspec read (a thousand digits)
was taken and echoed back in the ``heartbeat_ack``."""
MAX_XID = 65_535
"""NVIDIA's Xid codes are in the low hundreds; this leaves them room to grow."""


class CloseCode(IntEnum):
    GOING_AWAY = 1001  # the closing side is shutting down
    PROTOCOL_ERROR = 1002  # malformed, unknown or out-of-order message; version mismatch
    POLICY_VIOLATION = 1008  # the certificate does not match the node it claims
    MESSAGE_TOO_BIG = 1009  # over MAX_MESSAGE_BYTES
    REPLACED = 4001  # a newer connection for the same node took over
    TIMED_OUT = 4002  # no hello, welcome or heartbeat in time
    OVER_BUDGET = 4003  # more messages than the channel allows one connection
    TOO_OFTEN = 4004  # the node connected too often: retry later, at the slowest pace
    CONNECTED_ELSEWHERE = 4005  # the node's live connection answers: retry later, slowest pace


ShardState = Literal["starting", "ready", "failed", "stopped"]
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")
"""A C0 control character or DEL: what no name on the wire holds."""
NO_CONTROL_CHARACTERS = r"\A[^\x00-\x1f\x7f]*\Z"
"""What a name on the wire matches: no C0 control character and no DEL. A name is compared
with the log's copy of it, and the log keeps a NUL as U+FFFD (jsonb cannot hold one): a
shard named with a NUL never matched its own record, so the stray it was was recorded anew
at every reconcile pass, for ever. Free text (errors, log lines, reasons, a GPU's model
name) may hold any character: it is only shown, escaped (docs/security.md)."""
NonEmpty = Annotated[str, msgspec.Meta(min_length=1, max_length=512, pattern=NO_CONTROL_CHARACTERS)]
Index = Annotated[int, msgspec.Meta(ge=0)]
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
Mebibytes = Annotated[int, msgspec.Meta(ge=0)]
"""Sizes are checked against what a GPU can have at hello (``app.hub.claims``)."""
Pid = Annotated[int, msgspec.Meta(ge=1, le=MAX_PID)]
ExitCode = Annotated[int, msgspec.Meta(ge=-MAX_EXIT_CODE, le=MAX_EXIT_CODE)]
Xid = Annotated[int, msgspec.Meta(ge=0, le=MAX_XID)]
HeartbeatSeq = Annotated[int, msgspec.Meta(ge=0, le=MAX_HEARTBEAT_SEQ)]
AwareDatetime = Annotated[datetime, msgspec.Meta(tz=True)]
LogLine = Annotated[str, msgspec.Meta(max_length=MAX_LOG_LINE_CHARS)]
LogTail = Annotated[tuple[LogLine, ...], msgspec.Meta(max_length=MAX_LOG_TAIL_LINES)]
Error = Annotated[str, msgspec.Meta(max_length=MAX_ERROR_CHARS)]
MAX_TEXT_CHARS = 1024
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)]
"""Reasons and descriptions: generous, but bounded, so one field cannot be a megabyte."""
Name = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS, pattern=NO_CONTROL_CHARACTERS)]
"""A model's name, a GPU's UUID, an agent's version: bounded as text, and without control
characters, as every name the log compares."""
MAX_FAILURE_CHARS = 512
Failure = Annotated[str, msgspec.Meta(max_length=MAX_FAILURE_CHARS, pattern=NO_CONTROL_CHARACTERS)]
"""Why a shard a hello lists failed: one line, as the agent writes it (a control character
becomes U+FFFD, ``agent.reports``), bounded so that the report stays within its share of
the hello (``MAX_SHARD_REPORT_BYTES``: the agent cuts it to fit)."""
MAX_HOST_CHARS = 253
MAX_LABELS = 64
MAX_LABEL_KEY_CHARS = 63
MAX_LABEL_VALUE_CHARS = 256
"""What a hello's address and labels may hold; a hello beyond them is malformed, so the
agent refuses to start with settings beyond them (``agent.config_values``)."""
Host = Annotated[
    str, msgspec.Meta(min_length=1, max_length=MAX_HOST_CHARS, pattern=NO_CONTROL_CHARACTERS)
]
LabelKey = Annotated[
    str,
    msgspec.Meta(min_length=1, max_length=MAX_LABEL_KEY_CHARS, pattern=NO_CONTROL_CHARACTERS),
]
LabelValue = Annotated[
    str, msgspec.Meta(max_length=MAX_LABEL_VALUE_CHARS, pattern=NO_CONTROL_CHARACTERS)
]
Labels = Annotated[dict[LabelKey, LabelValue], msgspec.Meta(max_length=MAX_LABELS)]
MAX_LISTED = 4096
"""Most GPUs, shards or GPU indexes one message may list; the meaning of a hello is checked
against tighter limits (``app.hub.claims``)."""
MAX_SHARDS_PER_NODE = 1024
"""Most shards a hello may list (``app.hub.claims`` refuses one with more): an agent keeps
its running and its failed shards within it, or could never connect again."""
MAX_GPUS_PER_NODE = 64
"""Most GPUs a hello may list (``app.hub.claims`` refuses one with more). An agent that
finds more at its start refuses to start; one whose GPU source lists more later reports
the first 64 by index (``agent.gpu_limit``)."""
MAX_SHARD_REPORT_BYTES = 768
"""Most bytes one shard's ``ShardReport`` may take in a hello, as JSON. The agent refuses
to start a shard whose report could be larger (a long replica id or model name), so that
a hello of ``MAX_SHARDS_PER_NODE`` shards, ``MAX_GPUS_PER_NODE`` GPUs of at most
``MAX_GPU_REPORT_BYTES`` and the longest node id and labels still fits in
``MAX_MESSAGE_BYTES``: otherwise the node could never connect again (the sum is worked
out in tests/unit/test_hello_size.py)."""
MAX_GPU_REPORT_BYTES = 2048
"""Most bytes one ``GpuReport`` takes in a hello: the agent cuts a GPU's texts to fit."""
GPU_MEMORY_CHANGE_MIB = 256
"""The least change of a GPU's used memory an agent reports in a heartbeat: smaller ones
(an engine's allocator breathing) are not worth a reading, nor a placement's attention."""
GpuIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_LISTED)]
"""A GPU an agent reports: a node has at most 64 (``app.hub.claims``), numbered from 0."""
ShardIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_LISTED)]
"""A shard an agent reports: a replica has at most 64 (``app.domain.spec_bounds``)."""


class _Wire(msgspec.Struct, frozen=True, kw_only=True):
    """Base of the value types inside messages."""


class _Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every message. Tags are spelled out per class, so renaming a class never
    changes the wire."""


# -- values ------------------------------------------------------------------------------


class GpuReport(_Wire, frozen=True, kw_only=True):
    index: GpuIndex
    uuid: Name
    name: Text
    memory_total_mib: Mebibytes
    memory_used_mib: Mebibytes
    healthy: bool
    unhealthy_reason: Text | None = None


class ShardReport(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    """One shard the agent runs, as listed in its hello."""

    replica_id: NonEmpty
    shard_index: ShardIndex
    model: Name
    port: Port
    gpus: Annotated[tuple[GpuIndex, ...], msgspec.Meta(max_length=MAX_LISTED)]
    pid: Pid | None
    state: ShardState
    started_at: AwareDatetime
    failure: Failure | None = None
    """Why the shard failed, as its agent tells it: listed only with ``failed``. It is the
    node's claim, shown to operators as such and never taken for a decision. Left out when
    absent (``omit_defaults``), so a report without one is byte for byte what agents sent
    before the field existed; an older control plane ignores it."""


class GpuHealthChange(_Wire, frozen=True, kw_only=True):
    index: GpuIndex
    uuid: Name
    healthy: bool
    reason: Text | None = None
    xid: Xid | None = None


class GpuMemoryReading(_Wire, frozen=True, kw_only=True):
    """How much memory one GPU the hello listed has in use now, by every process on it."""

    index: GpuIndex
    uuid: Name
    used_mib: Mebibytes
    """At most the GPU's ``memory_total_mib`` as the hello said it: the hub refuses more
    (``app.hub.claims``)."""


class HeartbeatShard(_Wire, frozen=True, kw_only=True):
    replica_id: NonEmpty
    shard_index: ShardIndex
    state: ShardState


class Peer(_Wire, frozen=True, kw_only=True):
    """Another shard of the same replica, for engines that span several nodes."""

    shard_index: Index
    address: NonEmpty
    port: Port


# -- agent -> control plane --------------------------------------------------------------


class Hello(_Message, frozen=True, kw_only=True, tag="hello"):
    protocol_version: int
    node_id: NonEmpty
    agent_version: Name
    address: Host
    labels: Labels = {}
    port_range: tuple[Port, Port]
    gpus: Annotated[tuple[GpuReport, ...], msgspec.Meta(max_length=MAX_LISTED)] = ()
    shards: Annotated[tuple[ShardReport, ...], msgspec.Meta(max_length=MAX_LISTED)] = ()

    def __post_init__(self) -> None:
        low, high = self.port_range
        if low > high:
            raise ValueError(f"port_range [{low}, {high}] is empty")


class Heartbeat(_Message, frozen=True, kw_only=True, tag="heartbeat", omit_defaults=True):
    """``gpu_changes`` holds what changed since the previous heartbeat; ``shards`` the state
    of every shard the agent runs; ``gpu_memory`` the GPUs whose used memory changed by at
    least ``GPU_MEMORY_CHANGE_MIB`` since the agent last said it (in the hello or a
    heartbeat). Fields left at their default are left out (``omit_defaults``), so a quiet
    heartbeat stays small; every receiver reads a missing field as its default, and an older
    control plane ignores ``gpu_memory``."""

    seq: HeartbeatSeq
    gpu_changes: Annotated[tuple[GpuHealthChange, ...], msgspec.Meta(max_length=MAX_LISTED)] = ()
    shards: Annotated[tuple[HeartbeatShard, ...], msgspec.Meta(max_length=MAX_LISTED)] = ()
    gpu_memory: Annotated[
        tuple[GpuMemoryReading, ...], msgspec.Meta(max_length=MAX_GPUS_PER_NODE)
    ] = ()


class ShardStatus(_Message, frozen=True, kw_only=True, tag="shard_status"):
    """A shard changed state. ``command_id`` names the command that caused it, if any."""

    replica_id: NonEmpty
    shard_index: ShardIndex
    state: ShardState
    pid: Pid | None = None
    port: Port
    error: Error | None = None
    exit_code: ExitCode | None = None
    log_tail: LogTail = ()
    command_id: NonEmpty | None = None
    reason: Text | None = None
    """Why the agent stopped the shard of its own accord (``agent shutting down``): set only
    on ``stopped``, never on a stop the control plane asked for."""
    port_held_elsewhere: bool | msgspec.UnsetType = msgspec.UNSET
    """Set only on ``failed``: a process that is not this engine listens on ``port``, so a
    start there fails again until it goes. Left out unless true (``UNSET``, which is
    false), so every other status is byte for byte what agents sent before the field
    existed; absent from older agents' statuses (read as false), and ignored by older
    control planes."""


class CommandResult(_Message, frozen=True, kw_only=True, tag="command_result"):
    command_id: NonEmpty
    ok: bool
    error: Error | None = None


# -- control plane -> agent --------------------------------------------------------------


class Welcome(_Message, frozen=True, kw_only=True, tag="welcome"):
    protocol_version: int
    heartbeat_interval_s: Annotated[float, msgspec.Meta(gt=0)]
    server_id: str
    epoch: Index


class HeartbeatAck(_Message, frozen=True, kw_only=True, tag="heartbeat_ack"):
    """The control plane's answer to each heartbeat, so a silent server can be told apart
    from an idle one."""

    seq: HeartbeatSeq


class StartShard(_Message, frozen=True, kw_only=True, tag="start_shard"):
    command_id: NonEmpty
    replica_id: NonEmpty
    shard_index: Index
    model: str
    argv: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)]
    env: dict[str, str] = {}
    gpus: tuple[Index, ...]
    port: Port
    peers: tuple[Peer, ...] = ()
    engine: Annotated[str, msgspec.Meta(max_length=64)] = "vllm"
    """The engine's profile (``wire.engines``); a name the agent does not know gets the
    default engine's, and a control plane that sends none means the default."""


class StopShard(_Message, frozen=True, kw_only=True, tag="stop_shard"):
    command_id: NonEmpty
    replica_id: NonEmpty
    shard_index: Index
    grace_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_STOP_GRACE_S)]


AgentMessage = Hello | Heartbeat | ShardStatus | CommandResult
ServerMessage = Welcome | HeartbeatAck | StartShard | StopShard
AgentCommand = StartShard | StopShard


# -- codec -------------------------------------------------------------------------------


class _Envelope(msgspec.Struct, frozen=True):
    """Just enough of a message to explain why it did not decode."""

    type: str
    protocol_version: int | None = None


def _tags(union: object) -> frozenset[str]:
    return frozenset(cls.__struct_config__.tag for cls in get_args(union))


_AGENT_TYPES = _tags(AgentMessage)
_SERVER_TYPES = _tags(ServerMessage)
_encoder = msgspec.json.Encoder()
_agent_decoder = msgspec.json.Decoder(AgentMessage)
_server_decoder = msgspec.json.Decoder(ServerMessage)
_envelope_decoder = msgspec.json.Decoder(_Envelope)
MessageT = TypeVar("MessageT", AgentMessage, ServerMessage)


def encode(message: AgentMessage | ServerMessage) -> bytes:
    """JSON for ``message``; send it as a text frame. Raises ``MessageTooLarge`` rather than
    produce what the other side would refuse."""
    data = _encoder.encode(message)
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageTooLarge(len(data), MAX_MESSAGE_BYTES)
    return data


def decode_from_agent(data: bytes | str) -> AgentMessage:
    """The message an agent sent, or a ``ProtocolError`` saying what is wrong with it."""
    return _decode(data, _agent_decoder, _AGENT_TYPES, "the control plane", "hello")


def decode_from_server(data: bytes | str) -> ServerMessage:
    """The message the control plane sent, or a ``ProtocolError`` saying what is wrong."""
    return _decode(data, _server_decoder, _SERVER_TYPES, "an agent", "welcome")


def _decode(
    data: bytes | str,
    decoder: msgspec.json.Decoder[MessageT],
    receives: frozenset[str],
    receiver: str,
    handshake: str,
) -> MessageT:
    """One side's decoding: its size limit, its messages, and the version its handshake
    (``hello`` or ``welcome``) offers."""
    _check_size(data)
    try:
        message = decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise _explain(data, exc, receives, receiver, handshake) from exc
    except RecursionError as exc:
        raise _too_deep() from exc
    if isinstance(message, Hello | Welcome):
        _check_version(message.protocol_version)
    return message


def message_type(message: AgentMessage | ServerMessage) -> str:
    """The ``type`` a message carries on the wire."""
    return str(type(message).__struct_config__.tag)


def fit_close_reason(reason: str) -> str:
    """``reason`` cut to what a close frame can carry, never splitting a character."""
    encoded = reason.encode("utf-8", "replace")
    if len(encoded) <= MAX_CLOSE_REASON_BYTES:
        return reason
    return encoded[: MAX_CLOSE_REASON_BYTES - 3].decode("utf-8", "ignore") + "..."


def _check_size(data: bytes | str) -> None:
    if isinstance(data, str):
        # A character is at most four UTF-8 bytes, so only long text needs measuring.
        if len(data) * 4 <= MAX_MESSAGE_BYTES:
            return
        size = len(data.encode("utf-8", "surrogatepass"))
    else:
        size = len(data)
    if size > MAX_MESSAGE_BYTES:
        raise MessageTooLarge(size, MAX_MESSAGE_BYTES)


def _check_version(offered: int) -> None:
    if offered != PROTOCOL_VERSION:
        raise UnsupportedVersion(offered, PROTOCOL_VERSION)


def _too_deep() -> MalformedMessage:
    # No message nests more than a few levels; the decoder gives up on JSON nested past
    # the interpreter's recursion limit, which only a hostile peer sends.
    return MalformedMessage("malformed message: JSON nested too deeply")


def _explain(
    data: bytes | str,
    exc: msgspec.DecodeError,
    receives: frozenset[str],
    receiver: str,
    handshake: str,
) -> ProtocolError:
    """The precise error for a message that failed to decode. Runs only on failure, so the
    second parse costs nothing on the path every heartbeat takes."""
    if not isinstance(exc, msgspec.ValidationError):
        return MalformedMessage(f"not valid JSON: {exc}")
    try:
        envelope = _envelope_decoder.decode(data)
    except msgspec.DecodeError:
        return MalformedMessage(f"malformed message: {exc}")
    message_type = envelope.type
    if message_type not in receives:
        shown = repr(message_type[:40])
        if message_type in _AGENT_TYPES | _SERVER_TYPES:
            reason = f"{shown} is not a message {receiver} receives"
        else:
            reason = f"unknown message type {shown}"
        return UnknownMessageType(message_type, reason)
    offered = envelope.protocol_version
    if message_type == handshake and offered is not None and offered != PROTOCOL_VERSION:
        # Checked before the fields: another version may well have another shape.
        return UnsupportedVersion(offered, PROTOCOL_VERSION)
    return MalformedMessage(f"malformed {message_type}: {exc}")
