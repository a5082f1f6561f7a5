"""Agent TLS handshakes in progress at the hub, counted per remote address, with a cap. Pure.

A TLS handshake costs the hub CPU (the key exchange, the client certificate's checks) and,
while it waits for a peer, a slot: one address that opens many TCP connections and never
finishes (or slowly finishes) their handshakes would take those from every agent. So each
address may have at most ``per_address`` handshakes in progress; a connection over that is
closed before its handshake starts (``app.hub.accepting``) and counted in ``refused``. An
honest agent has one connection at a time, so the cap binds only where many agents share an
address (behind NAT, or a benchmark's thousand on 127.0.0.1): raise it there.

IPv6 addresses count by their /64, as the listeners' failure budget counts them
(``app.listeners.throttle.address_group``): an IPv6 host is usually given a whole /64, and
counted one by one its 2^64 addresses would each take a fresh cap. An IPv4 address counts
alone, and an IPv4-mapped IPv6 address as the IPv4 address it holds.

Memory is bounded by the connections in progress: a group is forgotten once its last
handshake ends.
"""

from __future__ import annotations

from app.listeners.throttle import address_group

DEFAULT_PER_ADDRESS = 8
MAX_PER_ADDRESS = 65535
"""No address holds more TCP connections to one port than it has ports."""


def per_address_problem(per_address: int) -> str | None:
    """What is wrong with ``per_address`` as a cap, or None."""
    if not 1 <= per_address <= MAX_PER_ADDRESS:
        return f"must be between 1 and {MAX_PER_ADDRESS}, not {per_address}"
    return None


class HandshakeGate:
    def __init__(self, per_address: int = DEFAULT_PER_ADDRESS) -> None:
        problem = per_address_problem(per_address)
        if problem is not None:
            raise ValueError(f"handshakes per address {problem}")
        self.per_address = per_address
        self.refused = 0
        """Connections refused since this gate was made."""
        self._in_progress: dict[str, int] = {}

    def enter(self, address: str) -> bool:
        """Count a handshake starting from ``address``; False, and nothing counted but the
        refusal, when its group (``address_group``) already has ``per_address`` in progress."""
        group = address_group(address)
        started = self._in_progress.get(group, 0)
        if started >= self.per_address:
            self.refused += 1
            return False
        self._in_progress[group] = started + 1
        return True

    def leave(self, address: str) -> None:
        """A handshake ``enter`` counted has ended, whether it finished or failed."""
        group = address_group(address)
        left = self._in_progress.get(group, 0) - 1
        if left > 0:
            self._in_progress[group] = left
        else:
            self._in_progress.pop(group, None)

    def in_progress(self, address: str) -> int:
        """Handshakes in progress from ``address``'s group."""
        return self._in_progress.get(address_group(address), 0)

    def addresses(self) -> int:
        """Groups of addresses (an IPv4 address, an IPv6 /64) with a handshake in progress."""
        return len(self._in_progress)
