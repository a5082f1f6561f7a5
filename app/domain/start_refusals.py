"""What an agent's answer to a command means for the log: a start its node refused fails the
shard at once, with the node's reason. Pure.

An agent judges a ``start_shard`` before it launches anything (its port range, its GPUs,
the ports its other engines hold) and answers a start it will not carry out with a failed
``command_result``. Nothing runs then, and nothing ever will: the agent answers the same
start again with the result it remembers. Left to itself, the replica would wait out its
startup timeout (minutes) and end as ``timed out``, hiding the node's reason; failed here,
it takes the failure path at once (the model's backoff, a replacement), and its history
says ``start refused: port 21000 is ...``.

A node is not trusted with more than its own shards. An answer counts only when:

- this control plane sent that node a command with its id (``CommandAnswered.sent``, which
  the agent hub knows, as it knows the causes a shard status may name);
- the id is the start of a shard the log places on that node (``start-<replica>-<shard>``);
- that shard is still to start: placed, or stopped by its agent and to be started again,
  in a replica placed or starting. A shard that reported starting was launched, and what
  becomes of it is its status's to say (a refusal of a start re-sent while it runs is
  the agent's memory of another start); one that serves, failed or stopped has moved on.

Anything else (an id never sent, another node's shard, a shard that has progressed, a
success) records nothing: the answer costs its node one log line
(``agent_command_completed``). A failure the log already has is not recorded twice,
whichever of the answer and the agent's failed status comes first.

A stop's failure records nothing either: a stop's outcome is what the node reports of
the engine afterwards (stopped, or still running, when it is sent the stop again), and its
replica is ending already, by plan, whatever the answer says.

A shard placed at a port outside its node's port range as the log knows it (the agent
came back with another ``--port-range``, and refuses that start) is left to rule 5 of the
reconciler (``app.domain.ports_out_of_range``): its replica is stopped and replaced within
the range without backoff, since nothing failed but the placement.
"""

from __future__ import annotations

from app.domain.commands import start_command_id
from app.domain.events import ShardFailed, replica_stream
from app.domain.reports import CommandAnswered
from app.domain.state import NOT_SERVING_YET, ClusterState, Replica, Shard, ShardPhase

MAX_REFUSAL_CHARS = 500
"""The most characters of a node's reason that the log keeps (a line or two, as tables and
log lines show whole); a longer one is cut, ending in ``...``."""


def refused_start(state: ClusterState, answer: CommandAnswered) -> list[tuple[str, ShardFailed]]:
    """``shard_failed`` on the replica's stream when ``answer`` is its node's refusal of a
    start the shard still waits for; nothing otherwise."""
    if answer.ok or not answer.sent:
        return []
    found = _started_by(state, answer.node_id, answer.command_id)
    if found is None:
        return []
    replica, shard = found
    if replica.phase not in NOT_SERVING_YET or not _waits_to_start(shard):
        return []
    if _outside_range(state, shard):
        return []
    failed = ShardFailed(
        replica_id=replica.id,
        shard_index=shard.index,
        node_id=shard.node_id,
        error=f"start refused: {_reason(answer.error)}",
    )
    return [(replica_stream(replica.id), failed)]


def _started_by(state: ClusterState, node_id: str, command_id: str) -> tuple[Replica, Shard] | None:
    """The shard placed on ``node_id`` whose start has the id ``command_id``, if any. The id
    is matched whole against the ones the control plane gives starts, never parsed into a
    number: a node names what it likes."""
    replica_id = command_id.removeprefix("start-").rpartition("-")[0]
    replica = state.replicas.get(replica_id)
    if replica is None:
        return None
    for shard in replica.shards:
        if shard.node_id == node_id and start_command_id(replica.id, shard.index) == command_id:
            return replica, shard
    return None


def _waits_to_start(shard: Shard) -> bool:
    return shard.phase is ShardPhase.PLACED or shard.stopped_by_agent


def _outside_range(state: ClusterState, shard: Shard) -> bool:
    node = state.nodes.get(shard.node_id)
    if node is None:
        return False
    low, high = node.port_range
    return not low <= shard.port <= high


def _reason(error: str | None) -> str:
    text = (error or "").strip() or "no reason given"
    if len(text) <= MAX_REFUSAL_CHARS:
        return text
    return text[: MAX_REFUSAL_CHARS - 3] + "..."
