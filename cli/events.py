"""`llmgw-cli events [--follow] [--since POS]`: the event log, all of it, as it grows.

``--follow`` reads the admin API's server-sent events; when the connection is lost it
resumes after the last position it printed, so nothing is skipped or printed twice. A
stream the server ends for good (an ``event: refused``: the operator certificate ended)
is not resumed: it stops with the server's reason.
"""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Iterator
from typing import Annotated

import msgspec
from cyclopts import Parameter

from app.usage_errors import stdout_reader_gone
from cli.arguments import UsageError, WholeNumberWithin
from cli.client import (
    ADMIN,
    UNREADABLE,
    AdminClient,
    AdminUnreachable,
    ApiProblem,
    ClientError,
    EventView,
    TlsFailure,
    unreadable,
)
from cli.config import ConnectionFlags
from cli.history import COLUMNS, event_row
from cli.history_pages import NEWEST
from cli.operator import Output, OutputFormat, call, run_command
from cli.render import (
    EVENT_TYPE_WIDTH,
    EXIT_OK,
    counted,
    print_json_array,
    print_json_line,
    print_table,
    say,
    utc_seconds,
    warn,
)
from cli.sse import SseParser
from cli.streamed_lines import stream_lines
from cli.views import EventsPage

EVENTS_PATH = f"{ADMIN}/events"
DEFAULT_LAST = 20
PAGE_SIZE = 1000
IDLE_TIMEOUT_S = 60.0
"""The server sends a comment every 15 s on a quiet stream: this long without a line
means the connection is dead."""
RESUME_WITHIN_S = 60.0
REFUSED_EVENT = "refused"
"""The last message of a stream the server ends for good (the operator certificate it was
opened with has ended): ``data`` says why, and ``--follow`` stops with it (exit 1)."""
MAX_REFUSAL_CHARS = 1000
"""How long ``--follow`` keeps trying to resume before it gives up (exit 1)."""

_event_decoder = msgspec.json.Decoder(EventView)
_POSITION = re.compile(r"[0-9]{1,19}")
_MAX_POSITION = 2**63 - 1


def events(
    *,
    follow: Annotated[
        bool,
        Parameter(
            help="Keep printing events as they are appended, until Ctrl-C (or until the "
            "operator certificate ends: exit 1, saying so).",
            negative=(),
        ),
    ] = False,
    since: Annotated[
        int | None,
        Parameter(
            help="Every event after this log position (the position column).",
            converter=WholeNumberWithin(0, NEWEST),
        ),
    ] = None,
    last: Annotated[
        int | None,
        Parameter(
            help=f"Start with the latest N events. [default: {DEFAULT_LAST}, unless --since]",
            converter=WholeNumberWithin(0, NEWEST),
        ),
    ] = None,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """The whole event log: who did what to which model, node, replica or key, in order.
    With --follow, one line per event as it happens (JSON lines with --output json); a
    lost connection is resumed where it broke off.

    ```
    llmgw-cli events --last 50
    llmgw-cli events --follow
    llmgw-cli events --follow --since 1200 --output json | jq -c 'select(.type == "shard_failed")'
    ```
    """

    def show(client: AdminClient) -> int:
        if since is not None and last is not None:
            raise UsageError("give --since or --last, not both")
        if since is not None:
            pages = _pages_after(client, since)
        else:
            pages = _latest(client, DEFAULT_LAST if last is None else last)
        if not follow:
            _print_page([raw for page in pages for raw in page.events], output)
            return EXIT_OK
        position = 0
        for page in pages:  # each page printed as it comes: a long backlog is not held
            for raw in page.events:
                _print_line(raw, output)
            position = page.next_since
        _follow(client, position, output)
        return EXIT_OK

    return run_command("events", connection, show)


def _pages_after(client: AdminClient, since: int) -> Iterator[EventsPage]:
    """The pages of every event after ``since``, read one by one as they are iterated;
    each one's ``next_since`` is where the events printed so far end."""
    position = since
    while True:
        page = _page(client, {"since": position, "limit": PAGE_SIZE})
        yield page
        position = page.next_since
        if not page.more:
            return


def _latest(client: AdminClient, count: int) -> Iterator[EventsPage]:
    """The pages of the latest ``count`` events. More than a page are read as the events
    after the position ``count`` before the last (as the API reads "the last ``limit``
    positions"), page after page."""
    if count > PAGE_SIZE:
        start = max(0, _page(client, {"limit": 1}).next_since - count)
        yield from _pages_after(client, start)
        return
    page = _page(client, {"limit": max(count, 1)})
    shown = page.events[max(len(page.events) - count, 0) :] if count else []
    yield EventsPage(events=shown, next_since=page.next_since, more=False)


def _page(client: AdminClient, params: dict[str, int | str]) -> EventsPage:
    return call(client, EventsPage, "GET", EVENTS_PATH, params={**params, "follow": "false"}).value


def _print_page(events: list[msgspec.Raw], output: OutputFormat) -> None:
    if output == "json":
        print_json_array(events)
        return
    rows = [event_row(_event(raw)) for raw in events]
    count = counted(len(rows), "event")
    print_table(COLUMNS, rows, title=f"the log: {count}", wide=output == "wide")


def _follow(client: AdminClient, position: int, output: OutputFormat) -> None:
    """Print every event after ``position`` as it arrives, forever (until Ctrl-C)."""
    lost_since: float | None = None
    while True:
        parser = SseParser()
        try:
            for line in stream_lines(
                client,
                EVENTS_PATH,
                {"since": position},
                headers={"accept": "text/event-stream"},
                idle_timeout_s=IDLE_TIMEOUT_S,
            ):
                lost_since = None
                if stdout_reader_gone(unknown=False):
                    # Asked at every line, the server's keepalives included: on a quiet log
                    # no write would find the reader gone until the next event.
                    raise BrokenPipeError(errno.EPIPE, "the output's reader has gone")
                message = parser.feed(line)
                if message is None:
                    continue
                if message.event == REFUSED_EVENT:
                    raise ClientError(
                        f"the admin API ended the stream after position {position}: "
                        f"{message.data[:MAX_REFUSAL_CHARS]}"
                    )
                streamed = position if message.id is None else _stream_position(message.id)
                _print_line(msgspec.Raw(message.data.encode()), output)
                position = streamed
            reason = "the server closed the stream"
        except (AdminUnreachable, TlsFailure) as exc:
            reason = str(exc)
            if lost_since is None:
                lost_since = time.monotonic()
            elif time.monotonic() - lost_since > RESUME_WITHIN_S:
                raise ClientError(f"gave up resuming after position {position}: {exc}") from exc
        warn(f"llmgw-cli events: {reason}; resuming after position {position}")
        time.sleep(1.0 if lost_since is not None else 0.1)


def _stream_position(event_id: str) -> int:
    """A streamed event's id: its log position, where a lost connection resumes after it;
    an ``ApiProblem`` when it is not one."""
    if _POSITION.fullmatch(event_id) is None or int(event_id) > _MAX_POSITION:
        raise ApiProblem(
            200,
            f"the admin API sent a stream id this client cannot resume from: {event_id[:64]!r} "
            "is not a log position",
        )
    return int(event_id)


def _event(raw: msgspec.Raw | bytes) -> EventView:
    """One event of the page or stream; an ``ApiProblem`` when it is not one (a server
    that is not the admin API, or of another version)."""
    try:
        return _event_decoder.decode(raw)
    except UNREADABLE as exc:
        raise unreadable("an event", exc) from exc


def _print_line(raw: msgspec.Raw, output: OutputFormat) -> None:
    if output == "json":
        try:
            print_json_line(raw)
        except UNREADABLE as exc:
            raise unreadable("an event", exc) from exc
        return
    view = _event(raw)
    correlation = f"  [{view.correlation_id}]" if view.correlation_id else ""
    say(
        f"{view.position:>8}  {utc_seconds(view.recorded_at)}  {view.type:<{EVENT_TYPE_WIDTH}} "
        f"{view.actor:<16} {view.summary}{correlation}"
    )
