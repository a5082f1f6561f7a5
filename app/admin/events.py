"""``/admin/v1/events``: the whole log, live, as server-sent events; or one page of it.

Each message carries the event's log position as its ``id`` and the event (as history shows
it) as its ``data``. A client that loses the connection resumes where it left off: browsers
send the last id back as ``Last-Event-ID``; others pass ``?since=``. What is sent is always
read from the ``events`` table by position (a NOTIFY only wakes the stream), so a resumed
stream neither skips nor repeats an event.

A stream opened with an operator certificate ends when the certificate does: past its
end a request is refused (``app.admin.auth``), and a stream is a request kept open. Its last
message is then an ``event: refused`` whose ``data`` is what a request would be answered
with (the certificate's name and end), and the body ends; a client should not resume it
with the same certificate (the handshake refuses an expired one anyway).

Otherwise a stream never ends by itself: when the server stops, ``end_event_streams`` ends every
stream of its app cleanly (a last comment, then the end of the body), so that stopping does
not wait for followers to hang up, and they resume on another server or this one restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from litestar import Controller, Litestar, Request, Response, get
from litestar.di import NamedDependency
from litestar.exceptions import ValidationException
from litestar.openapi import ResponseSpec
from litestar.params import QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from app.admin.auth import CertificateEnd, operator_certificate_end, require_actor
from app.admin.history import event_view
from app.admin.queries import check_query
from app.admin.schemas import EventView
from app.domain.envelope import Recorded
from app.store.postgres import PostgresEventStore
from app.store.subscription import Subscription

EVENTS_PATH = "/admin/v1/events"
LAST_EVENT_ID = "last-event-id"
KEEPALIVE_S = 15.0
"""A comment this often on an idle stream: proxies keep it open, clients see it is alive."""
RETRY_MS = 2000
"""How long an EventSource waits before it reconnects (and resumes)."""
STREAM_BUFFER = 1000
STREAMS_KEY = "llmgw_event_streams"
REFUSED_EVENT = "refused"
"""The last message of a stream whose operator certificate ended; ``data``: why."""
CERTIFICATE_END_MARGIN_S = 0.05
"""A stream waits this much past its certificate's end, so that a timer firing a little
early finds the end passed rather than sending a keepalive first."""

_encoder = msgspec.json.Encoder()


class EventsPage(msgspec.Struct, frozen=True, kw_only=True):
    events: list[EventView]
    next_since: int
    """Pass as ``since`` to read on: the next page, or later what was appended since."""
    more: bool
    """Whether events after ``next_since`` were already in the log when this page was read."""


class EventStreams:
    """The open event streams of one admin app."""

    def __init__(self) -> None:
        self.ending = asyncio.Event()


def event_streams(app: Litestar) -> EventStreams:
    streams = app.state.get(STREAMS_KEY)
    if not isinstance(streams, EventStreams):
        streams = EventStreams()
        app.state[STREAMS_KEY] = streams
    return streams


def end_event_streams(app: object) -> None:
    """End every event stream of ``app`` (an admin app) now, and any opened later."""
    if isinstance(app, Litestar):
        event_streams(app).ending.set()


class EventsController(Controller):
    path = EVENTS_PATH
    guards = [require_actor, check_query]
    tags = ["events"]

    @get(
        "/",
        summary="Follow the event log (server-sent events), or read one page of it",
        description=(
            "With follow (the default) the answer is a text/event-stream: one message per "
            "event, `id:` its log position, `data:` the event as JSON, from the position "
            "after `since` (or after the `Last-Event-ID` header, which wins), else from now "
            "on; a comment every 15 s while the log is quiet. A stream opened with an operator "
            "certificate ends at the certificate's end, its last message an `event: refused` "
            "whose `data` says why. With follow=false the answer "
            "is a JSON page of at most `limit` events after `since`, or without `since` "
            "the last `limit` positions of the log."
        ),
        responses={
            200: ResponseSpec(
                data_container=EventsPage,
                description="A page of events (follow=false); with follow, a text/event-stream "
                "of these events, one per message",
            )
        },
    )
    async def events(
        self,
        request: Request[Any, Any, Any],
        store: NamedDependency[PostgresEventStore],
        since: Annotated[
            int | None, QueryParameter(ge=0, description="resume after this log position")
        ] = None,
        follow: Annotated[
            bool, QueryParameter(description="stream events as they are appended")
        ] = True,
        limit: Annotated[int, QueryParameter(ge=1, le=5000, description="page size")] = 500,
    ) -> Response[Any]:
        last = await store.last_position()
        after = _resume_position(request.headers.get(LAST_EVENT_ID), since)
        if after is not None and after > last:
            raise ValidationException(
                f"position {after} is past the end of the log (its last position is {last}): "
                "was it read from another cluster's log?"
            )
        if not follow:
            return Response(await _page(store, after, limit, last))
        url = store.engine.url.render_as_string(hide_password=False)
        ending = event_streams(request.app).ending
        stream = _messages(
            store,
            url,
            last if after is None else after,
            ending,
            operator_certificate_end(request.scope),
        )
        return ServerSentEvent(stream)


def _resume_position(last_event_id: str | None, since: int | None) -> int | None:
    """Where a stream resumes: ``Last-Event-ID`` (a reconnecting EventSource sends it with
    the URL it first used, so it must win over that URL's ``since``), else ``since``."""
    if last_event_id is None or not last_event_id.strip():
        return since
    try:
        position = int(last_event_id)
    except ValueError:
        position = -1
    if position < 0:
        raise ValidationException(
            f"Last-Event-ID must be a log position (a whole number >= 0), not {last_event_id!r}"
        )
    return position


async def _page(store: PostgresEventStore, after: int | None, limit: int, last: int) -> EventsPage:
    start = max(0, last - limit) if after is None else after
    events = await store.read_all(start, limit)
    next_since = events[-1].position if events else start
    return EventsPage(
        events=[event_view(e) for e in events],
        next_since=next_since,
        more=next_since < last,
    )


async def _messages(
    store: PostgresEventStore,
    database_url: str,
    after: int,
    ending: asyncio.Event,
    certificate_end: CertificateEnd | None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> AsyncIterator[ServerSentEventMessage]:
    yield ServerSentEventMessage(
        data=None, comment=f"following the log after position {after}", retry=RETRY_MS
    )
    appended: asyncio.Queue[Recorded] = asyncio.Queue(STREAM_BUFFER)

    async def read_on() -> None:
        subscription = Subscription(store, database_url, after, name="events")
        async for recorded in subscription:
            await appended.put(recorded)

    reader = asyncio.create_task(read_on(), name=f"events-after-{after}")
    server_stops = asyncio.ensure_future(ending.wait())
    # One pending get at a time, kept across keepalives: cancelling a get that has just
    # taken an event would lose that event.
    next_event: asyncio.Future[Recorded] | None = None
    try:
        while True:
            next_event = next_event or asyncio.ensure_future(appended.get())
            keepalive_s = KEEPALIVE_S
            if certificate_end is not None:
                left_s = (certificate_end.at - clock()).total_seconds()
                keepalive_s = min(keepalive_s, max(left_s, 0.0) + CERTIFICATE_END_MARGIN_S)
            await asyncio.wait(
                (next_event, server_stops, reader),
                timeout=keepalive_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if certificate_end is not None and certificate_end.passed(clock()):
                yield ServerSentEventMessage(event=REFUSED_EVENT, data=certificate_end.refusal)
                return
            if next_event.done():
                recorded, next_event = next_event.result(), None
                yield ServerSentEventMessage(
                    id=recorded.position, data=_encoder.encode(event_view(recorded)).decode()
                )
            elif server_stops.done():
                yield ServerSentEventMessage(
                    data=None, comment="the server stops: reconnect to resume"
                )
                return
            elif reader.done():
                reader.result()  # raises what ended it: the stream breaks, clients resume
                return
            else:
                yield ServerSentEventMessage(data=None, comment="keepalive")
    finally:
        # The client went away, or the server stops: the reader, and with it the
        # subscription's LISTEN connection, ends with the stream.
        for task in (next_event, server_stops, reader):
            if task is not None:
                task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
