"""A lean HTTP/1.1 client for the one request the gateway sends most: a POST to an engine.

Why not aiohttp, which the gateway uses to scrape engine metrics: on this path it cost
about 260 us of CPU per request against 50 us for this client (measured against the
simulator on uvloop; see docs/performance.md), which was most of what the gateway added.
This client does only what forwarding needs: keep-alive connections pooled per engine,
one write per request (head and body together), answers parsed by httptools (the parser
uvicorn serves with), bodies handed over as they arrive, with back-pressure.

    answer = await client.post("http://10.0.0.7:8001", "/v1/chat/completions", body, rid)
    try:
        async for chunk in answer.chunks(): ...     # or: await answer.read()
    finally:
        answer.close()        # a finished answer's connection is back in the pool already;
                              # an unfinished one is closed, which aborts it in the engine

Its parts have a module each: the answer (``app.gateway.engine_answer``), the connection
that reads it (``app.gateway.engine_connection``), the bounds in bytes and time an engine is
held to (``app.gateway.engine_bounds``), and the errors (``app.gateway.engine_errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncGenerator, Container, Iterable
from urllib.parse import urlsplit

from app.gateway.engine_answer import EngineAnswer
from app.gateway.engine_bounds import EngineTimeouts, OnTimeout
from app.gateway.engine_connection import EngineConnection
from app.gateway.engine_errors import EngineUnreachable

KEEPALIVE_S = 4.0
"""Idle connections older than this are not reused: engines served by uvicorn (vLLM,
SGLang) close theirs after 5 s, and a request must not race that close."""


class EngineOrigin:
    """The pool of connections to one engine."""

    def __init__(
        self,
        base_url: str,
        connect_timeout_s: float,
        timeouts: EngineTimeouts,
        on_timeout: OnTimeout,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        secure = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if secure else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if secure else None
        self.prefix = parts.path.rstrip("/").encode()
        self.host_header = parts.netloc.encode("idna")
        self._connect_timeout_s = connect_timeout_s
        self.timeouts = timeouts
        self.on_timeout = on_timeout
        self._idle: list[EngineConnection] = []
        self._retired = False

    async def connection(self) -> tuple[EngineConnection, bool]:
        """An idle connection (and ``True``), or a new one (and ``False``)."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < KEEPALIVE_S:
                return connection, True
            connection.abandon()
        return await self.new_connection(), False

    async def new_connection(self) -> EngineConnection:
        """A connection of its own, never an idle one: an upload that has started cannot be
        sent again on another if a reused connection turns out to be closed."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: EngineConnection(self), self.host, self.port, ssl=self.ssl
                )
        except TimeoutError:
            raise EngineUnreachable(
                f"timed out connecting to {self.host}:{self.port} "
                f"after {self._connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise EngineUnreachable(
                f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}"
            ) from exc
        return connection

    def put(self, connection: EngineConnection) -> None:
        if self._retired:
            connection.abandon()
            return
        connection.idle_since = time.monotonic()
        self._idle.append(connection)

    def forget(self, connection: EngineConnection) -> None:
        if connection in self._idle:
            self._idle.remove(connection)

    def close(self) -> None:
        """Close the idle connections; a busy one closes when its answer is done."""
        self._retired = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.abandon()


class EngineClient:
    def __init__(
        self,
        *,
        connect_timeout_s: float = 5.0,
        timeouts: EngineTimeouts | None = None,
        on_timeout: OnTimeout = lambda bound: None,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._timeouts = timeouts or EngineTimeouts()
        self._on_timeout = on_timeout
        self._origins: dict[str, EngineOrigin] = {}
        self._opened: list[str] = []
        """Engines whose pool was opened since the last ``keep_only``."""

    async def post(self, base_url: str, path: str, body: bytes, request_id: str) -> EngineAnswer:
        """POST ``body`` (JSON) to ``base_url + path``; returns once the answer's head is in.

        A reused connection that the engine closed before answering is replaced by a new
        one, once: the engine never saw the request. ``HeadTimedOut`` when no head came
        within the head bound.
        """
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origin(base_url)
        request = (
            b"POST %s%s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nx-request-id: %s\r\n\r\n%s"
            % (
                origin.prefix,
                path.encode(),
                origin.host_header,
                len(body),
                request_id.encode(),
                body,
            )
        )
        while True:
            connection, reused = await origin.connection()
            answer = EngineAnswer(connection)
            connection.send(request, answer)
            try:
                await answer.head_arrival
            except EngineUnreachable:
                if reused and not connection.received_anything:
                    continue
                raise
            except BaseException:
                answer.close()
                raise
            return answer

    async def upload(
        self,
        base_url: str,
        path: str,
        content_type: bytes,
        content_length: int | None,
        body: AsyncGenerator[bytes, None],
        request_id: str,
    ) -> EngineAnswer:
        """POST a body that arrives as it is read from ``body`` (an upload), at the engine's
        pace; returns once the answer's head is in. ``content_length`` None sends the body
        chunked. An engine that answers before the body is all sent (a refusal) stops the
        sending; the answer is what it said.

        ``EngineUnreachable`` before anything of ``body`` was read means nothing was sent;
        whatever ``body`` raises (the client left, the upload is too large) is raised here,
        and the connection is closed."""
        origin = self._origin(base_url)
        connection = await origin.new_connection()
        connection.reusable = False
        framing = (
            b"transfer-encoding: chunked"
            if content_length is None
            else b"content-length: %d" % content_length
        )
        head = (
            b"POST %s%s HTTP/1.1\r\nhost: %s\r\ncontent-type: %s\r\n%s\r\nx-request-id: %s\r\n\r\n"
            % (
                origin.prefix,
                path.encode(),
                origin.host_header,
                content_type,
                framing,
                request_id.encode(),
            )
        )
        answer = EngineAnswer(connection)
        connection.send(head, answer, whole=False)
        try:
            # Closed when left early (the engine answered first), so the client's reader
            # stops where it is.
            async with contextlib.aclosing(body) as pieces:
                async for chunk in pieces:
                    if connection.answer_started or connection.closed:
                        break
                    if not chunk:
                        continue
                    if content_length is None:
                        chunk = b"%x\r\n%s\r\n" % (len(chunk), chunk)
                    await connection.write(chunk)
                else:
                    if content_length is None:
                        await connection.write(b"0\r\n\r\n")
            if not connection.closed:
                connection.start_clock()
            await answer.head_arrival
        except BaseException:
            answer.close()
            raise
        return answer

    def _origin(self, base_url: str) -> EngineOrigin:
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origins[base_url] = EngineOrigin(
                base_url, self._connect_timeout_s, self._timeouts, self._on_timeout
            )
            self._opened.append(base_url)
        return origin

    @property
    def pooled(self) -> frozenset[str]:
        """The engines (base URLs) it keeps a pool of connections to."""
        return frozenset(self._origins)

    def keep_only(self, base_urls: Container[str], *, among: Iterable[str] | None = None) -> None:
        """Close and forget the pools of every engine but ``base_urls`` (those still routed
        to): idle connections close now, busy ones when their answer is done. With
        ``among``, only the pools of those engines and of the ones opened since the last
        call are looked at: what a snapshot stopped routing to, and a pool opened after its
        engine left routing by a request that chose it just before."""
        candidates = list(self._origins) if among is None else [*among, *self._opened]
        self._opened.clear()
        for base_url in candidates:
            if base_url in base_urls:
                continue
            origin = self._origins.pop(base_url, None)
            if origin is not None:
                origin.close()

    def close(self) -> None:
        """Close the idle connections (answers in progress close their own)."""
        for origin in self._origins.values():
            origin.close()
        self._origins.clear()
