"""llmgw-cli facing a server that answers, but not as the admin API does (an event that is
no event, an answer that never ends, or one without end in size): one line on stderr and
exit 1, never a traceback, never a wait or a buffer without a bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from cli.client import (
    MAX_ANSWER_BYTES,
    AdminClient,
    AdminUnreachable,
    AnswerLost,
    AnswerTooLarge,
    ApiProblem,
)
from cli.config import ConnectionFlags, ConnectionSettings
from cli.events import events
from cli.nodes import list_nodes
from cli.operator import OutputFormat
from cli.readiness import readiness
from cli.streamed_lines import stream_lines
from tests.support.stub_admin import POLL_S, StubHandler, stub_admin_api

WRONG_EVENT = b'{"weird": 1}'


class NotTheAdminApi(StubHandler):
    """A page, and a stream, of events that are not events; a stream id that is no
    position."""

    def do_GET(self) -> None:
        if "follow=false" in self.path:
            body = b'{"events": [' + WRONG_EVENT + b'], "next_since": 1, "more": false}'
            content_type = "application/json"
        else:
            body = b"id: 1\ndata: " + WRONG_EVENT + b"\n\n"
            content_type = "text/event-stream"
        self.answer(200, content_type, body)


@pytest.fixture
def admin_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with stub_admin_api(NotTheAdminApi, monkeypatch) as url:
        yield url


@pytest.mark.parametrize(
    "how",
    [
        {"since": 0},
        {"last": 0, "output": "table", "follow": True},
        {"last": 1, "output": "table"},
    ],
)
def test_an_event_that_is_not_one_is_refused_in_one_line(
    admin_url: str, how: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    code = events(connection=ConnectionFlags(admin_url=admin_url), **how)  # type: ignore[arg-type]

    stderr = capsys.readouterr().err
    assert code == 1
    assert stderr.startswith("llmgw-cli events: the admin API sent an event this client")
    assert len(stderr.splitlines()) == 1


AN_EVENT = (
    b'{"position": 7, "recorded_at": "2026-03-02T09:00:00Z", "stream": "node-gpu-1", '
    b'"type": "node_cordoned", "actor": "alice"}'
)


class StreamIdNoPosition(StubHandler):
    """A page of no events, then a stream whose event is one, but whose id is no log
    position: nothing to resume after."""

    stream_id = b"drain-1"

    def do_GET(self) -> None:
        if "follow=false" in self.path:
            body = b'{"events": [], "next_since": 6, "more": false}'
            content_type = "application/json"
        else:
            body = b"id: " + self.stream_id + b"\ndata: " + AN_EVENT + b"\n\n"
            content_type = "text/event-stream"
        self.answer(200, content_type, body)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stream_id", [b"drain-1", b"-3", b"9" * 20, b"\xd9\xa1\xd9\xa2"])
@pytest.mark.parametrize("output", ["json", "table"])
def test_a_stream_id_that_is_no_position_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    output: OutputFormat,
    stream_id: bytes,
) -> None:
    monkeypatch.setattr(StreamIdNoPosition, "stream_id", stream_id)
    with stub_admin_api(StreamIdNoPosition, monkeypatch) as url:
        code = events(connection=ConnectionFlags(admin_url=url), follow=True, output=output)

    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""  # an event it could not resume after is not printed either
    assert captured.err.splitlines() == [
        "llmgw-cli events: the admin API sent a stream id this client cannot resume from: "
        f"{stream_id.decode()!r} is not a log position"
    ]


class Trickle(BaseHTTPRequestHandler):
    """An answer that never ends, a byte at a time, each well within a read timeout."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "100000")
        self.end_headers()
        try:
            while True:
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            return

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.timeout(30)
def test_an_answer_that_never_ends_is_given_up_within_a_bound() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True).start()
    settings = ConnectionSettings(admin_url=f"http://127.0.0.1:{server.server_address[1]}")
    try:
        with (
            AdminClient(settings, timeout_s=1.0, answer_within_s=1.0) as client,
            pytest.raises(AdminUnreachable, match="no whole answer within 1 s"),
        ):
            client.request("GET", "/admin/v1/nodes")
    finally:
        server.shutdown()
        server.server_close()


MIB = 2**20


class Oversized(BaseHTTPRequestHandler):
    """Answers without end in size, sent as fast as they are read: a body whose length is
    declared past the bound, or one that just goes on (``/declared``, ``/endless``; the
    admin API's paths for the nodes and for a page of events); an event stream whose line,
    or whose record of short lines, never ends."""

    status = 200
    declared = False
    stream_piece = b"x" * MIB

    def do_GET(self) -> None:
        if "follow=false" in self.path:
            self._answer(b'{"events": [], "next_since": 0, "more": false}')
        elif "/events" in self.path:
            self._endless(b"text/event-stream", b"data: ", self.stream_piece)
        else:
            self._endless(b"application/json", b"[", b" " * MIB)

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _endless(self, content_type: bytes, start: bytes, piece: bytes) -> None:
        self.send_response(self.status)
        self.send_header("content-type", content_type.decode())
        if self.declared:
            self.send_header("content-length", str(MAX_ANSWER_BYTES + 1))
        self.end_headers()  # HTTP/1.0 without a length: the body ends when the server closes
        try:
            self.wfile.write(start)
            while True:
                self.wfile.write(piece)
        except OSError:
            return

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serving(monkeypatch: pytest.MonkeyPatch, **behaviour: object) -> Iterator[str]:
    monkeypatch.setenv("LLMGW_CONFIG", "/dev/null")
    for name, value in behaviour.items():
        monkeypatch.setattr(Oversized, name, value)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Oversized)
    threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "endless"])
def test_an_answer_past_the_bound_is_refused_in_one_line_naming_it_and_the_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], declared: bool
) -> None:
    with serving(monkeypatch, declared=declared) as url:
        code = list_nodes(output="json", connection=ConnectionFlags(admin_url=url))

    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"llmgw-cli nodes: the admin API at {url} sent an answer over 64 MiB, the most "
        f"llmgw-cli reads (GET {url}/admin/v1/nodes): it is not the llmgw admin API, or it "
        "(or a proxy in front of it) is broken; check LLMGW_ADMIN_URL"
    ]


@pytest.mark.timeout(60)
def test_follow_refuses_a_streamed_event_past_the_bound_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(monkeypatch) as url:
        code = events(connection=ConnectionFlags(admin_url=url), follow=True, output="json")

    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"llmgw-cli events: the admin API at {url} sent a streamed record over 64 MiB, the "
        f"most llmgw-cli reads (GET {url}/admin/v1/events?since=0): it is not the llmgw "
        "admin API, or it (or a proxy in front of it) is broken; check LLMGW_ADMIN_URL"
    ]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "read",
    [
        lambda client: client.request("GET", "/admin/v1/nodes"),
        readiness,
        lambda client: list(stream_lines(client, "/admin/v1/events", {"since": 0})),
    ],
    ids=["an-answer", "readiness", "an-event-of-endless-short-lines"],
)
@pytest.mark.parametrize("status", [200, 500])
def test_every_read_of_the_client_is_bounded_error_answers_too(
    monkeypatch: pytest.MonkeyPatch, read: Callable[[AdminClient], object], status: int
) -> None:
    short_lines = b"data: 1\n" * 1000
    with serving(monkeypatch, status=status, stream_piece=short_lines) as url:
        settings = ConnectionSettings(admin_url=url)
        with (
            AdminClient(settings, max_answer_bytes=100_000) as client,
            pytest.raises(AnswerTooLarge, match="over 100,000 bytes, the most llmgw-cli reads"),
        ):
            read(client)


@pytest.mark.parametrize(
    "cut", [httpx.ReadError(""), httpx.RemoteProtocolError("")], ids=lambda e: type(e).__name__
)
def test_an_exchange_cut_off_without_a_word_is_named_by_its_kind(cut: httpx.TransportError) -> None:
    # Before, the reason was "{exc or ...}": an exception is always true, so the
    # parentheses stood empty: "broke off the exchange (): ...".
    def cut_off(request: httpx.Request) -> httpx.Response:
        raise cut

    settings = ConnectionSettings(admin_url="http://admin.invalid:8081")
    with (
        AdminClient(settings, transport=httpx.MockTransport(cut_off)) as client,
        pytest.raises(AdminUnreachable) as raised,
    ):
        client.request("GET", "/admin/v1/nodes")

    assert str(raised.value).startswith(
        "the admin API at http://admin.invalid:8081 broke off the exchange "
        f"({type(cut).__name__}): does the URL's scheme"
    ), str(raised.value)


DEEP = b"[" * 100_000 + b"]" * 100_000


class Nested(BaseHTTPRequestHandler):
    """An answer nested deeper than any decoder recurses, in a member the client does not
    know (skipped, but skipping recurses too): a list of nodes (``/nodes``), and an error
    answer's problem document (anything else)."""

    def do_GET(self) -> None:
        nodes = self.path.endswith("/nodes")
        body = (b'[{"unknown": ' if nodes else b'{"detail": "no", "unknown": ') + DEEP
        body += b"}]" if nodes else b"}"
        self.send_response(200 if nodes else 409)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize("path", ["/admin/v1/nodes", "/admin/v1/models"])
def test_an_answer_nested_past_the_decoders_depth_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], path: str
) -> None:
    monkeypatch.setenv("LLMGW_CONFIG", "/dev/null")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Nested)
    threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        if path.endswith("/nodes"):
            code = list_nodes(connection=ConnectionFlags(admin_url=url))
        else:
            with (
                AdminClient(ConnectionSettings(admin_url=url)) as client,
                pytest.raises(ApiProblem) as refused,
            ):
                client.request("GET", path)
            assert refused.value.status == 409
            assert "without a problem document" in str(refused.value)
            assert refused.value.extra == {}
            return
    finally:
        server.shutdown()
        server.server_close()

    stderr = capsys.readouterr().err
    assert code == 1
    assert "the admin API sent an answer this client cannot read" in stderr
    assert len(stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("method", "cut"),
    [("POST", httpx.ReadTimeout("")), ("DELETE", httpx.ReadError(""))],
    ids=["post-timed-out", "delete-cut-off"],
)
def test_a_change_whose_answer_never_came_may_have_been_done(
    method: str, cut: httpx.TransportError
) -> None:
    def lost(request: httpx.Request) -> httpx.Response:
        raise type(cut)("", request=request)

    settings = ConnectionSettings(admin_url="http://admin.invalid:8081")
    with (
        AdminClient(settings, timeout_s=2, transport=httpx.MockTransport(lost)) as client,
        pytest.raises(AnswerLost) as raised,
    ):
        client.request(method, "/admin/v1/keys/ci")

    assert f"{method} /admin/v1/keys/ci was sent and may have been carried out" in str(raised.value)


def test_a_read_whose_answer_never_came_is_only_unanswered() -> None:
    def lost(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("", request=request)

    settings = ConnectionSettings(admin_url="http://admin.invalid:8081")
    with (
        AdminClient(settings, timeout_s=2, transport=httpx.MockTransport(lost)) as client,
        pytest.raises(AdminUnreachable) as raised,
    ):
        client.request("GET", "/admin/v1/keys")

    assert not isinstance(raised.value, AnswerLost)
    assert "no answer within 2 s" in str(raised.value)
