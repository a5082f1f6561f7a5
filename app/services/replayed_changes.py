"""A change sent again with its idempotency key, on the service side: the ids its events
get, the look in the log for the first time it was sent, and what each answer reads back
from that first time (``app.domain.idempotency`` holds the key and its rules)."""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.envelope import Recorded
from app.domain.events import AnyEvent, ApiKeyCreated, ApiKeyRevoked
from app.domain.idempotency import IdempotencyKey, KeyReused, event_ids
from app.store.interface import EventStore, NewEvent


class AlreadyCarriedOut(Exception):
    """The change was sent before with the caller's idempotency key, and recorded:
    ``first`` is its first event. Each change answers it as it answered the first time."""

    def __init__(self, first: Recorded) -> None:
        super().__init__(f"carried out already, at position {first.position}")
        self.first = first


async def carried_out_before(store: EventStore, actor: str, key: IdempotencyKey) -> None:
    """Raises ``AlreadyCarriedOut`` when ``actor``'s ``key`` recorded a change before,
    ``KeyReused`` when that change was another request."""
    earlier = await store.read_events(event_ids(actor, key.key, 1))
    if earlier:
        check_same_request(key, earlier[0])
        raise AlreadyCarriedOut(earlier[0])


def keyed_events(
    actor: str, key: IdempotencyKey | None, events: Sequence[AnyEvent]
) -> list[NewEvent]:
    """A change's events to append, with ids derived from ``actor``'s ``key`` if any."""
    if key is None:
        return [NewEvent(e) for e in events]
    ids = event_ids(actor, key.key, len(events))
    return [NewEvent(e, event_id=i) for e, i in zip(events, ids, strict=True)]


def check_same_request(key: IdempotencyKey, first: Recorded) -> None:
    if first.meta.request_digest != key.request_digest:
        raise KeyReused(key.key)


def drain_of(first: Recorded) -> str:
    """The id of the drain a drain request recorded (its events' correlation id)."""
    drain_id = first.meta.correlation_id
    if drain_id is None:
        raise RuntimeError(f"the drain request at position {first.position} has no drain id")
    return drain_id


def revoked_key(first: Recorded) -> str:
    """The id of the key a key revocation recorded."""
    if not isinstance(first.event, ApiKeyRevoked):
        raise RuntimeError(f"the key revocation at position {first.position} revoked no key")
    return first.event.key_id


def created_key(first: Recorded) -> str:
    """The id of the key a key creation recorded."""
    if not isinstance(first.event, ApiKeyCreated):
        raise RuntimeError(f"the key creation at position {first.position} created no key")
    return first.event.key_id
