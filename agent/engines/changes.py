"""Shard state changes: which transitions exist, and what is reported for each.

Pure: no processes, no clock. The supervisor asks ``can_transition`` before it changes a
state, so a late readiness answer cannot turn a failed engine back into a ready one.
"""

from __future__ import annotations

import signal

import msgspec

from agent.engines.records import ShardRecord, ShardState

LOG_TAIL_LINES = 100
"""The lines of an engine's log a failure or a stop carries (``wire.messages`` takes no
more)."""
REASON_TAIL_LINES = 1000
"""The lines of an engine's log searched for the reason it failed
(``wire.engines.failure_reason``): an abort's backtrace, or every worker's, can take more
than the ``LOG_TAIL_LINES`` reported, after the line that says why. The log tail reader
stops at 256 KiB whatever the count."""

_NEXT_STATES: dict[ShardState, frozenset[ShardState]] = {
    ShardState.STARTING: frozenset({ShardState.READY, ShardState.FAILED, ShardState.STOPPED}),
    ShardState.READY: frozenset({ShardState.FAILED, ShardState.STOPPED}),
    ShardState.FAILED: frozenset({ShardState.STOPPED}),
    ShardState.STOPPED: frozenset(),
}


class ShardChange(msgspec.Struct, frozen=True, kw_only=True):
    """One state change of one shard, as the agent reports it to the control plane."""

    replica_id: str
    shard_index: int
    state: ShardState
    model: str | None = None
    """The model the shard serves, where the agent has its record (for its log line)."""
    pid: int | None = None
    port: int | None = None
    error: str | None = None
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()
    reason: str | None = None
    """Why the agent stopped the shard of its own accord (``agent shutting down``); None
    for every other change, a stop the control plane asked for included."""
    port_held_elsewhere: bool = False
    """On ``failed``: a process that is not this engine was found listening on its port."""


def can_transition(current: ShardState, target: ShardState) -> bool:
    return target in _NEXT_STATES[current]


def change_of(
    record: ShardRecord,
    *,
    error: str | None = None,
    exit_code: int | None = None,
    log_tail: tuple[str, ...] = (),
    reason: str | None = None,
) -> ShardChange:
    """The change that reports ``record`` in its current state."""
    return ShardChange(
        replica_id=record.replica_id,
        shard_index=record.shard_index,
        state=record.state,
        model=record.model,
        pid=record.pid,
        port=record.port,
        error=error,
        exit_code=exit_code,
        log_tail=log_tail,
        reason=reason,
    )


def describe_exit(exit_code: int | None) -> str:
    """An error line for an engine that exited on its own. Negative codes are signals."""
    if exit_code is None:
        return "engine exited (exit code unknown: it is not a child of this agent process)"
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"engine was killed by {name}"
    return f"engine exited with code {exit_code}"
