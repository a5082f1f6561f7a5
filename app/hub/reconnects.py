"""How often one node may connect: a token bucket per certificate common name. Pure.

Every connection a node opens costs the control plane a hello to decode and check, the
fleet view rebuilt for the node, an adoption comparison of everything it reports, and two
events (connected, then disconnected). An agent reconnects with a doubling backoff, so an
honest one connects a few times a minute at most, even when its server keeps closing it; a
node that connects again and again (a broken agent, a script holding a stolen
certificate, two agents sharing a node id) would spend all that in a loop. So each node
has ``burst`` connections at once and earns back ``per_minute``; one past that is refused
right after the TLS handshake, before its hello, with the seconds until it may connect
again.

Memory is bounded: at most ``max_nodes`` buckets are kept, the least recently touched
dropped first (``app.listeners.buckets``). ``now`` is monotonic seconds, passed in like
every clock the hub's pure parts see.
"""

from __future__ import annotations

import math

import msgspec

from app.listeners.buckets import KeyedBuckets

DEFAULT_CONNECT_BURST = 10
DEFAULT_CONNECTS_PER_MINUTE = 10.0
DEFAULT_MAX_NODES = 10_000


class ConnectLimits(msgspec.Struct, frozen=True, kw_only=True):
    burst: int = DEFAULT_CONNECT_BURST
    """Connections a node may open at once."""
    per_minute: float = DEFAULT_CONNECTS_PER_MINUTE
    """Connections it earns back each minute."""
    max_nodes: int = DEFAULT_MAX_NODES

    def __post_init__(self) -> None:
        problems = limit_problems(self.burst, self.per_minute)
        if self.max_nodes < 1:
            problems.append(f"the connect budget must keep at least one node, not {self.max_nodes}")
        if problems:
            raise ValueError("; ".join(problems))

    def describe(self) -> str:
        return f"at most {self.per_minute:g} connections a minute (bursts of {self.burst})"


def limit_problems(burst: int, per_minute: float) -> list[str]:
    """What is wrong with these limits, one line each, named by their ``serve`` flags."""
    found = []
    if burst < 1:
        found.append(f"--agent-connect-burst must be at least 1, not {burst}")
    if not 0 < per_minute < math.inf:
        found.append(f"--agent-connects-per-minute must be positive, not {per_minute:g}")
    return found


class ConnectBudget:
    def __init__(self, limits: ConnectLimits | None = None) -> None:
        self.limits = limits or ConnectLimits()
        self._buckets = KeyedBuckets(
            burst=self.limits.burst,
            per_second=self.limits.per_minute / 60,
            max_keys=self.limits.max_nodes,
        )

    def spend(self, node_id: str, now: float) -> float:
        """Count a connection of ``node_id``: 0 when it may go on (it had one left), else
        the seconds until it has one again (this one is refused, and costs nothing)."""
        return self._buckets.spend(node_id, now)

    def __len__(self) -> int:
        return len(self._buckets)
