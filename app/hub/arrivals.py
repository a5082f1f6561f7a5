"""Agent connections still opening at the hub: accepted, their handshakes not finished.

While a reconnect storm lasts, the hub may take longer to finish its TLS handshakes than
any fixed adoption grace; these connections are how the control plane knows agents are
still arriving (``app.domain.adoption_grace``). A connection counts from the moment it is
accepted until its WebSocket handshake finishes or it closes. asyncio says nothing to the
connection when its TLS handshake fails, so one that never finishes stops counting after
``max_age_s`` (the hub's TLS handshake timeout): a peer that opens TCP connections and
never speaks TLS keeps the grace open no longer than that, each, and never past the
grace's upper bound.
"""

from __future__ import annotations


class OpeningConnections:
    def __init__(self, max_age_s: float) -> None:
        if max_age_s <= 0:
            raise ValueError(f"the age limit must be positive, not {max_age_s}")
        self._max_age_s = max_age_s
        self._opened_at: dict[int, float] = {}

    def opened(self, key: int, now: float) -> None:
        self._opened_at[key] = now

    def finished(self, key: int) -> None:
        self._opened_at.pop(key, None)

    def count(self, now: float) -> int:
        """Connections opening at ``now``; forgets those older than the age limit."""
        stale = [k for k, at in self._opened_at.items() if now - at >= self._max_age_s]
        for key in stale:
            del self._opened_at[key]
        return len(self._opened_at)
