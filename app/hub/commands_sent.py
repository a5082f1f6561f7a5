"""Which commands the hub sent each node: the causes a node's shard status may name.

A ``shard_status`` names the command that caused it (``command_id``), and the log keeps it
as the event's causation: what happened, and on whose word. A node could name any id there
(another node's command, an operator's request id), so a status's cause is kept only when
the hub sent that node a command with that id, on any of its connections (the agent carries
out a command on one connection and may report its effect on the next). The ids the control
plane gives its commands are derived from what they act on (``start-<replica>-<shard>``), so
a node is sent few distinct ones; the most recent ``MAX_REMEMBERED_PER_NODE`` are kept, as
many as the agent itself remembers.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_REMEMBERED_PER_NODE = 1024


class CommandsSent:
    """The ids of the commands sent to each node, the most recent first to be kept."""

    def __init__(self, per_node: int = MAX_REMEMBERED_PER_NODE) -> None:
        self._per_node = per_node
        self._by_node: dict[str, OrderedDict[str, None]] = {}

    def sent(self, node_id: str, command_id: str) -> None:
        ids = self._by_node.setdefault(node_id, OrderedDict())
        ids[command_id] = None
        ids.move_to_end(command_id)
        if len(ids) > self._per_node:
            ids.popitem(last=False)

    def knows(self, node_id: str, command_id: str) -> bool:
        """Whether ``command_id`` is one of the commands sent to ``node_id``."""
        ids = self._by_node.get(node_id)
        return ids is not None and command_id in ids
