"""Response bodies of the admin API (wire schemas, kept apart from domain types and tables)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec


class EventView(msgspec.Struct, frozen=True, kw_only=True):
    position: int
    recorded_at: datetime
    stream: str
    version: int
    type: str
    actor: str
    correlation_id: str | None
    causation_id: str | None
    summary: str
    data: dict[str, Any]


class HistoryPage(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    id: str
    events: list[EventView]
    next_after: int | None
    """Pass as ``after`` to read the next page; null when this page is the last."""
