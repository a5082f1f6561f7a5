"""What the agent reports about its shards, and what a hello may carry, in bytes.

A hello lists every shard the agent keeps (a ``ShardReport`` each), a heartbeat every
shard's state, and each change of a shard goes out as a ``shard_status``: the conversions
from the supervisor's records and changes are here.

If a hello grew past the message limit the control plane could not read it, and the node
could never connect again to be told to stop anything. ``wire.messages`` gives each shard
and each GPU a share of the limit; here the agent measures a shard before starting it
(``unreportable_refusal``), and cuts a GPU's texts, and a failed shard's reason, to fit
(``fit_text``).

Sizes are measured as the JSON that goes out: a character may take up to six bytes there
(a control character is escaped as ``\\u001f``), so counting characters is not enough.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import msgspec

from agent.engines import ShardChange, ShardRecord, ShardState
from wire.messages import (
    CONTROL_CHARACTER,
    MAX_FAILURE_CHARS,
    MAX_LISTED,
    MAX_PID,
    MAX_SHARD_REPORT_BYTES,
    MAX_TEXT_CHARS,
    HeartbeatShard,
    ShardReport,
    StartShard,
)
from wire.messages import ShardState as WireShardState
from wire.messages import ShardStatus as WireShardStatus

MAX_GPU_UUID_BYTES = 128
MAX_GPU_NAME_BYTES = 256
MAX_GPU_REASON_BYTES = MAX_TEXT_CHARS + 2
"""A GPU's texts as JSON, quotes included: a UUID is 40 characters and a name a few dozen;
a reason joined from many problems costs its tail (within ``MAX_TEXT_CHARS`` characters
too, which the wire checks). With the rest of a ``GpuReport`` they stay within
``MAX_GPU_REPORT_BYTES``."""

# The longest a report's own fields can be: a ten-digit pid, the longest state, and a
# start time with microseconds and a UTC offset.
_LONGEST_PID = MAX_PID
_LONGEST_STATE: WireShardState = "starting"
_LONGEST_START = datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=timezone(timedelta(hours=-12)))

_encoder = msgspec.json.Encoder()

_WIRE_STATES: dict[ShardState, WireShardState] = {
    ShardState.STARTING: "starting",
    ShardState.READY: "ready",
    ShardState.FAILED: "failed",
    ShardState.STOPPED: "stopped",
}


def json_bytes(value: object) -> int:
    return len(_encoder.encode(value))


def unreportable_refusal(command: StartShard) -> str | None:
    """Why the shard's reports could not be carried to the control plane (``ShardReport``
    bounds what a ``start_shard`` does not), or None. Started anyway, every hello would
    list a shard the control plane cannot decode: the node could never connect again, nor
    be told to stop the engine."""
    if command.shard_index >= MAX_LISTED:
        return (
            f"shard index {command.shard_index} is beyond what this agent can report "
            f"(at most {MAX_LISTED - 1})"
        )
    if len(command.model) > MAX_TEXT_CHARS:
        return (
            f"a model name of {len(command.model)} characters is longer than this agent can "
            f"report ({MAX_TEXT_CHARS})"
        )
    return shard_report_refusal(command)


def shard_report_refusal(command: StartShard) -> str | None:
    """Why the shard ``command`` starts would take too much of every hello, or None."""
    report = _report(command, pid=_LONGEST_PID, state=_LONGEST_STATE, started_at=_LONGEST_START)
    size = json_bytes(report)
    if size <= MAX_SHARD_REPORT_BYTES:
        return None
    return (
        f"the replica id and model name would take {size} bytes in every hello of this "
        f"node, more than the {MAX_SHARD_REPORT_BYTES} a shard may take "
        "(a node's hello must stay within the message limit with every shard it may run)"
    )


def fit_text(text: str, max_bytes: int) -> str:
    """``text``, cut at the end until it takes at most ``max_bytes`` as a JSON string."""
    if json_bytes(text) <= max_bytes:
        return text
    low, high = 0, len(text)  # the longest prefix that fits lies in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        if json_bytes(text[:middle]) <= max_bytes:
            low = middle
        else:
            high = middle
    return text[:low]


def wire_uuid(uuid: str) -> str:
    """A GPU's UUID as a hello lists it, and so as every health change must name it and as
    the control plane compares it (cut to ``MAX_GPU_UUID_BYTES``). A control character
    becomes U+FFFD: the wire refuses a name holding one (``wire.messages.Name``)."""
    return fit_text(CONTROL_CHARACTER.sub("\ufffd", uuid), MAX_GPU_UUID_BYTES)


def shard_report(record: ShardRecord, failure: str | None = None) -> ShardReport:
    """The hello's report of ``record``; a ``failed`` one says why (``failure``), as one
    line without control characters (each becomes U+FFFD, as the wire refuses them there),
    cut to the room its report has left of ``MAX_SHARD_REPORT_BYTES``: a long replica id
    and model name leave less of it, never more than the report may take."""
    report = _report(
        record, pid=record.pid, state=_WIRE_STATES[record.state], started_at=record.started_at
    )
    if failure is None or record.state is not ShardState.FAILED:
        return report
    line = CONTROL_CHARACTER.sub("\ufffd", failure[:MAX_FAILURE_CHARS])
    with_room = msgspec.structs.replace(report, failure="")
    fitted = fit_text(line, MAX_SHARD_REPORT_BYTES - json_bytes(with_room) + json_bytes(""))
    return msgspec.structs.replace(report, failure=fitted) if fitted else report


def _report(
    shard: StartShard | ShardRecord, *, pid: int, state: WireShardState, started_at: datetime
) -> ShardReport:
    """The report of ``shard``: a hello's, of a record, or the one a start command's shard
    is measured by before it starts. Both are built here, so that what is measured is what
    every hello will carry."""
    return ShardReport(
        replica_id=shard.replica_id,
        shard_index=shard.shard_index,
        model=shard.model,
        port=shard.port,
        gpus=shard.gpus,
        pid=pid,
        state=state,
        started_at=started_at,
    )


def heartbeat_shard(record: ShardRecord) -> HeartbeatShard:
    return HeartbeatShard(
        replica_id=record.replica_id,
        shard_index=record.shard_index,
        state=_WIRE_STATES[record.state],
    )


def shard_status(change: ShardChange, command_id: str | None) -> WireShardStatus | None:
    """The wire status for a supervisor change; None for a shard the agent never knew (a
    stop of an unknown shard has no port to report: its command result says enough)."""
    if change.port is None:
        return None
    return WireShardStatus(
        replica_id=change.replica_id,
        shard_index=change.shard_index,
        state=_WIRE_STATES[change.state],
        pid=change.pid,
        port=change.port,
        error=change.error,
        exit_code=change.exit_code,
        log_tail=change.log_tail,
        command_id=command_id,
        reason=change.reason,
        port_held_elsewhere=True if change.port_held_elsewhere else msgspec.UNSET,
    )
