"""A request waiting in the router's queue for a replica with room, or held for a model
starting from zero (a cold start), and how a hold ends (``HoldOutcome``)."""

from __future__ import annotations

import asyncio
from typing import Literal

from app.gateway.affinity import RouteKey
from app.gateway.lease import Lease

HoldOutcome = Literal["served", "timed_out", "cancelled", "failed"]
"""How a request held for a cold start ended: ``served``, ``timed_out``, ``cancelled``
(its client left) or ``failed`` (the model was removed, lost its autoscaling policy or was
seen failing to start, or the gateway stopped)."""


class Waiter:
    __slots__ = (
        "deadline",
        "enqueued_at",
        "exclude",
        "future",
        "hold_s",
        "key_id",
        "model",
        "route_key",
    )

    def __init__(
        self,
        model: str,
        key_id: str,
        exclude: frozenset[str],
        future: asyncio.Future[Lease],
        route_key: RouteKey | None = None,
    ) -> None:
        self.model = model
        self.key_id = key_id
        self.exclude = exclude
        self.route_key = route_key
        self.future = future
        self.enqueued_at = 0.0
        self.hold_s: float | None = None
        """Held for a cold start, up to this long; ``None`` while it waits for room."""
        self.deadline: asyncio.Timeout | None = None

    def hold(self, hold_s: float) -> None:
        """Wait for a cold start from now on, up to ``hold_s``."""
        self.hold_s = hold_s
        deadline = self.deadline
        if deadline is not None and not deadline.expired():  # else it ends as it was
            deadline.reschedule(self.future.get_loop().time() + hold_s)

    def shorten_hold(self, hold_s: float) -> None:
        """The model's cold-start timeout came down to ``hold_s``: a hold ends ``hold_s``
        after it began (at once, when that is past). A longer one changes nothing: a hold
        is not restarted by a table."""
        if self.hold_s is None or hold_s >= self.hold_s:
            return
        deadline = self.deadline
        when = None if deadline is None or deadline.expired() else deadline.when()
        if deadline is not None and when is not None:
            deadline.reschedule(when - (self.hold_s - hold_s))
        self.hold_s = hold_s


def waits_for_its_own(waiter: Waiter) -> bool:
    """Whether a waiter that no replica can take may be passed by those behind it in its
    key's line: one that excludes replicas (a retry) waits for the others, while one it
    excludes may have room. One that excludes none is not passed: those behind it exclude
    as many or more, so they find no room either (whatever their keys: a policy's key picks
    among the replicas with room, it never makes room), and a walk that finds nothing costs
    a look per key with waiters."""
    return bool(waiter.exclude)
