"""The admin API's requests and views of API keys (wire schemas)."""

from __future__ import annotations

from datetime import datetime

import msgspec


class KeyRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    models: list[str]
    """The models the key may use; ``["*"]`` for every model, declared now or later."""
    rpm: int | None = None
    """Requests per minute; null for no limit."""
    tpm: int | None = None
    """Tokens per minute; null for no limit."""
    expires_at: datetime | None = None
    """When the key stops working: RFC 3339 with an offset, in the future, at most 10 years
    ahead; null for a key that never expires."""
    expires_in_s: float | None = None
    """Instead of ``expires_at``: how many seconds the key works, from when the server
    records it, by the server's clock (more than 0, at most 10 years), so that a client
    whose clock is off gets the lifetime it asked for."""


class KeyView(msgspec.Struct, frozen=True, kw_only=True):
    """A key as operators see it: never its secret, nor the secret's hash."""

    id: str
    """Its stream in the log: ``/admin/v1/history/key/{id}``."""
    prefix: str
    name: str
    models: list[str]
    """``["*"]`` when the key may use every model."""
    rpm: int | None
    tpm: int | None
    created_at: datetime
    created_by: str
    revoked: bool
    revoked_at: datetime | None
    revoked_by: str | None
    expires_at: datetime | None
    """When the key stops working (UTC); null: never."""
    expired: bool
    """Whether ``expires_at`` has passed by the server's clock when it answered."""


class KeyCreated(KeyView, frozen=True, kw_only=True):
    key: str
    """The whole key, shown this once: only its hash is stored."""


class KeyChange(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    """False when the key was revoked already (nothing was recorded)."""
    key: KeyView
