"""A stand-in admin API for the CLI's unit tests: a real HTTP server on 127.0.0.1 whose
answers a test writes (``StubHandler`` subclasses), so the CLI's own client, over a real
socket, meets answers no real admin API gives.

    class Refusing(StubHandler):
        def do_GET(self) -> None:
            self.answer(409, "application/problem+json", b'{"title": "conflict"}')

    with stub_admin_api(Refusing, monkeypatch) as url:
        drain("gpu-1", connection=ConnectionFlags(admin_url=url))
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

POLL_S = 0.01
"""How often a stub server looks for its shutdown: ``shutdown()`` waits up to this long, and
at the standard library's 0.5 s each test using a stub spent most of its time there."""


class StubHandler(BaseHTTPRequestHandler):
    """Answers as a test's subclass says; logs nothing."""

    def answer(
        self,
        status: int,
        content_type: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def stub_admin_api(
    handler: type[BaseHTTPRequestHandler], monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Serve ``handler`` until the block ends; its URL. No CLI config file is read."""
    monkeypatch.setenv("LLMGW_CONFIG", "/dev/null")
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class RecordingAdmin:
    """A stub admin API that notes every request it is sent (``"POST /admin/v1/…"``) and
    refuses each with a 500: a test of a usage error sees that nothing was sent."""

    url: str = ""
    sent: list[str] = field(default_factory=list)


@contextmanager
def recording_admin_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingAdmin]:
    recording = RecordingAdmin()

    class Recording(StubHandler):
        def _note(self) -> None:
            recording.sent.append(f"{self.command} {self.path}")
            self.answer(500, "text/plain", b"")

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _note

    with stub_admin_api(Recording, monkeypatch) as url:
        recording.url = url
        yield recording


def listed_key(n: int, **fields: object) -> dict[str, object]:
    """Key number ``n`` as the admin API lists it (``fields`` added or replaced)."""
    return {
        "id": f"k-{n:08x}",
        "prefix": f"{n:08x}",
        "name": f"key-{n}",
        "models": ["*"],
        "created_at": "2026-12-01T09:00:00Z",
        **fields,
    }


def listed_event(position: int) -> dict[str, object]:
    """An event at ``position`` as the admin API lists a node's history."""
    return {
        "position": position,
        "recorded_at": "2026-12-01T09:00:00Z",
        "stream": "node-gpu-1",
        "type": "node_cordoned",
        "actor": "alice",
    }
