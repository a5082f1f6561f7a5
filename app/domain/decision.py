"""What a decision produces: events to append (with their stream, expected version and
correlation) and commands to send. ``Draft`` folds each event into a working copy of the
state as it is emitted, so later rules in the same pass see it."""

from __future__ import annotations

import uuid
from datetime import datetime

import msgspec

from app.domain.commands import StartShard, StopShard
from app.domain.envelope import Meta, Recorded
from app.domain.events import AnyEvent
from app.domain.evolve import evolve
from app.domain.state import ClusterState

RECONCILER = "reconciler"
AUTOSCALER = "autoscaler"


class PlannedEvent(msgspec.Struct, frozen=True, kw_only=True):
    stream: str
    event: AnyEvent
    expected_version: int | None = None
    correlation_id: str | None = None
    actor: str = RECONCILER


class Command(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    command: StartShard | StopShard


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    events: tuple[PlannedEvent, ...] = ()
    commands: tuple[Command, ...] = ()


class Draft:
    """A decision being made: a working copy of the state plus what was decided so far."""

    def __init__(self, state: ClusterState, now: datetime, epoch: int) -> None:
        self.state = state.copy()
        self.now = now
        self.epoch = epoch
        self._events: list[PlannedEvent] = []
        self._commands: dict[str, Command] = {}

    def emit(
        self,
        stream: str,
        event: AnyEvent,
        *,
        expected_version: int | None = None,
        correlation_id: str | None = None,
        actor: str = RECONCILER,
    ) -> None:
        self._events.append(
            PlannedEvent(
                stream=stream,
                event=event,
                expected_version=expected_version,
                correlation_id=correlation_id,
                actor=actor,
            )
        )
        position = self.state.position
        evolve(
            self.state,
            Recorded(
                position=position,
                stream=stream,
                version=0,
                event_id=uuid.UUID(int=0),
                recorded_at=self.now,
                meta=Meta(actor=actor, correlation_id=correlation_id, epoch=self.epoch),
                event=event,
            ),
        )

    def command(self, node_id: str, command: StartShard | StopShard) -> None:
        self._commands[command.command_id] = Command(node_id=node_id, command=command)

    def decision(self) -> Decision:
        return Decision(events=tuple(self._events), commands=tuple(self._commands.values()))
