"""What an attempt on a replica costs the gateway's hot path: one that gets its answer's head
(nearly every one) runs no coroutine of ``app.gateway.proxy`` but the ``open`` it was asked
for; how an attempt that gets none ends is settled where it ends, in an ``except``."""

from __future__ import annotations

import inspect
import sys
from collections.abc import AsyncIterator, Awaitable
from types import FrameType
from typing import cast

from app.gateway import proxy
from app.gateway.engine_answer import EngineAnswer
from app.gateway.engine_client import EngineClient
from app.gateway.proxy import Opened, Timing, Upstream
from tests.unit.test_gateway_router import key, route, router_with


class Answer:
    status = 200


class AnsweringEngine:
    """An engine whose answer's head is there at once."""

    async def post(self, base_url: str, path: str, body: bytes, request_id: str) -> EngineAnswer:
        return cast(EngineAnswer, Answer())

    async def upload(
        self,
        base_url: str,
        path: str,
        content_type: bytes,
        content_length: int | None,
        body: AsyncIterator[bytes],
        request_id: str,
    ) -> EngineAnswer:
        return cast(EngineAnswer, Answer())


class Form:
    content_type = b"multipart/form-data; boundary=b"
    content_length = 0
    started = False

    async def body(self) -> AsyncIterator[bytes]:
        yield b""


async def proxy_coroutines_run(opening: Awaitable[Opened]) -> list[str]:
    """The coroutines of ``app.gateway.proxy`` that run while ``opening`` is awaited."""
    run: list[str] = []

    def seen(frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        coroutine = code.co_flags & inspect.CO_COROUTINE
        if event == "call" and coroutine and code.co_filename == proxy.__file__:
            run.append(code.co_qualname)

    sys.setprofile(seen)
    try:
        await opening
    finally:
        sys.setprofile(None)
    return run


async def test_a_body_whose_head_comes_runs_no_coroutine_of_the_proxy_but_open() -> None:
    engine = cast(EngineClient, AnsweringEngine())
    upstream = Upstream(router_with(route("r-1")), engine)
    opening = upstream.open("m", key(), "/v1/chat/completions", b"{}", "req-1", Timing(0.0))

    assert await proxy_coroutines_run(opening) == ["Upstream.open"]


async def test_an_upload_whose_head_comes_runs_no_coroutine_of_the_proxy_but_open_upload() -> None:
    engine = cast(EngineClient, AnsweringEngine())
    upstream = Upstream(router_with(route("r-1")), engine)
    form = cast(proxy.Upload, Form())
    opening = upstream.open_upload("m", key(), "/v1/audio/transcriptions", form, "r", Timing(0.0))

    assert await proxy_coroutines_run(opening) == ["Upstream.open_upload"]
