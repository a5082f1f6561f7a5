"""`llmgw-cli events --follow` over a long log: what it must print before it follows is
printed page by page as it is read, not held until the last page has come."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

from app.domain.events import EVENT_TYPES
from cli.config import ConnectionFlags
from cli.events import events
from tests.support.stub_admin import StubHandler, stub_admin_api


def an_event(position: int) -> dict[str, object]:
    return {
        "position": position,
        "recorded_at": "2026-12-04T17:00:00Z",
        "stream": "node-gpu-1",
        "version": position,
        "type": "node_cordoned",
        "actor": "alice",
        "summary": f"node gpu-1 cordoned ({position})",
        "data": {},
    }


class FirstPageOnly(StubHandler):
    """A log whose first page after position 0 reads, with more after it; every later
    page fails (a server stopping under the reader)."""

    def do_GET(self) -> None:
        since = parse_qs(urlsplit(self.path).query).get("since", ["0"])[0]
        if since == "0":
            status = 200
            document: object = {
                "events": [an_event(1), an_event(2)],
                "next_since": 2,
                "more": True,
            }
        else:
            status = 503
            document = {"title": "unavailable", "status": 503, "detail": "the server stops"}
        self.answer(status, "application/json", json.dumps(document).encode())


@pytest.fixture
def admin_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with stub_admin_api(FirstPageOnly, monkeypatch) as url:
        yield url


def test_following_from_a_position_prints_each_page_of_the_backlog_as_it_is_read(
    admin_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, every page after --since was read and held before the first line was
    # printed: on a log of millions of events, minutes of silence and as many events in
    # memory; a failure on the way printed nothing of what had been read.
    code = events(
        follow=True, since=0, output="json", connection=ConnectionFlags(admin_url=admin_url)
    )

    captured = capsys.readouterr()
    assert code == 1
    assert [json.loads(line)["position"] for line in captured.out.splitlines()] == [1, 2]
    assert captured.err == "llmgw-cli events: the server stops\n"


class StreamEndedByTheServer(StubHandler):
    """An empty log whose stream sends one event, then ends for good: the operator
    certificate it was opened with has ended."""

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        if query.get("follow") == ["false"]:
            page = {"events": [], "next_since": 0, "more": False}
            self.answer(200, "application/json", json.dumps(page).encode())
            return
        stream = (
            ": following the log after position 0\n\n"
            f"id: 1\ndata: {json.dumps(an_event(1))}\n\n"
            "event: refused\n"
            "data: the operator certificate of 'alice' expired on 2026-12-05 04:00:00 UTC; "
            "issue one with `llmgw-cli cert operator <name>`\n\n"
        )
        self.answer(200, "text/event-stream", stream.encode())


def test_following_stops_with_the_reason_when_the_server_ends_the_stream_for_good(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, the refusal was taken for an event (and not one this client could read), or,
    # had it been skipped, the stream resumed with a certificate the handshake refuses.
    with stub_admin_api(StreamEndedByTheServer, monkeypatch) as url:
        code = events(follow=True, output="json", connection=ConnectionFlags(admin_url=url))

    captured = capsys.readouterr()
    assert code == 1
    assert [json.loads(line)["position"] for line in captured.out.splitlines()] == [1]
    assert captured.err == (
        "llmgw-cli events: the admin API ended the stream after position 1: the operator "
        "certificate of 'alice' expired on 2026-12-05 04:00:00 UTC; issue one with "
        "`llmgw-cli cert operator <name>`\n"
    )


class EveryTypeThenUnavailable(StubHandler):
    """A log of one event of each type, then a server that stops under the reader."""

    def do_GET(self) -> None:
        since = parse_qs(urlsplit(self.path).query).get("since", ["0"])[0]
        if since != "0":
            document = {"title": "unavailable", "status": 503, "detail": "the server stops"}
            self.answer(503, "application/json", json.dumps(document).encode())
            return
        found = [
            an_event(position) | {"type": event_type}
            for position, event_type in enumerate(sorted(EVENT_TYPES, key=len), start=1)
        ]
        page = {"events": found, "next_since": len(found), "more": True}
        self.answer(200, "application/json", json.dumps(page).encode())


def test_each_event_followed_has_its_actor_in_one_column_whatever_its_type(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`events --follow` prints an event a line, its type padded: a type wider than the
    padding (`rollout_hold_ejection_seen`) pushed the rest of its line out of line."""
    with stub_admin_api(EveryTypeThenUnavailable, monkeypatch) as url:
        events(follow=True, since=0, connection=ConnectionFlags(admin_url=url))

    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(EVENT_TYPES)
    assert len({line.index(" alice ") for line in lines}) == 1, lines
