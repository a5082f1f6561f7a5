"""How far this machine's wall clock is from the database's, read over one round trip, and
whether a control plane that far off may lead.

The database is the one clock the cluster shares: ``llmgw_append`` refuses events whose
time is more than ``APPEND_CLOCK_SLACK_S`` from its own (migration 0017), the gateways' reports
and rate budgets are aged by it. A control plane whose clock is further off than that can
win the leader lock but append nothing: every reconcile pass and every operator's change
fails, and a standby with a good clock waits behind it for ever. So a candidate reads the
database's clock before it asks for the lock, and the leader again each time it checks its
lock, and one that is surely more than ``MAX_LEADER_CLOCK_OFFSET_S`` off does not lead.

A reading is this machine's clock before the query, the database's during it and this
machine's after: the database's time was taken somewhere in between, so the offset is
known to within half the round trip, and only an offset beyond the bound by more than that
counts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

APPEND_CLOCK_SLACK_S = 60.0
"""How far ``llmgw_append`` lets the events' time be from the database's clock (migration
0017's ``SLACK_S``)."""

MAX_LEADER_CLOCK_OFFSET_S = APPEND_CLOCK_SLACK_S / 2
"""The furthest a control plane's clock may be from the database's for it to lead: half the
append's slack, so that a leader's events are accepted with room to spare, and the times
that two leaders in turn recorded disagree by at most twice this."""


@dataclass(frozen=True)
class ClockReading:
    """Seconds since the epoch: ``sent`` and ``received`` by this machine's clock around the
    query, ``theirs`` by the database's during it."""

    sent: float
    theirs: float
    received: float

    @property
    def offset_s(self) -> float:
        """How far this machine's clock is ahead of the database's (negative: behind)."""
        return (self.sent + self.received) / 2 - self.theirs

    @property
    def uncertainty_s(self) -> float:
        """Half the round trip: the database read its clock somewhere within it."""
        return max(self.received - self.sent, 0.0) / 2


async def read_clock(
    database_clock: Callable[[], Awaitable[float]], wall_clock: Callable[[], float]
) -> ClockReading:
    """A reading: ``wall_clock`` around one call of ``database_clock``."""
    sent = wall_clock()
    theirs = await database_clock()
    return ClockReading(sent=sent, theirs=theirs, received=wall_clock())


def leader_clock_problem(
    reading: ClockReading, bound_s: float = MAX_LEADER_CLOCK_OFFSET_S
) -> str | None:
    """Why a control plane with this reading may not lead, or None when it may."""
    offset = reading.offset_s
    if not abs(offset) - reading.uncertainty_s > bound_s:
        return None
    side = "ahead of" if offset > 0 else "behind"
    return (
        f"this machine's clock is {abs(offset):.1f} s {side} the database's, more than the "
        f"{bound_s:g} s a control plane may be off to lead (the database refuses events "
        f"whose time is more than {APPEND_CLOCK_SLACK_S:g} s from its own): set its clock "
        "right (NTP)"
    )
