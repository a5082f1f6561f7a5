"""Which connection speaks for each node: pure bookkeeping, no I/O.

A node has at most one current connection. A second connection for the same node replaces
the first (an agent that reconnects before the control plane noticed the old socket die);
the caller closes the previous one with ``CloseCode.REPLACED`` and records that it did. The
caller first asks the previous one whether it still answers (``app.hub.refusals``): if it
does, two agents run as the node, and the newer one is refused instead, not registered.
A replaced connection that closes late must not take the newer one out with it, which is
why ``unregister`` names the handle it removes.
"""

from __future__ import annotations

from typing import Generic, TypeVar

Handle = TypeVar("Handle")


class ConnectionRegistry(Generic[Handle]):
    def __init__(self) -> None:
        self._current: dict[str, Handle] = {}

    def register(self, node_id: str, handle: Handle) -> Handle | None:
        """Make ``handle`` the node's connection; returns the one it replaces, if any."""
        previous = self._current.get(node_id)
        self._current[node_id] = handle
        return previous if previous is not handle else None

    def unregister(self, node_id: str, handle: Handle) -> bool:
        """Forget ``handle`` if it is still the node's connection; says whether it was."""
        if self._current.get(node_id) is not handle:
            return False
        del self._current[node_id]
        return True

    def get(self, node_id: str) -> Handle | None:
        return self._current.get(node_id)

    def connected_nodes(self) -> list[str]:
        return sorted(self._current)

    def connections(self) -> list[Handle]:
        """Every node's current connection."""
        return list(self._current.values())

    def __len__(self) -> int:
        return len(self._current)
