"""The fold of nodes and their GPUs: registered, connected (with the GPUs a hello leaves
out), disconnected, lost, cordoned, drained and forgotten; GPUs marked unhealthy and
recovered, cordoned and uncordoned by an operator; and the strays an agent stopped, which
the node remembers and whose numbers the model counts."""

from __future__ import annotations

from msgspec.structs import replace

from app.domain.changes import GpuChanges, NodeChanges
from app.domain.envelope import Recorded
from app.domain.events import (
    Event,
    GpuCordoned,
    GpuInfo,
    GpuMarkedUnhealthy,
    GpuRecovered,
    GpuUncordoned,
    NodeConnected,
    NodeCordoned,
    NodeDisconnected,
    NodeDrainCancelled,
    NodeDrainFinished,
    NodeDrainRequested,
    NodeForgotten,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    StrayStopped,
)
from app.domain.evolve.updates import Handler, update_gpu, update_node
from app.domain.gpu_identity import same_gpu
from app.domain.state import (
    STRAYS_REMEMBERED,
    ClusterState,
    GpuCordon,
    Node,
    ReplicaPhase,
    stray_key,
)


def _node_registered(state: ClusterState, event: NodeRegistered, recorded: Recorded) -> None:
    at = recorded.recorded_at
    state.nodes[event.node_id] = Node(
        id=event.node_id,
        address=event.address,
        registered_at=at,
        labels=event.labels,
        gpus=event.gpus,
        agent_version=event.agent_version,
        port_range=event.port_range,
        last_change_at=at,
    )


def _node_connected(state: ClusterState, event: NodeConnected, recorded: Recorded) -> None:
    at = recorded.recorded_at
    node = state.nodes.get(event.node_id) or Node(
        id=event.node_id, address=event.address, registered_at=at
    )
    state.nodes[event.node_id] = replace(
        node,
        address=event.address,
        remote_address=event.remote_address,
        labels=event.labels,
        gpus=event.gpus,
        unlisted_gpus=_unlisted_gpus(node, event.gpus),
        agent_version=event.agent_version,
        port_range=event.port_range,
        certificate_serial=event.certificate_serial,
        connected=True,
        connected_position=node.connected_position if node.connected else recorded.position,
        lost=False,
        disconnect_reason=None,
        last_change_at=at,
        ports_held_elsewhere=(),
    )


UNLISTED_GPUS_KEPT = 64
"""Most GPUs left out of hellos a node keeps (``Node.unlisted_gpus``), the latest left
out: as many as a hello may list, so an agent listing other GPUs at each hello cannot grow
the state."""


def _unlisted_gpus(node: Node, listed: tuple[GpuInfo, ...]) -> tuple[GpuInfo, ...]:
    """The node's unhealthy GPUs that a hello listing ``listed`` leaves out, after those
    that earlier hellos left out and this one does not list either (oldest first). A GPU
    is known by its UUID (``app.domain.gpu_identity``): one listed again under another
    index is listed, and one whose index another GPU now has is left out."""

    def left_out(gpu: GpuInfo) -> bool:
        return not any(same_gpu(gpu, index=other.index, uuid=other.uuid) for other in listed)

    unlisted = {_identity(gpu): gpu for gpu in node.unlisted_gpus if left_out(gpu)}
    for gpu in node.gpus:
        if not gpu.healthy and left_out(gpu):
            unlisted.pop(_identity(gpu), None)
            unlisted[_identity(gpu)] = gpu
    return tuple(unlisted.values())[-UNLISTED_GPUS_KEPT:]


def _identity(gpu: GpuInfo) -> tuple[str, int | None]:
    """What a GPU is kept by among those left out: its UUID, or its index without one."""
    return (gpu.uuid, None) if gpu.uuid else ("", gpu.index)


DISCONNECT_REASON_KEPT = 500
"""The most characters of a disconnection's reason a node keeps, as many as a cordon's
reason may hold (``app.domain.free_text.MAX_REASON_LENGTH``): the hub words the reason,
but it may quote what a peer sent, and the state must stay small whatever that was. Its own
number, not that constant, because the fold's fingerprint reads this module's source."""


def _node_disconnected(state: ClusterState, event: NodeDisconnected, recorded: Recorded) -> None:
    at = recorded.recorded_at
    reason = _shortened(event.reason, DISCONNECT_REASON_KEPT)
    changes: NodeChanges = {"connected": False, "disconnect_reason": reason, "last_change_at": at}
    update_node(state, event.node_id, changes)


def _shortened(text: str, most: int) -> str:
    """``text``, or its first ``most - 1`` characters and "…" when it is longer than ``most``."""
    return text if len(text) <= most else f"{text[: most - 1]}…"


def _node_lost(state: ClusterState, event: NodeLost, recorded: Recorded) -> None:
    at = recorded.recorded_at
    update_node(state, event.node_id, {"connected": False, "lost": True, "last_change_at": at})


def _node_cordoned(state: ClusterState, event: NodeCordoned, recorded: Recorded) -> None:
    update_node(state, event.node_id, {"cordoned": True, "cordon_reason": event.reason})


_NO_DRAIN: NodeChanges = {
    "drain_id": None,
    "drain_grace_s": None,
    "drain_requested_at": None,
    "drain_began_with": (),
    "drain_cancelled_by": None,
}
"""A node's drain fields once it has none: its drain finished, or an uncordon ended it."""


def _node_uncordoned(state: ClusterState, event: NodeUncordoned, recorded: Recorded) -> None:
    update_node(
        state,
        event.node_id,
        {"cordoned": False, "cordon_reason": None, **_NO_DRAIN},
    )


def _node_drain_requested(
    state: ClusterState, event: NodeDrainRequested, recorded: Recorded
) -> None:
    at = recorded.recorded_at
    serving = (ReplicaPhase.SERVING, ReplicaPhase.DRAINING)
    began_with = sorted(
        r.id for r in state.replicas.values() if r.phase in serving and event.node_id in r.node_ids
    )
    update_node(
        state,
        event.node_id,
        {
            "cordoned": True,
            "cordon_reason": f"drain {event.drain_id}",
            "drain_id": event.drain_id,
            "drain_grace_s": event.grace_s,
            "drain_requested_at": at,
            "drain_began_with": tuple(began_with),
            "drain_cancelled_by": None,
        },
    )


def _node_drain_cancelled(
    state: ClusterState, event: NodeDrainCancelled, recorded: Recorded
) -> None:
    node = state.nodes.get(event.node_id)
    if node is not None and node.drain_id == event.drain_id:
        update_node(state, event.node_id, {"drain_cancelled_by": recorded.meta.actor})


def _node_drain_finished(state: ClusterState, event: NodeDrainFinished, recorded: Recorded) -> None:
    update_node(state, event.node_id, _NO_DRAIN)


def _node_forgotten(state: ClusterState, event: NodeForgotten, recorded: Recorded) -> None:
    """The node and all it held (GPU cordons, labels, ports held elsewhere, strays) go;
    its certificate revocations are not the node's and stay. Ended replicas that ran on it
    keep naming its id."""
    state.nodes.pop(event.node_id, None)


def _gpu_marked_unhealthy(
    state: ClusterState, event: GpuMarkedUnhealthy, recorded: Recorded
) -> None:
    changes: GpuChanges = {"healthy": False, "unhealthy_reason": event.reason}
    update_gpu(state, event.node_id, event.gpu_index, event.gpu_uuid, changes)


def _gpu_recovered(state: ClusterState, event: GpuRecovered, recorded: Recorded) -> None:
    changes: GpuChanges = {"healthy": True, "unhealthy_reason": None}
    update_gpu(state, event.node_id, event.gpu_index, event.gpu_uuid, changes)


def _gpu_cordoned(state: ClusterState, event: GpuCordoned, recorded: Recorded) -> None:
    """The GPU's cordon, replacing one it had (a new reason), last of the node's."""
    node = state.nodes.get(event.node_id)
    if node is None:
        return
    cordon = GpuCordon(
        index=event.gpu_index, uuid=event.gpu_uuid, reason=event.reason, by=recorded.meta.actor
    )
    kept = _cordons_of_other_gpus(node, event.gpu_index, event.gpu_uuid)
    update_node(state, event.node_id, {"gpu_cordons": (*kept, cordon)})


def _gpu_uncordoned(state: ClusterState, event: GpuUncordoned, recorded: Recorded) -> None:
    node = state.nodes.get(event.node_id)
    if node is not None:
        kept = _cordons_of_other_gpus(node, event.gpu_index, event.gpu_uuid)
        update_node(state, event.node_id, {"gpu_cordons": kept})


def _cordons_of_other_gpus(node: Node, index: int, uuid: str) -> tuple[GpuCordon, ...]:
    return tuple(c for c in node.gpu_cordons if not same_gpu(c, index=index, uuid=uuid))


STRAY_NUMBERS_BELIEVED = 1000
"""How far past a model's replica count a stray's number is taken as used (see
``_count_stray_number``)."""


def _stray_stopped(state: ClusterState, event: StrayStopped, recorded: Recorded) -> None:
    _remember_stray(state, event)
    _count_stray_number(state, event)


def _remember_stray(state: ClusterState, event: StrayStopped) -> None:
    node = state.nodes.get(event.node_id)
    if node is not None:
        key = stray_key(event.replica_id, event.shard_index, event.pid)
        strays = (*node.stray_stops, key)[-STRAYS_REMEMBERED:]
        state.nodes[event.node_id] = replace(node, stray_stops=strays)


def _count_stray_number(state: ClusterState, event: StrayStopped) -> None:
    """An engine named ``<model>-<n>`` ran, so ``n`` is taken even if the log never placed
    it: its placement was lost in a failover to a standby that had not received it. No new
    replica may take that id. A number far past the model's count is not believed: a node
    can name any, and must not be able to push the count anywhere it likes."""
    model = state.models.get(event.model)
    prefix = f"{event.model}-"
    if model is None or not event.replica_id.startswith(prefix):
        return
    digits = event.replica_id[len(prefix) :]
    if not (digits.isascii() and digits.isdigit()):
        return
    number = int(digits)
    if model.replicas_created < number <= model.replicas_created + STRAY_NUMBERS_BELIEVED:
        state.models[event.model] = replace(model, replicas_created=number)


HANDLERS: dict[type[Event], Handler] = {
    NodeRegistered: _node_registered,
    NodeConnected: _node_connected,
    NodeDisconnected: _node_disconnected,
    NodeLost: _node_lost,
    NodeCordoned: _node_cordoned,
    NodeUncordoned: _node_uncordoned,
    NodeDrainRequested: _node_drain_requested,
    NodeDrainCancelled: _node_drain_cancelled,
    NodeDrainFinished: _node_drain_finished,
    NodeForgotten: _node_forgotten,
    GpuMarkedUnhealthy: _gpu_marked_unhealthy,
    GpuRecovered: _gpu_recovered,
    GpuCordoned: _gpu_cordoned,
    GpuUncordoned: _gpu_uncordoned,
    StrayStopped: _stray_stopped,
}
"""The events this module folds, each with its handler."""
