"""The problem documents (RFC 9457) the admin API answers a refusal with other than a 400, as
the OpenAPI schema describes them (``app.admin.operation_schema``): what
``app.admin.errors`` writes for each status, with the fields it adds to some of them.

These are descriptions only: the answers are written by ``app.admin.errors`` (and, for a
request refused before it reaches the app, by the listener), never from these types."""

from __future__ import annotations

import msgspec

from app.domain.drain_room import ReplicaRoom


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """A refusal with nothing to add to its ``detail`` (a 401, 403, 405, 408, 413, 429, 431 or
    503), or an error the server did not expect (a 500)."""

    type: str
    title: str
    """What kind of refusal (``not-authorized``, ``database-unavailable``, ``not-leader``);
    docs/admin-api.md lists them."""
    status: int
    detail: str


class UnknownThingProblem(msgspec.Struct, frozen=True, kw_only=True):
    """A 404: what the path names does not exist, or the path names nothing at all."""

    type: str
    title: str
    status: int
    detail: str
    id: str | msgspec.UnsetType = msgspec.UNSET
    """The name or id not found: its first 100 characters, and "…" when longer."""
    id_length: int | msgspec.UnsetType = msgspec.UNSET
    """How long the name or id was, where ``id`` shows only its start."""


class ConflictingChange(msgspec.Struct, frozen=True, kw_only=True):
    """A change recorded after the one a refused request was decided on, as a history
    shows it."""

    position: int
    stream: str
    actor: str
    summary: str


class ConflictProblem(msgspec.Struct, frozen=True, kw_only=True):
    """A 409: the change does not fit the cluster as it is, or another came first."""

    type: str
    title: str
    status: int
    detail: str
    conflicts_with: list[ConflictingChange] | msgspec.UnsetType = msgspec.UNSET
    """The newest changes that came first (``conflict``), newest last."""
    room: list[ReplicaRoom] | msgspec.UnsetType = msgspec.UNSET
    """Each replica of a drain refused for want of room (``no-room-to-drain``)."""
    key_id: str | msgspec.UnsetType = msgspec.UNSET
    """The API key a creation sent again made already (``carried-out-already``): its secret
    was shown once."""


class FieldRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """One field of a spec or a change that cannot be, in a 422's ``errors``."""

    field: str
    """The field to blame (``replicas``, ``routing.weight``); ``(body)`` where no one is."""
    reason: str


class InvalidFieldsProblem(msgspec.Struct, frozen=True, kw_only=True):
    """A 422: well formed, but a value cannot be (a model spec, a key, a drain's grace), or
    an ``Idempotency-Key`` sent before with another request."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldRefusal] | msgspec.UnsetType = msgspec.UNSET
    """Every field refused, where the refusal is of fields."""
