"""The agent's side of one connection to the control plane: a sans-I/O state machine.

The reconnect loop builds one ``ServerSession`` per connection, calls ``opened`` once the
WebSocket is up, feeds it what arrives (``receive``), the passing of time (``tick``), the
end of engine commands (``command_finished``) and shard changes (``report_shard``), and
carries out the outputs in order: ``Send`` a message, ``Close`` the connection, ``Execute``
a command. ``now`` is monotonic seconds; the session never reads a clock.

::

    CONNECTING --opened--> AWAITING_WELCOME --welcome--> ACTIVE
                                  |                          |
                                  +--timeout, protocol error, lost--> CLOSED

Commands are idempotent by ``command_id``: a command seen before is not executed again;
its result, once known, is sent again instead. Pass the same ``CommandLedger`` to every
session of the agent's life so that this holds across reconnects too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from enum import Enum, auto
from typing import assert_never

import msgspec

from wire.errors import ProtocolError, SessionStateError
from wire.messages import (
    MAX_ERROR_CHARS,
    MAX_LOG_LINE_CHARS,
    MAX_LOG_TAIL_LINES,
    AgentCommand,
    AgentMessage,
    CloseCode,
    CommandResult,
    GpuHealthChange,
    GpuMemoryReading,
    Heartbeat,
    HeartbeatAck,
    HeartbeatShard,
    Hello,
    ServerMessage,
    ShardStatus,
    StartShard,
    StopShard,
    Welcome,
    decode_from_server,
    fit_close_reason,
    message_type,
)
from wire.outputs import Close as Close
from wire.outputs import Send as Send
from wire.outputs import close_code_for

REMEMBERED_COMMANDS = 1024


class SessionState(Enum):
    CONNECTING = auto()
    AWAITING_WELCOME = auto()
    ACTIVE = auto()
    CLOSED = auto()


class HeartbeatContent(msgspec.Struct, frozen=True, kw_only=True):
    """What the next heartbeat reports: GPU health changes since the last one, the state
    of every shard, and the GPUs whose used memory changed notably since last said."""

    gpu_changes: tuple[GpuHealthChange, ...] = ()
    shards: tuple[HeartbeatShard, ...] = ()
    gpu_memory: tuple[GpuMemoryReading, ...] = ()


class Execute(msgspec.Struct, frozen=True):
    command: AgentCommand


# Send and Close come from wire.outputs (the hub's session has the same two), re-exported here.
Output = Send[AgentMessage] | Close | Execute


class CommandLedger:
    """The commands this agent has seen, by id, with their results once known. Keeps the
    newest ``capacity`` ids; a command forgotten while still running is simply executed
    again if it is ever re-sent."""

    def __init__(self, capacity: int = REMEMBERED_COMMANDS) -> None:
        self._capacity = capacity
        self._results: OrderedDict[str, CommandResult | None] = OrderedDict()

    def __contains__(self, command_id: str) -> bool:
        return command_id in self._results

    def result(self, command_id: str) -> CommandResult | None:
        """The remembered result; None while the command runs or when it is unknown."""
        return self._results.get(command_id)

    def started(self, command_id: str) -> None:
        self._remember(command_id, None)

    def finished(self, result: CommandResult) -> None:
        self._remember(result.command_id, result)

    def _remember(self, command_id: str, result: CommandResult | None) -> None:
        self._results[command_id] = result
        self._results.move_to_end(command_id)
        while len(self._results) > self._capacity:
            self._results.popitem(last=False)


def _no_news() -> HeartbeatContent:
    return HeartbeatContent()


class ServerSession:
    def __init__(
        self,
        *,
        node_id: str,
        hello_factory: Callable[[], Hello],
        now: float,
        heartbeat_content: Callable[[], HeartbeatContent] = _no_news,
        welcome_timeout_s: float = 10.0,
        silent_server_intervals: int = 3,
        commands: CommandLedger | None = None,
    ) -> None:
        self._node_id = node_id
        self._hello_factory = hello_factory
        self._heartbeat_content = heartbeat_content
        self._welcome_timeout_s = welcome_timeout_s
        self._silent_server_intervals = silent_server_intervals
        self._commands = commands if commands is not None else CommandLedger()
        self._state = SessionState.CONNECTING
        self._welcome: Welcome | None = None
        self._last_heard = now
        self._next_heartbeat_at = now
        self._next_seq = 0

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def welcome(self) -> Welcome | None:
        """The control plane's welcome (interval, server id, epoch), once received."""
        return self._welcome

    def opened(self, now: float) -> list[Output]:
        if self._state is not SessionState.CONNECTING:
            raise SessionStateError(f"opened twice: the session is {self._state.name}")
        hello = self._hello_factory()
        if hello.node_id != self._node_id:
            raise ValueError(f"hello is for node {hello.node_id!r}, not {self._node_id!r}")
        self._state = SessionState.AWAITING_WELCOME
        self._last_heard = now
        return [Send(hello)]

    def receive(self, data: bytes | str, now: float) -> list[Output]:
        if self._state is SessionState.CLOSED:
            return []
        if self._state is SessionState.CONNECTING:
            raise SessionStateError("received a message before the connection was opened")
        self._last_heard = now
        try:
            message = decode_from_server(data)
        except ProtocolError as exc:
            return self._close(close_code_for(exc), str(exc))
        if self._state is SessionState.AWAITING_WELCOME:
            return self._welcomed(message, now)
        return self._handle(message)

    def tick(self, now: float) -> list[Output]:
        silent_s = now - self._last_heard
        if self._state is SessionState.AWAITING_WELCOME:
            if silent_s > self._welcome_timeout_s:
                return self._close(
                    CloseCode.TIMED_OUT, f"no welcome within {_secs(self._welcome_timeout_s)}s"
                )
            return []
        if self._state is not SessionState.ACTIVE:
            return []
        interval_s = self._interval_s()
        if silent_s > interval_s * self._silent_server_intervals:
            return self._close(
                CloseCode.TIMED_OUT, f"nothing from the server for {_secs(silent_s)}s"
            )
        if now < self._next_heartbeat_at:
            return []
        # Keep the cadence after a late tick, but never send a burst to catch up.
        self._next_heartbeat_at += interval_s
        if self._next_heartbeat_at <= now:
            self._next_heartbeat_at = now + interval_s
        return [Send(self._heartbeat())]

    def command_finished(self, command_id: str, ok: bool, error: str | None = None) -> list[Output]:
        result = CommandResult(
            command_id=command_id,
            ok=ok,
            error=None if error is None else _cut(error, MAX_ERROR_CHARS),
        )
        self._commands.finished(result)
        return [Send(result)] if self._state is SessionState.ACTIVE else []

    def report_shard(self, status: ShardStatus) -> list[Output]:
        """Nothing is queued while not ACTIVE: the next hello lists every shard."""
        if self._state is not SessionState.ACTIVE:
            return []
        return [Send(_fitted(status))]

    def connection_lost(self) -> list[Output]:
        self._state = SessionState.CLOSED
        return []

    def _welcomed(self, message: ServerMessage, now: float) -> list[Output]:
        if not isinstance(message, Welcome):
            return self._close(
                CloseCode.PROTOCOL_ERROR, f"expected welcome, got {message_type(message)}"
            )
        self._welcome = message
        self._state = SessionState.ACTIVE
        self._next_heartbeat_at = now + message.heartbeat_interval_s
        return []

    def _handle(self, message: ServerMessage) -> list[Output]:
        match message:
            case HeartbeatAck():
                return []
            case StartShard() | StopShard():
                return self._command(message)
            case Welcome():
                return self._close(CloseCode.PROTOCOL_ERROR, "welcome twice")
            case _:
                assert_never(message)

    def _command(self, command: AgentCommand) -> list[Output]:
        if command.command_id in self._commands:
            result = self._commands.result(command.command_id)
            return [] if result is None else [Send(result)]
        self._commands.started(command.command_id)
        return [Execute(command)]

    def _heartbeat(self) -> Heartbeat:
        content = self._heartbeat_content()
        seq = self._next_seq
        self._next_seq += 1
        return Heartbeat(
            seq=seq,
            gpu_changes=content.gpu_changes,
            shards=content.shards,
            gpu_memory=content.gpu_memory,
        )

    def _interval_s(self) -> float:
        assert self._welcome is not None, "an ACTIVE session was welcomed"
        return self._welcome.heartbeat_interval_s

    def _close(self, code: CloseCode, reason: str) -> list[Output]:
        self._state = SessionState.CLOSED
        return [Close(code, fit_close_reason(reason))]


def _fitted(status: ShardStatus) -> ShardStatus:
    lines = tuple(_cut(line, MAX_LOG_LINE_CHARS) for line in status.log_tail[-MAX_LOG_TAIL_LINES:])
    error = None if status.error is None else _cut(status.error, MAX_ERROR_CHARS)
    return msgspec.structs.replace(status, log_tail=lines, error=error)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _secs(seconds: float) -> str:
    return f"{seconds:.1f}".removesuffix(".0")
