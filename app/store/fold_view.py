"""The log as this process has folded it: the state, every stream's version, and the plan of
an append checked and folded against them.

An append is planned here (versions checked against the fold, so a writer that lost a race
is refused before anything reaches the recorder), folded into the state at once (the
projection rows the recorder writes with the events come from that fold), then confirmed
with the positions the recorder gave, or undone if the recorder refused. Events other
writers appended are absorbed as they are read. Both stores keep their fold here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from uuid import UUID

from msgspec.structs import replace

from app.domain.envelope import Meta, Recorded
from app.domain.evolve import evolve
from app.domain.state import ClusterState
from app.store.codec import storable
from app.store.collector import paused_gc
from app.store.errors import ConcurrencyError
from app.store.interface import AppendRequest
from app.store.projection import RowChanges, Undo, fold


class FoldView:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.versions: dict[str, int] = {}
        """Each stream's version as of ``state.position``."""

    def reset(self, state: ClusterState, versions: dict[str, int]) -> None:
        self.state = state
        self.versions = versions

    def known_version(self, stream: str) -> int:
        return self.versions.get(stream, 0)

    def plan(self, requests: Sequence[AppendRequest], meta: Meta, now: datetime) -> list[Recorded]:
        """The events as they will be recorded (positions provisional), checking versions."""
        versions: dict[str, int] = {}
        plan: list[Recorded] = []
        position = self.state.position
        for request in requests:
            actual = versions.get(request.stream, self.versions.get(request.stream, 0))
            expected = request.expected_version
            if expected is not None and expected != actual and request.events:
                raise ConcurrencyError(request.stream, expected, actual)
            for new in request.events:
                actual += 1
                position += 1
                plan.append(
                    Recorded(
                        position=position,
                        stream=request.stream,
                        version=actual,
                        event_id=new.event_id,
                        recorded_at=now,
                        meta=meta,
                        event=storable(new.event),
                    )
                )
            versions[request.stream] = actual
        return plan

    def fold(self, plan: Sequence[Recorded]) -> tuple[RowChanges, Undo]:
        """Fold ``plan`` into the state; the rows it changes, and how to undo it."""
        return fold(self.state, plan)

    def undo(self, undo: Undo) -> None:
        undo.restore(self.state)

    def confirm(self, plan: Sequence[Recorded], positions: Mapping[UUID, int]) -> list[Recorded]:
        """The planned events as recorded, at the positions the recorder gave them."""
        recorded = [replace(r, position=positions[r.event_id]) for r in plan]
        self.state.position = max(positions.values())
        for one in recorded:
            self.versions[one.stream] = one.version
        return recorded

    def absorb(self, events: Sequence[Recorded]) -> None:
        """Fold events read from the log (in order, after ``state.position``)."""
        state, versions = self.state, self.versions
        with paused_gc():
            for recorded in events:
                evolve(state, recorded)
                versions[recorded.stream] = recorded.version
