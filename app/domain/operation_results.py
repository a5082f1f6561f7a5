"""What every operator decision returns, or raises when it refuses: pure types, no I/O.

A decision (``model_operations``, ``node_operations``, ``rollout_operations``, ``keys``,
``tuning``, ``revocations``) takes the cluster as the log describes it and the request, and
returns the ``Change`` to record: the events for the one stream it writes, none when the
request changes nothing (so a repeated request records nothing twice). A request that
cannot be carried out raises an ``OperationError`` whose message an operator can act on;
the admin API maps each to an HTTP status in one table (``app.admin.errors``).

OperationError
├── UnknownThing        no such model, node, replica or drain in the log (``key`` says which,
│   │                   ``shown_key`` as much of it as is echoed back)
│   ├── UnknownModel
│   ├── UnknownNode
│   ├── UnknownReplica
│   └── UnknownDrain
├── InvalidSpec         the spec breaks the rules of ``validate_spec``; ``errors`` has them all
├── InvalidDrain        a drain's grace out of bounds (``errors`` says so)
├── InvalidText         a reason holding what the log cannot keep (``app.domain.free_text``)
└── InvalidOperation    the request does not fit the cluster as it is now
    └── NoRoomToDrain   a drain that requires room for every replica, and one has none
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import msgspec

from app.domain.drain_room import ReplicaRoom
from app.domain.events import AnyEvent
from app.domain.model_spec import SpecError

NO_ROOM_NAMED = 8
"""The replicas without room a refused drain's message names; the answer lists them all."""

_T = TypeVar("_T")


class OperationError(Exception):
    """Base of every refusal; the message is meant for the operator."""


ECHOED_KEY_CHARS = 100
"""The most of an unknown id a refusal echoes back: an id is whatever the caller sent, 3000
characters of it or more, and the answer need not carry it all to say which it was."""


class UnknownThing(OperationError):
    kind = "thing"

    def __init__(self, key: str) -> None:
        shortened = len(key) > ECHOED_KEY_CHARS
        self.key = key
        self.shown_key = f"{key[:ECHOED_KEY_CHARS]}…" if shortened else key
        """``key``, or its first ``ECHOED_KEY_CHARS`` characters and "…" when longer."""
        length = f" (its first {ECHOED_KEY_CHARS} of {len(key)} characters)" if shortened else ""
        super().__init__(f"no {self.kind} {self.shown_key!r}{length} is known")


class UnknownModel(UnknownThing):
    kind = "model"


class UnknownNode(UnknownThing):
    kind = "node"


class UnknownReplica(UnknownThing):
    kind = "replica"


class UnknownDrain(UnknownThing):
    kind = "drain"


class InvalidFields(OperationError):
    """A request whose fields break the rules; ``errors`` has every one, field and reason."""

    def __init__(self, what: str, errors: Sequence[SpecError], note: str = "") -> None:
        listed = "; ".join(f"{e.field}: {e.reason}" for e in errors)
        super().__init__(f"{what} ({listed}); nothing was recorded{note and f'. {note}'}")
        self.errors = list(errors)


class InvalidSpec(InvalidFields):
    def __init__(self, model: str, errors: Sequence[SpecError], note: str = "") -> None:
        """``note``: what else the operator should know, after the errors."""
        super().__init__(f"spec of model {model!r} is invalid", errors, note)


class InvalidDrain(InvalidFields):
    def __init__(self, node_id: str, errors: Sequence[SpecError]) -> None:
        super().__init__(f"drain of node {node_id!r} cannot be requested", errors)


class InvalidText(InvalidFields):
    def __init__(self, what: str, errors: Sequence[SpecError]) -> None:
        super().__init__(f"{what} cannot be recorded", errors)


class InvalidOperation(OperationError):
    pass


class NoRoomToDrain(InvalidOperation):
    """A drain asked to be refused rather than stop a replica it cannot move."""

    def __init__(self, node_id: str, room: Sequence[ReplicaRoom]) -> None:
        nowhere = [r for r in room if not r.has_room]
        listed = "; ".join(f"{r.replica_id}: {r.reason}" for r in nowhere[:NO_ROOM_NAMED])
        more = len(nowhere) - NO_ROOM_NAMED
        super().__init__(
            f"node {node_id} was not drained: {len(nowhere)} of {len(room)} replica(s) on it "
            f"have nowhere to go now ({listed}{f'; and {more} more' if more > 0 else ''}); "
            "nothing was recorded"
        )
        self.room = tuple(room)


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """Events to append to ``stream``, at the version of it the decision was made on."""

    stream: str
    events: tuple[AnyEvent, ...] = ()
    correlation_id: str | None = None
    """What the events are part of when the decision knows (a rollout they start or
    steer); None: the request that asked for them."""


def find_known(things: Mapping[str, _T], key: str, unknown: type[UnknownThing]) -> _T:
    """The thing ``key`` names among ``things``, or ``unknown`` raised for it."""
    thing = things.get(key)
    if thing is None:
        raise unknown(key)
    return thing
