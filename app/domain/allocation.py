"""Which GPU and which port of which node each replica holds, as the log says.

A shard holds its GPUs and port while its replica is active (placed through stopping).
An ended replica (stopped, failed, timed out, lost) releases them in the log at once: its
stop command is already on its way, and the replacement must be placeable on the same node.
But an engine its node still reports running holds them until the node reports it gone
(``hold_running``): a stray stopped with a grace, or an ended replica's engine on its way
out. Placed under it, a replacement's start would be refused (the port in use, so the
replica fails and its model backs off) or would start on a GPU the old engine still fills.

How much memory a GPU has in use is the node's latest word: the reading its heartbeats
carried since its hello (``NodeReport.gpu_memory_used_mib``), else the hello's
(``Node.gpus``). The hello's alone would go stale: an engine stopped since still counted,
another process's memory taken since unseen.

A GPU whose UUID another connected node holds (``app.domain.gpu_claims``) is not free
either: placement puts no new shard on it.

``for_placement`` is the one rule every placement question uses: the reconciler's, a
drain's room (``drain_room``) and ``explain-placement`` (``placement``), so what an
operator reads is what the reconciler will do.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from app.domain.events import GpuInfo, ShardPlacement
from app.domain.gpu_claims import gpus_held_elsewhere
from app.domain.gpu_cordons import cordoned_indexes
from app.domain.reports import NodeReport
from app.domain.state import ACTIVE_PHASES, ClusterState, Node

NOTHING_REPORTED: Mapping[str, NodeReport] = MappingProxyType({})
"""No node's report: where none is known (a server not leading), placement goes by the log."""


class Allocations:
    """GPUs and ports in use per node; updated as a reconcile pass places replicas.

    What is free on a node is computed once and kept until a placement there changes it:
    a pass asks the same question of every node for every model it places."""

    __slots__ = ("_free", "gpus", "held_elsewhere", "memory_used_mib", "model_replicas", "ports")

    def __init__(self) -> None:
        self.gpus: dict[str, dict[int, str]] = {}
        self.ports: dict[str, set[int]] = {}
        self.model_replicas: dict[str, dict[str, int]] = {}
        """node -> model -> how many active replicas of it have a shard there"""
        self.held_elsewhere: dict[str, dict[int, str]] = {}
        """node -> GPU index -> the node that holds that GPU's UUID (``gpu_claims``)"""
        self._free: dict[str, tuple[tuple[tuple[int, int], ...], int | None]] = {}
        self.memory_used_mib: dict[str, Mapping[int, int]] = {}
        """node -> GPU index -> MiB in use, as the node's heartbeats said it since its hello
        (``NodeReport.gpu_memory_used_mib``); a GPU not in it goes by the hello."""

    @classmethod
    def from_state(cls, state: ClusterState) -> Allocations:
        allocations = cls()
        allocations.held_elsewhere = gpus_held_elsewhere(state.nodes.values())
        for replica in state.replicas.values():
            if replica.phase in ACTIVE_PHASES:
                for shard in replica.shards:
                    allocations._hold(
                        replica.id, replica.model, shard.node_id, shard.gpus, shard.port
                    )
        return allocations

    @classmethod
    def for_placement(cls, state: ClusterState, running: Mapping[str, NodeReport]) -> Allocations:
        """What placement may not use: what the log's active replicas hold, and what the
        engines each connected node reports running hold (``running``, by node)."""
        allocations = cls.from_state(state)
        allocations.hold_running(state, running)
        allocations.memory_used_mib = {
            node_id: report.gpu_memory_used_mib
            for node_id, report in running.items()
            if report.gpu_memory_used_mib
        }
        return allocations

    def hold_running(self, state: ClusterState, reports: Mapping[str, NodeReport]) -> None:
        """Hold the port of every engine a node reports running that no active replica of
        the log holds there already, and its GPUs where the log placed that shard on that
        node at that port (an ended replica's engine; a stray the log knows nothing of
        holds its port alone, its GPUs being unknown). Such an engine counts towards no
        model's spread."""
        for node_id, report in reports.items():
            for shard in report.shards.values():
                if not shard.running:
                    continue
                placed = None
                replica = state.replicas.get(shard.replica_id)
                if replica is not None:
                    placed = next(
                        (
                            s
                            for s in replica.shards
                            if s.index == shard.shard_index
                            and s.node_id == node_id
                            and s.port == shard.port
                        ),
                        None,
                    )
                    if placed is not None and replica.phase in ACTIVE_PHASES:
                        continue
                held = self.gpus.setdefault(node_id, {})
                for gpu in placed.gpus if placed is not None else ():
                    held.setdefault(gpu, shard.replica_id)
                self.ports.setdefault(node_id, set()).add(shard.port)
                self._free.pop(node_id, None)

    def reserve(self, replica_id: str, model: str, shards: tuple[ShardPlacement, ...]) -> None:
        for shard in shards:
            self._hold(replica_id, model, shard.node_id, shard.gpus, shard.port)

    def free(self, node: Node) -> tuple[tuple[tuple[int, int], ...], int | None]:
        """``((gpu index, free MiB) of every healthy unallocated GPU no operator cordoned and
        whose UUID no other node holds, lowest free port)``; a port another process was found
        to hold
        (``Node.ports_held_elsewhere``) is not free."""
        known = self._free.get(node.id)
        if known is None:
            held = self.gpus.get(node.id, {})
            cordoned = cordoned_indexes(node)
            elsewhere = self.held_elsewhere.get(node.id, {})
            gpus = tuple(
                (gpu.index, self.free_mib(node.id, gpu))
                for gpu in node.gpus
                if gpu.healthy
                and gpu.index not in held
                and gpu.index not in cordoned
                and gpu.index not in elsewhere
            )
            known = (gpus, _lowest_free_port(node, self.ports.get(node.id, set())))
            self._free[node.id] = known
        return known

    def free_mib(self, node_id: str, gpu: GpuInfo) -> int:
        """The MiB of ``gpu`` not in use: its node's latest reading, else its hello's."""
        used = self.memory_used_mib.get(node_id, {}).get(gpu.index, gpu.memory_used_mib)
        return max(gpu.memory_total_mib - used, 0)

    def _hold(
        self, replica_id: str, model: str, node_id: str, gpus: tuple[int, ...], port: int
    ) -> None:
        held = self.gpus.get(node_id)
        if held is None:
            held = self.gpus[node_id] = {}
        for gpu in gpus:
            held[gpu] = replica_id
        self.ports.setdefault(node_id, set()).add(port)
        models = self.model_replicas.setdefault(node_id, {})
        models[model] = models.get(model, 0) + 1
        self._free.pop(node_id, None)


def _lowest_free_port(node: Node, used: set[int]) -> int | None:
    low, high = node.port_range
    held = node.ports_held_elsewhere
    for port in range(low, high + 1):
        if port not in used and port not in held:
            return port
    return None
