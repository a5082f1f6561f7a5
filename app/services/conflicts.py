"""The 409 of a change that lost a race: what was recorded on its stream after the version
it was decided on, so that the operator refused learns what the request met (whose change,
what it did), not only that a stream moved.

``ChangeConflict`` is a ``ConcurrencyError`` (the problem table answers it 409 ``conflict``)
whose message names those changes, newest last, in the words of a history.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.describe import describe
from app.domain.envelope import Recorded
from app.store.errors import ConcurrencyError
from app.store.interface import LogQueries

CHANGES_NAMED = 3
"""The newest changes a conflict names; it counts the earlier ones."""


class ChangeConflict(ConcurrencyError):
    def __init__(self, lost: ConcurrencyError, met: Sequence[Recorded]) -> None:
        super().__init__(lost.stream, lost.expected, lost.actual)
        self.met = tuple(met[-CHANGES_NAMED:])
        """The newest changes recorded on the stream since the request read it."""
        if self.met:
            self.args = (conflict_detail(self.met, count=len(met)),)


def conflict_detail(met: Sequence[Recorded], *, count: int) -> str:
    """``met``: the newest of the ``count`` changes that came first."""
    changes = "; ".join(
        f"{describe(r.event)} (by {r.meta.actor}, position {r.position})" for r in met
    )
    came = (
        "another change came first"
        if count == 1
        else f"{count} other changes came first"
        + ("" if count == len(met) else f", the newest {len(met)}")
    )
    return (
        f"{came}: {changes}; nothing was written: send it again to decide "
        "on the cluster as it is now"
    )


async def conflict_met(store: LogQueries, lost: ConcurrencyError) -> ChangeConflict:
    """``lost`` with the changes it met, read from its stream."""
    after = lost.expected if lost.expected is not None else max(lost.actual - 1, 0)
    return ChangeConflict(lost, await store.read_stream(lost.stream, after_version=after))
