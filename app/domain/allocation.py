"""Which GPU and which port of which node each replica holds, as the log says.

A shard holds its GPUs and port while its replica is active (placed through stopping).
An ended replica (stopped, failed, timed out, lost) releases them at once: its stop command
is already on its way, and the replacement must be placeable on the same node.
"""

from __future__ import annotations

from collections import defaultdict

from app.domain.events import ShardPlacement
from app.domain.state import ACTIVE_PHASES, ClusterState


class Allocations:
    """GPUs and ports in use per node; updated as a reconcile pass places replicas."""

    __slots__ = ("gpus", "model_replicas", "ports")

    def __init__(self) -> None:
        self.gpus: dict[str, dict[int, str]] = defaultdict(dict)
        self.ports: dict[str, set[int]] = defaultdict(set)
        self.model_replicas: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        """node -> model -> how many active replicas of it have a shard there"""

    @classmethod
    def from_state(cls, state: ClusterState) -> Allocations:
        allocations = cls()
        for replica in state.replicas.values():
            if replica.phase in ACTIVE_PHASES:
                for shard in replica.shards:
                    allocations._hold(
                        replica.id, replica.model, shard.node_id, shard.gpus, shard.port
                    )
        return allocations

    def reserve(self, replica_id: str, model: str, shards: tuple[ShardPlacement, ...]) -> None:
        for shard in shards:
            self._hold(replica_id, model, shard.node_id, shard.gpus, shard.port)

    def _hold(
        self, replica_id: str, model: str, node_id: str, gpus: tuple[int, ...], port: int
    ) -> None:
        for gpu in gpus:
            self.gpus[node_id][gpu] = replica_id
        self.ports[node_id].add(port)
        self.model_replicas[node_id][model] += 1
