"""What the admin API's controllers share in their answers: an event as the API shows it, a
page of a history, ``as_view``, and the readiness check's answer (wire schemas, kept apart
from domain types and tables). Each resource's bodies and views have a module of their own:
``model_schemas``, ``node_schemas``, ``replica_schemas``, ``key_schemas``,
``autoscale_schemas`` and ``rollout_schemas``."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

import msgspec

ViewT = TypeVar("ViewT")


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
    """Pass as ``after`` to read the next page; null when this page is the last, and when
    the page was read with ``before``."""
    next_before: int | None = None
    """For a page read with ``before``: pass as ``before`` to read the page of older events;
    null when this page is the oldest, and when the page was read without ``before``."""


def as_view(value: object, view: type[ViewT], **extra: object) -> ViewT:
    """``value`` (a domain struct) as the wire struct ``view``, with ``extra`` fields; fields
    the view does not declare are left out."""
    data = msgspec.to_builtins(value, builtin_types=(datetime,))
    return msgspec.convert({**data, **extra}, view)


class CheckView(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    detail: str


class ReadinessView(msgspec.Struct, frozen=True, kw_only=True):
    ready: bool
    role: str | None
    """The control plane's: ``leader`` or ``standby`` (``stopped`` while it shuts down);
    null where the API is served without one."""
    failing: list[str]
    """The names of the checks that failed, in ``checks`` order; empty when ready."""
    checks: dict[str, CheckView]
    """``database``, then ``migrations`` once the database answers."""
