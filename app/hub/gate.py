"""Agent TLS handshakes in progress at the hub, counted per remote address, with a cap. Pure.

A TLS handshake costs the hub CPU (the key exchange, the client certificate's checks) and,
while it waits for a peer, a slot: one address that opens many TCP connections and never
finishes (or slowly finishes) their handshakes would take those from every agent. So each
address may have at most ``per_address`` handshakes in progress; a connection over that is
closed before its handshake starts (``app.hub.accepting``) and counted in ``refused``. An
honest agent has one connection at a time, so the cap binds only where many agents share an
address (behind NAT, or a benchmark's thousand on 127.0.0.1): raise it there.

Addresses are counted as given. An IPv6 host is usually given a whole /64, so one host can
take a fresh cap from each of its addresses; grouping them by /64, as the listeners'
failure budget does (``app.listeners.throttle``), is left for when agents dial over IPv6.

Memory is bounded by the connections in progress: an address is forgotten once its last
handshake ends.
"""

from __future__ import annotations

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
        refusal, when the address already has ``per_address`` in progress."""
        started = self._in_progress.get(address, 0)
        if started >= self.per_address:
            self.refused += 1
            return False
        self._in_progress[address] = started + 1
        return True

    def leave(self, address: str) -> None:
        """A handshake ``enter`` counted has ended, whether it finished or failed."""
        left = self._in_progress.get(address, 0) - 1
        if left > 0:
            self._in_progress[address] = left
        else:
            self._in_progress.pop(address, None)

    def in_progress(self, address: str) -> int:
        return self._in_progress.get(address, 0)

    def addresses(self) -> int:
        """Addresses with a handshake in progress."""
        return len(self._in_progress)
