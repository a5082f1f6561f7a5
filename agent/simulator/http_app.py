"""The simulator's HTTP server: a small raw ASGI application, served by uvicorn.

Raw ASGI rather than a framework, for two reasons. A client that goes away must abort
its request in the engine whether it left mid-stream or before the first byte of a
streamed or non-streamed answer; with the ASGI ``receive`` channel in hand, one watcher
per request sees ``http.disconnect`` the moment the connection drops. And the gateway's
benchmark pushes more than a thousand requests a second through the simulator on a small
machine, so each request costs one dictionary lookup for its route and one msgspec
decode and encode, nothing more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import msgspec

from agent.simulator import pooling
from agent.simulator.capacity import RequestTooLarge
from agent.simulator.config import ServerConfig
from agent.simulator.engine import RequestHandle, SimEngine
from agent.simulator.errors import (
    ApiError,
    context_length_exceeded,
    error_body,
    not_ready,
)
from agent.simulator.generation import Generation, parse_chat, parse_completion, parse_responses
from agent.simulator.metrics import EngineMetrics, render
from agent.simulator.pooling import Vocabulary
from agent.simulator.responses import Renderer, renderer_for
from agent.simulator.transcriptions import TranscriptionReader, UploadStats
from agent.simulator.wire import (
    DetokenizeRequest,
    EmbeddingsRequest,
    ModelCard,
    ModelList,
    RerankRequest,
    ScoreRequest,
    TokenizeRequest,
)
from wire.asgi import Receive, Scope, Send, serve_lifespan

Handler = Callable[[Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 32 * 1024 * 1024
UPLOAD_TASKS = {"/v1/audio/transcriptions": "transcribe", "/v1/audio/translations": "translate"}
"""The upload paths, and the task each names in a ``verbose_json`` answer."""

_JSON = (b"content-type", b"application/json")
_TEXT = (b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


class _ClientGone(Exception):
    """The client disconnected before its request body arrived."""


class SimulatorApp:
    """The ASGI application. ``on_fatal`` ends the process: it is how faults exit."""

    def __init__(self, config: ServerConfig, on_fatal: Callable[[str], None]) -> None:
        self._config = config
        self._on_fatal = on_fatal
        self.metrics = EngineMetrics()
        self.ready = False
        self._engine: SimEngine | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._served = 0
        self._created = 0
        self._routes: dict[str, tuple[str, Handler]] = {
            "/health": ("GET", self._health),
            "/metrics": ("GET", self._metrics),
            "/v1/models": ("GET", self._models),
            "/v1/chat/completions": ("POST", self._chat),
            "/v1/completions": ("POST", self._completion),
            "/reset_prefix_cache": ("POST", self._reset_prefix_cache),
            "/v1/responses": ("POST", self._responses),
            "/v1/embeddings": ("POST", self._embeddings),
            "/v1/rerank": ("POST", self._rerank),
            "/rerank": ("POST", self._rerank),
            "/v1/score": ("POST", self._score),
            "/score": ("POST", self._score),
            "/tokenize": ("POST", self._tokenize),
            "/detokenize": ("POST", self._detokenize),
            "/sim/uploads": ("GET", self._upload_stats),
        }
        self._vocabulary = Vocabulary()
        self.uploads = UploadStats()

    @property
    def engine(self) -> SimEngine:
        if self._engine is None:
            raise RuntimeError("the engine starts with the application's lifespan")
        return self._engine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await serve_lifespan(receive, send, startup=self._start, shutdown=self._stop)

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._created = int(time.time())
        self._engine = SimEngine(self._config.capacity, self.metrics)
        self._tasks.append(loop.create_task(self._engine.run()))
        faults = self._config.faults
        if not faults.never_ready:
            loop.call_later(faults.start_delay_s, self._become_ready)
        if faults.exit_after_s is not None:
            loop.call_later(
                faults.exit_after_s,
                self._on_fatal,
                f"simulated engine failure: exiting {faults.exit_after_s:g} s after start "
                "(--exit-after)",
            )

    async def _stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    def _become_ready(self) -> None:
        self.ready = True

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._routes.get(scope["path"])
        try:
            task = UPLOAD_TASKS.get(scope["path"])
            if task is not None and scope["method"] == "POST":
                await self._transcribe(scope, receive, send, task)
                return
            if route is None:
                raise ApiError(404, f"No route for {scope['path']}.", code="not_found")
            method, handler = route
            if scope["method"] != method:
                raise ApiError(405, f"Use {method} for {scope['path']}.", code="method_not_allowed")
            await handler(receive, send)
        except ApiError as error:
            await _respond(send, error.status, error_body(error, self._config.error_style), _JSON)
        except _ClientGone:
            return

    async def _health(self, receive: Receive, send: Send) -> None:
        if not self.ready:
            raise not_ready()
        await _respond(send, 200, b"", _TEXT)

    async def _metrics(self, receive: Receive, send: Send) -> None:
        if self._config.faults.without_metrics:
            raise ApiError(404, "No route for /metrics.", code="not_found")
        text = render(self.metrics, self.engine.gauges(), self._config.model, self._config.profile)
        await _respond(send, 200, text.encode(), _TEXT)

    async def _models(self, receive: Receive, send: Send) -> None:
        self._require_ready()
        models = ModelList(data=[ModelCard(id=self._config.model, created=self._created)])
        await _respond(send, 200, msgspec.json.encode(models), _JSON)

    async def _reset_prefix_cache(self, receive: Receive, send: Send) -> None:
        self.engine.reset_prefix_cache()
        await _respond(send, 200, b"", _TEXT)

    async def _chat(self, receive: Receive, send: Send) -> None:
        self._require_ready()
        await self._generate(
            parse_chat(await _read_body(receive), self._config.model), receive, send
        )

    async def _completion(self, receive: Receive, send: Send) -> None:
        self._require_ready()
        generation = parse_completion(await _read_body(receive), self._config.model)
        await self._generate(generation, receive, send)

    async def _responses(self, receive: Receive, send: Send) -> None:
        self._require_ready()
        generation = parse_responses(await _read_body(receive), self._config.model)
        await self._generate(generation, receive, send)

    async def _embeddings(self, receive: Receive, send: Send) -> None:
        self._require_ready()
        request = pooling.decode(await _read_body(receive), EmbeddingsRequest, self._config.model)
        await _respond(send, 200, pooling.embeddings_body(request, self._config.model), _JSON)

    async def _rerank(self, receive: Receive, send: Send) -> None:
        self._require_ready()
        request = pooling.decode(await _read_body(receive), RerankRequest, self._config.model)
        await _respond(send, 200, pooling.rerank_body(request, self._config.model), _JSON)

    async def _score(self, receive: Receive, send: Send) -> None:
        self._require_ready()
        request = pooling.decode(await _read_body(receive), ScoreRequest, self._config.model)
        await _respond(send, 200, pooling.score_body(request, self._config.model), _JSON)

    async def _tokenize(self, receive: Receive, send: Send) -> None:
        self._require_ready()
        request = pooling.decode(await _read_body(receive), TokenizeRequest, self._config.model)
        await _respond(send, 200, self._vocabulary.tokenize_body(request), _JSON)

    async def _detokenize(self, receive: Receive, send: Send) -> None:
        self._require_ready()
        request = pooling.decode(await _read_body(receive), DetokenizeRequest, self._config.model)
        await _respond(send, 200, self._vocabulary.detokenize_body(request), _JSON)

    async def _upload_stats(self, receive: Receive, send: Send) -> None:
        await _respond(send, 200, msgspec.json.encode(self.uploads), _JSON)

    async def _transcribe(self, scope: Scope, receive: Receive, send: Send, task: str) -> None:
        """Read the upload as it arrives, never whole (``agent.simulator.transcriptions``);
        ``task`` is ``transcribe`` or ``translate``."""
        self._require_ready()
        content_type = ""
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value.decode("latin-1")
        reader = TranscriptionReader(content_type, self.uploads)
        self.uploads.in_progress += 1
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _ClientGone
                reader.feed(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        finally:
            self.uploads.in_progress -= 1
        content_type_header, body = reader.result(self._config.model, task).body()
        await _respond(send, 200, body, (b"content-type", content_type_header))
        self._count_served()

    def _require_ready(self) -> None:
        if not self.ready:
            raise not_ready()

    async def _generate(self, generation: Generation, receive: Receive, send: Send) -> None:
        generation = generation.ending_at_eos(self._config.eos_after_tokens)
        try:
            handle = self.engine.submit(
                generation.prompt, generation.max_tokens, streaming=generation.stream
            )
        except RequestTooLarge as exc:
            raise context_length_exceeded(exc.context, exc.prompt_tokens, exc.max_tokens) from exc
        watcher = asyncio.create_task(self._abort_on_disconnect(receive, handle))
        renderer = renderer_for(generation, self._config.model)
        try:
            if generation.stream:
                await _stream(handle, renderer, send)
            else:
                await handle.wait_until_done()
                if handle.finished:
                    await _respond(send, 200, renderer.body(handle.generated), _JSON)
        finally:
            watcher.cancel()
            self.engine.abort(handle)
            self._count_served()

    async def _abort_on_disconnect(self, receive: Receive, handle: RequestHandle) -> None:
        # After the body, the only message left is http.disconnect: the client went
        # away, or the response is complete and the request already finished.
        while (await receive())["type"] != "http.disconnect":
            pass
        self.engine.abort(handle)

    def _count_served(self) -> None:
        self._served += 1
        limit = self._config.faults.crash_after_requests
        if limit is not None and self._served == limit:
            # Let the answer just written leave before the process ends.
            asyncio.get_running_loop().call_soon(
                self._on_fatal,
                f"simulated engine crash after {limit} requests (--crash-after-requests)",
            )


async def _stream(handle: RequestHandle, renderer: Renderer, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    pending = renderer.opening()
    seen = 0
    while True:
        generated = await handle.wait_for_tokens(seen)
        if handle.aborted:
            return
        pending += renderer.tokens(seen, generated)
        seen = generated
        if handle.finished:
            pending += renderer.closing(seen)
            await send({"type": "http.response.body", "body": pending, "more_body": False})
            return
        await send({"type": "http.response.body", "body": pending, "more_body": True})
        pending = b""


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(413, f"The request body exceeds {MAX_BODY_BYTES} bytes.")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond(send: Send, status: int, body: bytes, content_type: tuple[bytes, bytes]) -> None:
    headers = [content_type, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
