"""What a hello may carry about each shard and GPU, in bytes, so that it always fits.

A hello lists every shard the agent keeps and every GPU. If it grew past the message
limit the control plane could not read it, and the node could never connect again to be
told to stop anything. ``wire.messages`` gives each shard and each GPU a share of the
limit; here the agent measures a shard before starting it, and cuts a GPU's texts to fit.

Sizes are measured as the JSON that goes out: a character may take up to six bytes there
(a control character is escaped as ``\\u001f``), so counting characters is not enough.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import msgspec

from wire.messages import (
    MAX_PID,
    MAX_SHARD_REPORT_BYTES,
    MAX_TEXT_CHARS,
    ShardReport,
    ShardState,
    StartShard,
)

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
_LONGEST_STATE: ShardState = "starting"
_LONGEST_START = datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=timezone(timedelta(hours=-12)))

_encoder = msgspec.json.Encoder()


def json_bytes(value: object) -> int:
    return len(_encoder.encode(value))


def shard_report_refusal(command: StartShard) -> str | None:
    """Why the shard ``command`` starts would take too much of every hello, or None."""
    report = ShardReport(
        replica_id=command.replica_id,
        shard_index=command.shard_index,
        model=command.model,
        port=command.port,
        gpus=command.gpus,
        pid=_LONGEST_PID,
        state=_LONGEST_STATE,
        started_at=_LONGEST_START,
    )
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
