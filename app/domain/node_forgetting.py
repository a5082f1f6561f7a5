"""Forgetting a node for good: a machine retired, rebuilt under another name, returned to
the cloud. Pure decisions, no I/O.

A forgotten node leaves the state (``node_forgotten``): ``nodes`` no longer lists it, and
placement, the reconciler and ``explain-placement`` no longer walk it. Its history stays
in the log, and so do the ended replicas that ran on it, which name it by id. An agent
that connects under its id later is registered anew, as a node never seen; revoking the
node's certificates (in the same request, or with ``llmgw-cli cert revoke --node``) keeps
it out.

Only a node nothing depends on can be forgotten: not connected (its agent stopped), with
no replica not ended on it (drained), and no drain of it under way. A refusal names every
one of those it met, so the operator learns the whole way at once.
"""

from __future__ import annotations

from app.domain.events import NodeForgotten, node_stream, replica_stream
from app.domain.free_text import reason_errors
from app.domain.model_spec import SpecError
from app.domain.node_operations import find_node, replicas_matching
from app.domain.operation_results import Change, InvalidOperation, InvalidText
from app.domain.revocations import RevocationRequest, checked, revoke
from app.domain.state import ACTIVE_PHASES, ClusterState, Node, Replica

REPLICAS_NAMED = 8
"""The replicas on a node a refused forget names; it counts the others."""


def forget(
    state: ClusterState, node_id: str, reason: str, *, revoke_certificates: bool = False
) -> Change:
    """Record that the node is gone for good, with ``revoke_certificates`` after a
    revocation of every certificate issued to it until now (both on the node's stream, in
    one append); or raise why it cannot be (``UnknownNode``, ``InvalidText``,
    ``InvalidOperation``)."""
    node = find_node(state, node_id)
    reason = reason.strip()
    errors = (
        reason_errors("reason", reason)
        if reason
        else [SpecError("reason", "say why the node is forgotten")]
    )
    if errors:
        raise InvalidText(f"the forgetting of node {node_id!r}", errors)
    refusals = _refusals(state, node)
    if refusals:
        raise InvalidOperation(
            f"node {node_id} cannot be forgotten: {'; '.join(refusals)}; nothing was recorded"
        )
    revoked = (
        revoke(state, checked(RevocationRequest(node_id=node_id, reason=reason))).events
        if revoke_certificates
        else ()
    )
    forgotten = NodeForgotten(node_id=node_id, reason=reason)
    return Change(stream=node_stream(node_id), events=(*revoked, forgotten))


def forget_overtaken(change: Change, state: ClusterState) -> str | None:
    """Whether a forget may still be recorded on ``state`` (the log as it is appended on,
    the forget folded in): None, or the stream of a replica placed on the node since the
    forget was decided. A placement is recorded on the replica's stream, which the node's
    version cannot say moved."""
    for event in change.events:
        if isinstance(event, NodeForgotten):
            for replica in _active_on(state, event.node_id):
                return replica_stream(replica.id)
    return None


def _refusals(state: ClusterState, node: Node) -> list[str]:
    refusals: list[str] = []
    if node.drain_id is not None:
        refusals.append(
            f"its drain {node.drain_id} is under way: let it finish "
            f"(`llmgw-cli drain-progress {node.drain_id}`)"
        )
    if node.connected:
        since = f" from {node.remote_address}" if node.remote_address else ""
        refusals.append(
            f"it is connected (agent {node.agent_version or 'of no version'}{since}): stop its "
            "agent first, with `--engines-on-exit stop` so that no engine outlives it"
        )
    active = _active_on(state, node.id)
    if active:
        named = ", ".join(r.id for r in active[:REPLICAS_NAMED])
        more = len(active) - REPLICAS_NAMED
        refusals.append(
            f"{len(active)} replica(s) not ended have a shard on it ({named}"
            f"{f', and {more} more' if more > 0 else ''}): drain it first "
            f"(`llmgw-cli drain {node.id}`)"
        )
    return refusals


def _active_on(state: ClusterState, node_id: str) -> list[Replica]:
    return [r for r in replicas_matching(state, node_id=node_id) if r.phase in ACTIVE_PHASES]
