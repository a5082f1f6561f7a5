"""When a control plane that just started stops waiting for its agents: the adoption grace.

After an election the reconciler holds back the rules that would act on an absence (nodes
lost, shards missing, startup timeouts, placements) until the fleet has had its chance to
say hello: a control plane must never race its own agents. A fixed grace is a race it can
lose: a fleet of thousands reconnecting to a loaded leader can take longer than any fixed
number to be heard, and a grace that ends first declares every node lost and re-places
every replica. So the grace follows the fleet. It ends:

1. at once when every node the log knows (and has not declared lost) has said hello;
2. at ``maximum_s`` after the start (never before ``minimum_s``), whatever else holds: a
   hard bound, so nothing (a node that never comes back while others trickle in, a peer
   that keeps opening connections) keeps a cluster from reconciling for ever;
3. otherwise, not before ``minimum_s``, and then once agents have stopped arriving for
   ``quiet_s``: no connection is opening at the agent hub (accepted, its TLS or WebSocket
   handshake not finished) and no hello came within ``quiet_s``.

Once ended, and once its least length has passed, the grace stays ended for the rest of
the term (``ended``): a node that reconnects later, or one that leaves after every node
was back, does not hold the rules back again for up to ``maximum_s``. Within the least
length it is judged afresh at every pass, as a fixed grace was: a node the log learns of
that has not said hello to this control plane yet (it registered with the one before, a
moment ago) is waited for, not taken for one that did not come back.

Connections still opening count as arrivals because in a reconnect storm they are all
there is for a long time: thousands of handshakes at once on the leader's loop can hold
the first hello back for longer than the minimum (100 s after an election was measured).

Pure: the clock, the start and what the hub saw are parameters.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from enum import StrEnum

import msgspec

DEFAULT_ADOPTION_GRACE_S = 30.0
DEFAULT_ADOPTION_QUIET_S = 10.0
DEFAULT_ADOPTION_GRACE_MAX_S = 600.0


class AdoptionGrace(msgspec.Struct, frozen=True, kw_only=True):
    minimum_s: float = DEFAULT_ADOPTION_GRACE_S
    quiet_s: float = DEFAULT_ADOPTION_QUIET_S
    maximum_s: float = DEFAULT_ADOPTION_GRACE_MAX_S


class Arrivals(msgspec.Struct, frozen=True, kw_only=True):
    """What the agent hub saw of agents arriving since this control plane started."""

    last_hello_at: datetime | None = None
    connections_opening: int = 0
    """Connections accepted whose TLS and WebSocket handshakes have not finished yet."""


class GraceState(StrEnum):
    OPEN = "open"
    ALL_BACK = "every node the log knows said hello"
    QUIET = "no agent arrived for the quiet period"
    BOUND = "the upper bound passed"
    ENDED = "it ended before"


def grace_state(
    grace: AdoptionGrace,
    *,
    started_at: datetime,
    now: datetime,
    expected: Collection[str],
    said_hello: Collection[str],
    arrivals: Arrivals,
    ended: bool = False,
) -> GraceState:
    """Whether the adoption grace is still open at ``now``, and if not, why it ended;
    ``ended``: it ended at an earlier pass of this term (heeded once the least length has
    passed)."""
    elapsed = now - started_at
    least = timedelta(seconds=grace.minimum_s)
    if ended and elapsed >= least:
        return GraceState.ENDED
    if all(node in said_hello for node in expected):
        return GraceState.ALL_BACK
    if elapsed >= timedelta(seconds=max(grace.maximum_s, grace.minimum_s)):
        return GraceState.BOUND
    if elapsed < least:
        return GraceState.OPEN
    if arrivals.connections_opening > 0:
        return GraceState.OPEN
    last = arrivals.last_hello_at
    if last is not None and now - last < timedelta(seconds=grace.quiet_s):
        return GraceState.OPEN
    return GraceState.QUIET
