"""What the log adds around an event: where it sits, when, and who caused it."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import msgspec

from app.domain.events import AnyEvent


class Meta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Who and why: the actor (an operator, ``reconciler``, ``agent:<node>``), the
    correlation id shared by every step of one operation (a drain, say), the cause (the
    event or request that led to this one) and the leader epoch of the control plane that
    decided it; for an operator's change sent with an idempotency key, the key and what the
    request asked."""

    actor: str
    correlation_id: str | None = None
    causation_id: str | None = None
    epoch: int | None = None
    idempotency_key: str | None = None
    """The ``Idempotency-Key`` the operator's request came with (``app.domain.idempotency``)."""
    request_digest: str | None = None
    """With ``idempotency_key``: what that request asked, hashed: the same key sent with
    another request is refused."""


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """Where an event sits in the log, when it was recorded and why: what every form of a
    recorded event carries, whatever form its payload takes."""

    position: int
    stream: str
    version: int
    event_id: UUID
    recorded_at: datetime
    meta: Meta


class Recorded(Envelope, frozen=True, kw_only=True):
    """An event as the log holds it."""

    event: AnyEvent
