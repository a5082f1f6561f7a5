"""Which node a GPU UUID belongs to when two nodes list it: pure.

A GPU's UUID names one physical GPU in the whole fleet, but it is only what a node says:
a copied state directory, a cloned machine, a node that lies, or a GPU moved to another
machine while its old node was offline can make two connected nodes list one UUID. The
hub refuses a hello that lists one UUID twice (``app.hub.claims``); across nodes it cannot
tell which one is right, so the rule is simple and never takes from the node that had it:

- of the connected nodes that list a UUID, the one connected the longest holds it (the
  earliest ``node_connected`` of a connection still open: ``Node.connected_position``;
  the node id breaks a tie);
- any other connected node's GPU with that UUID is held elsewhere: placement puts no new
  shard on it, and says which node holds it. Nothing else changes: its health is still
  recorded, and a replica already on it is neither stopped nor moved;
- a node that is not connected (gone, lost, removed) holds nothing, so the UUID may move:
  to the node connected the longest among those that list it then.

An empty UUID (a GPU never read) names no GPU, so it is never held elsewhere.

Operators see it where they look: each node's count on ``/metrics``
(``held_elsewhere_counts``), the node list and view (with every other reason the GPU
takes no shard), and the replica list and view of a replica on such a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from app.domain.state import Node

HeldElsewhere = Mapping[str, Mapping[int, str]]
"""A node id -> the index of each of its GPUs whose UUID another node holds -> that node."""


def gpus_held_elsewhere(nodes: Iterable[Node]) -> dict[str, dict[int, str]]:
    """For each connected node that lists a GPU whose UUID another node holds, that GPU's
    index and the holder's id; nodes with none are left out."""
    holders: dict[str, str] = {}
    elsewhere: dict[str, dict[int, str]] = {}
    connected = sorted(
        (node for node in nodes if node.connected), key=lambda n: (n.connected_position, n.id)
    )
    for node in connected:
        for gpu in node.gpus:
            if not gpu.uuid:
                continue
            holder = holders.setdefault(gpu.uuid, node.id)
            if holder != node.id:
                elsewhere.setdefault(node.id, {})[gpu.index] = holder
    return elsewhere


def held_elsewhere_counts(nodes: Iterable[Node]) -> dict[str, int]:
    """How many of each node's GPUs another node holds the UUID of, for every node given
    (0 for most): one figure per node, never one per UUID."""
    listed = list(nodes)
    elsewhere = gpus_held_elsewhere(listed)
    return {node.id: len(elsewhere.get(node.id, {})) for node in listed}


def held_elsewhere_reason(uuid: str, holder: str) -> str:
    """Why a GPU with ``uuid`` takes no new shard, ``holder`` holding that UUID."""
    return f"its UUID {uuid} is listed by node {holder} too, connected longer"
