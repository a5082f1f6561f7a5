"""A request that waits for its key's grant (limits shared between gateways,
``app.gateway.sharedlimits``) and whose client leaves meanwhile.

Given a key whose credit a first request has spent, the next request waits for the grant
asked for, as a burst does (``GRANT_WAIT_S``). When its client leaves during that wait the
request ends there, as it would in the router's queue: the grant that comes afterwards
charges it nothing, and no engine is asked. Served by the listeners' own server (its
``ON_DISCONNECT`` callback) or by another ASGI server (``http.disconnect`` from
``receive``); for a completion and for an upload.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from app.gateway import exchange_steps
from app.gateway.asgi import KeyCheck, Message, Scope
from app.gateway.completions import Completions
from app.gateway.exchange_steps import ExchangeSteps
from app.gateway.metrics import GatewayMetrics
from app.gateway.sharedlimits import SharedLimiter
from app.gateway.table import GatewaySnapshot
from app.gateway.uploads import Uploads
from app.listeners.exchange import ON_DISCONNECT, ClientGone
from tests.support.gateway import new_key

MODEL = "m"
RPM = 60
CHAT = "/v1/chat/completions"
UPLOAD = "/v1/audio/transcriptions"
FORM = (
    b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n'
    b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
    b"Content-Type: audio/wav\r\n\r\nRIFF\r\n--b--\r\n"
)


class ObservedLimiter(SharedLimiter):
    """The shared limiter, telling when a request starts waiting for a grant."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()

    async def answered(self, within_s: float) -> None:
        self.waiting.set()
        await super().answered(within_s)


class Engines:
    """The upstream: records each request that would have gone to an engine, and holds
    it, as an engine that has not answered yet."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def open(self, model: str, *args: Any) -> Any:
        self.asked.append(model)
        await asyncio.Event().wait()

    async def open_upload(self, model: str, *args: Any) -> Any:
        return await self.open(model)


class Client:
    """The ASGI side of one request: its whole body at once, then nothing until it
    leaves (``leave``)."""

    def __init__(self, body: bytes, *, server_callback: bool) -> None:
        self.body: bytes | None = body
        self.server_callback = server_callback
        self.gone = ClientGone()
        self.left = asyncio.Event()
        self.sent: list[Message] = []

    def scope(self, path: str, authorization: bytes) -> Scope:
        content_type = b"multipart/form-data; boundary=b" if path == UPLOAD else b"application/json"
        scope: Scope = {
            "type": "http",
            "method": "POST",
            "path": path,
            "headers": [(b"authorization", authorization), (b"content-type", content_type)],
            "client": ("127.0.0.1", 50000),
        }
        if self.server_callback:
            scope["extensions"] = {ON_DISCONNECT: self.gone.on_disconnect}
        return scope

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def leave(self) -> None:
        self.left.set()
        self.gone.left()


@pytest.mark.parametrize("server_callback", [True, False], ids=["on_disconnect", "receive"])
@pytest.mark.parametrize("path", [CHAT, UPLOAD])
async def test_a_client_that_leaves_while_its_request_waits_for_a_grant_is_not_charged_or_forwarded(
    monkeypatch: pytest.MonkeyPatch, path: str, server_callback: bool
) -> None:
    # However long the wait may last, the client leaving is what ends it.
    monkeypatch.setattr(exchange_steps, "GRANT_WAIT_S", 60.0)
    key, record = new_key(rpm=RPM)
    snapshot = GatewaySnapshot(
        declared=frozenset({MODEL}),
        apis={MODEL: frozenset({"chat", "transcriptions"})},
        keys={record.prefix: record},
    )
    limiter, metrics, engines = ObservedLimiter(), GatewayMetrics(), Engines()
    steps = ExchangeSteps(
        snapshot=lambda: snapshot, metrics=metrics, limiter=limiter, keys=KeyCheck()
    )
    app = Uploads(steps) if path == UPLOAD else Completions(steps)
    steps.upstream = engines  # type: ignore[assignment]
    # A request before spent the key's credit: the next one waits for the grant on its way.
    assert limiter.admit(record.key_id, rpm=RPM, tpm=None, now=time.monotonic()).allowed
    client = Client(FORM if path == UPLOAD else b'{"model": "m"}', server_callback=server_callback)

    request = asyncio.create_task(
        app(client.scope(path, f"Bearer {key}".encode()), client.receive, client.send)
    )
    await asyncio.wait_for(limiter.waiting.wait(), 10)
    client.leave()
    (ask,) = limiter.asks(time.monotonic())
    limiter.granted(ask, ask.want, 1, ask.want, 1.0, time.monotonic())
    await asyncio.wait_for(request, 10)

    assert engines.asked == [], "forwarded to an engine though its client had left"
    # The grant pays the first request's credit; the rest of it is still held, unspent.
    held = sum(lease.amount for lease in limiter.everything_held())
    assert held == ask.want - 1, "charged for a request whose client had left"
    assert client.sent == []
    page = metrics.render().decode()
    assert f'llmgw_gateway_requests_total{{model="{MODEL}",status="499"}} 1.0' in page
