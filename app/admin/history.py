"""``/admin/v1/history/{subject}/{key}``: one replica's, node's, model's, key's or
certificate's events, oldest first: the first of them, or the last (``before``)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.exceptions import ValidationException
from litestar.params import FromPath, QueryParameter

from app.admin.auth import require_actor
from app.admin.operation_schema import refusal
from app.admin.problem_schemas import ConflictProblem
from app.admin.queries import check_query
from app.admin.schemas import EventView, HistoryPage
from app.admin.spec_display import shown_change, shown_spec
from app.domain.describe import describe
from app.domain.envelope import Recorded
from app.domain.events import SECRET_FIELDS
from app.domain.revocations import InvalidRevocation, history_serial
from app.services.operations import Operations
from app.store.history import Subject, read_history
from app.store.postgres import PostgresEventStore


def event_view(recorded: Recorded) -> EventView:
    """An event as every admin answer shows it (history, pages, streams, drains): its
    secret fields left out, and the secrets a spec recorded before they were refused
    withheld (``app.admin.spec_display``)."""
    data: dict[str, Any] = {
        name: value
        for name, value in msgspec.to_builtins(recorded.event).items()
        if name not in SECRET_FIELDS
    }
    if isinstance(data.get("spec"), dict):
        data["spec"] = shown_spec(data["spec"])
    if isinstance(data.get("changes"), list):
        data["changes"] = [shown_change(change) for change in data["changes"]]
    return EventView(
        position=recorded.position,
        recorded_at=recorded.recorded_at,
        stream=recorded.stream,
        version=recorded.version,
        type=data.pop("type"),
        actor=recorded.meta.actor,
        correlation_id=recorded.meta.correlation_id,
        causation_id=recorded.meta.causation_id,
        summary=describe(recorded.event),
        data=data,
    )


MAX_POSITION = 2**63 - 1
"""The largest log position (a bigint); a larger ``after`` is refused, not sent to SQL."""


class HistoryController(Controller):
    path = "/admin/v1/history"
    guards = [require_actor, check_query]
    tags = ["history"]

    @get(
        "/{subject:str}/{key:str}",
        summary="Events about one replica, node, model, key or certificate",
        description="Oldest first: the first `limit` events after `after`, `next_after` paging "
        "on to newer ones. With `before`, the last `limit` events before it (and after "
        "`after`) instead, still oldest first, `next_before` paging back to older ones: "
        f"`before={MAX_POSITION}` reads the newest events.",
        responses={
            409: refusal(
                ConflictProblem,
                "The key is named by its name, which more than one key has (invalid-operation)",
            )
        },
    )
    async def history(
        self,
        store: NamedDependency[PostgresEventStore],
        operations: NamedDependency[Operations],
        subject: FromPath[Subject],
        key: FromPath[str],
        after: Annotated[
            int,
            QueryParameter(ge=0, le=MAX_POSITION, description="read events after this position"),
        ] = 0,
        before: Annotated[
            int | None,
            QueryParameter(
                ge=1,
                le=MAX_POSITION,
                description="read the newest events before this position, back from it",
            ),
        ] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=5000)] = 500,
    ) -> HistoryPage:
        if before is not None:
            _refuse_empty_range(after, before)
        if subject is Subject.KEY:  # by id, prefix or name, as `keys revoke` takes it
            key = (await operations.find_key(key)).id
        elif subject is Subject.CERTIFICATE:  # as `cert show` or openssl prints it
            key = _serial(key)
        events = await read_history(store.engine, subject, key, after, limit, before=before)
        full = len(events) == limit
        return HistoryPage(
            kind=subject.value,
            id=key,
            events=[event_view(e) for e in events],
            next_after=events[-1].position if full and before is None else None,
            next_before=events[0].position if full and before is not None else None,
        )


def _refuse_empty_range(after: int, before: int) -> None:
    """400 for ``after`` at or past ``before``: no event is both, and an empty page would
    read as a history that has none, not as the mistake it is."""
    if after < before:
        return
    reason = f"must be less than before ({before}): no event is after {after} and before {before}"
    raise ValidationException(
        f"after ({after}) {reason}",
        extra=[{"key": "after", "message": reason, "source": "query"}],
    )


def _serial(text: str) -> str:
    """The serial ``text`` names, as its events are recorded; a bad one is the request's
    fault (400), not an invalid revocation: nothing is being revoked."""
    try:
        return history_serial(text)
    except InvalidRevocation as exc:
        raise ValidationException(f"{exc.errors[0].field}: {exc.errors[0].reason}") from exc
