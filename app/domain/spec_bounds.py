"""The bounds on a spec's counts, sizes and times that more than one of its parts shares."""

from __future__ import annotations

# Every number of a spec is bounded: far beyond any real value, well inside what the tables'
# columns hold and what a float writes exactly in the log's JSON (a weight of 1e308 is
# stored as 1 and 308 zeros, which no longer reads back as the float that was recorded).
MAX_GPUS_PER_SHARD = 64
"""The most GPUs a node may report (``wire.messages.MAX_GPUS_PER_NODE``, kept equal by a
test): a shard runs on one node, so one asking for more could never be placed."""
MAX_SHARDS_PER_REPLICA = 64
MAX_REPLICAS = 10_000
MAX_GPU_MEMORY_GIB = 1024
"""The most memory a node may report of one GPU (``app.hub.claims.MAX_GPU_MEMORY_MIB``, kept
equal by a test): a shard asking for more could never be placed."""
DEFAULT_STARTUP_TIMEOUT_S = 600.0
MAX_STARTUP_TIMEOUT_S = 86_400
"""A day: the largest models load in well under an hour."""
MAX_STOP_GRACE_S = 3_600
"""An hour; an agent refuses a ``stop_shard`` with more (``wire.messages.MAX_STOP_GRACE_S``)."""
MAX_MOVES = MAX_REPLICAS
