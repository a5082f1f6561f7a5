"""The gateway's ASGI application: OpenAI's API in front of the replicas.

Raw ASGI rather than a framework: every completion request passes through here, and a
gateway is only worth having if it costs next to nothing (see docs/performance.md).

Routes::

    GET  /v1/models             the models the key may use, with the APIs each serves
    GET  /v1/models/{model}     one of them (the SDK's ``models.retrieve``)
    POST /v1/chat/completions   forwarded to a replica of the body's ``model``
    POST /v1/completions        likewise (both in ``app.gateway.completions``)
    POST /v1/embeddings, /v1/responses, /v1/rerank, /v1/score, /v1/tokenize,
         /v1/detokenize         likewise, for models whose spec names the API
                                (``app.gateway.endpoints``)
    POST /v1/audio/transcriptions   a multipart upload, streamed to a replica
    POST /v1/audio/translations     the same, for a translation
                                (``app.gateway.uploads``)
    GET  /healthz               200 while the process serves
    GET  /readyz                200, or 503 with the reason when the routing table is stale;
                                either says ``limits`` when rate limits are enforced
                                locally because the database does not answer

Every GET route answers HEAD as GET would, key check included, without the body
(``app.gateway.asgi.takes``, ``bodiless``): what probes send.

``/metrics`` is not among them: it names every model and replica, so it is served only
where operators reach it, by ``MetricsApp`` on a listener of its own (a standalone
gateway's, loopback by default) or by the admin API (a gateway inside ``serve``).

Every answer but the last two carries ``x-request-id`` and ``x-llmgw-gateway-ms``: the
time the gateway itself added, which is the request's time so far minus the time spent
waiting on engines (queueing for a free replica counts as the gateway's). For a stream it
is measured when the answer starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import msgspec

from app.gateway.asgi import (
    JSON,
    KeyCheck,
    Receive,
    Scope,
    Send,
    bodiless,
    clock,
    gateway_headers,
    refuse,
    respond,
    takes,
)
from app.gateway.completions import Completions
from app.gateway.endpoints import JSON_ENDPOINTS, UPLOAD_ENDPOINTS
from app.gateway.engine_bounds import EngineTimeouts
from app.gateway.engine_client import EngineClient
from app.gateway.errors import (
    ApiError,
    method_not_allowed,
    model_id_missing,
    model_not_found,
    not_found,
)
from app.gateway.exchange_steps import ExchangeSteps
from app.gateway.metrics import GatewayMetrics
from app.gateway.proxy import Upstream
from app.gateway.ratelimit import Limiter
from app.gateway.routed_urls import RoutedUrls
from app.gateway.router import Router
from app.gateway.table import GatewaySnapshot
from app.gateway.traffic import TrafficWindow
from app.gateway.uploads import DEFAULT_MAX_UPLOAD_BYTES, Uploads
from app.listeners.throttle import FailureBudget
from wire.asgi import serve_lifespan

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

_MODEL_PATH = "/v1/models/"
"""``GET /v1/models/{model}``: the rest of the path is the model's name, slashes and all
(``org/model``), as the SDK sends it."""

_TEXT = (b"content-type", b"text/plain; charset=utf-8")
_METRICS = (b"content-type", b"text/plain; version=0.0.4; charset=utf-8")


class _ModelCard(msgspec.Struct):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "llmgw"
    apis: list[str] = []
    """The APIs the model is served on (``ModelSpec.apis``), beyond OpenAI's card."""


class _ModelList(msgspec.Struct):
    data: list[_ModelCard]
    object: str = "list"


def _card(snapshot: GatewaySnapshot, model: str) -> _ModelCard:
    created = snapshot.created.get(model, 0)
    return _ModelCard(id=model, created=created, apis=sorted(snapshot.apis_of(model)))


class GatewayApp:
    """The application; ``snapshot`` is replaced whole when the routing table changes."""

    def __init__(
        self,
        *,
        router: Router,
        metrics: GatewayMetrics,
        limiter: Limiter,
        stale_reason: Callable[[], str | None],
        connect_timeout_s: float = 5.0,
        engine_timeouts: EngineTimeouts | None = None,
        log_requests: bool = True,
        failures: FailureBudget | None = None,
        traffic: TrafficWindow | None = None,
        max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
        limits_reason: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._router = router
        self._limits_reason = limits_reason
        self._metrics = metrics
        self._traffic = traffic or TrafficWindow()
        self._keys = KeyCheck(failures)
        self._stale_reason = stale_reason
        self._connect_timeout_s = connect_timeout_s
        self._engine_timeouts = engine_timeouts or EngineTimeouts()
        self._session: aiohttp.ClientSession | None = None
        self._engines: EngineClient | None = None
        self.snapshot = GatewaySnapshot()
        self._routed = RoutedUrls()
        self._steps = ExchangeSteps(
            snapshot=lambda: self.snapshot,
            metrics=metrics,
            limiter=limiter,
            keys=self._keys,
            log_requests=log_requests,
            traffic=self._traffic,
        )
        self._completions = Completions(self._steps)
        self._uploads = Uploads(self._steps, max_upload_bytes=max_upload_bytes)
        self._routes: dict[str, tuple[str, Handler]] = {
            **{path: ("POST", self._completions) for path in JSON_ENDPOINTS},
            **{path: ("POST", self._uploads) for path in UPLOAD_ENDPOINTS},
            "/v1/models": ("GET", self._models),
            "/healthz": ("GET", self._healthz),
            "/readyz": ("GET", self._readyz),
        }

    def use(self, snapshot: GatewaySnapshot) -> None:
        """Serve by ``snapshot`` from now on; engines it no longer routes to lose their
        connection pools."""
        self.snapshot = snapshot
        gone = self._routed.take(snapshot.routes)
        if self._engines is not None:
            self._engines.keep_only(self._routed, among=gone)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            route = self._routes.get(path)
            if route is None and path.startswith(_MODEL_PATH):
                route = ("GET", self._model)
            send = bodiless(scope, send)
            if route is None:
                refusal = not_found(path, served_at=self._under_v1(path))
                await refuse(send, refusal, gateway_headers(clock()))
            elif not takes(scope["method"], route[0]):
                await refuse(send, method_not_allowed(route[0], path), gateway_headers(clock()))
            else:
                await route[1](scope, receive, send)
        elif scope["type"] == "lifespan":
            await serve_lifespan(receive, send, startup=self._start, shutdown=self._stop)

    def _under_v1(self, path: str) -> str | None:
        """``/v1`` and ``path``, when that is a route: what a client whose base URL left out
        ``/v1`` meant (``/chat/completions``, ``/models/m``). Only a refused path pays for it."""
        meant = "/v1" + path
        if meant in self._routes or meant.startswith(_MODEL_PATH):
            return meant
        return None

    async def _start(self) -> None:
        # aiohttp for the scrapers; the lean client for the requests themselves.
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s)
        )
        self._engines = EngineClient(
            connect_timeout_s=self._connect_timeout_s,
            timeouts=self._engine_timeouts,
            on_timeout=self._metrics.engine_timed_out,
        )
        self._steps.upstream = Upstream(
            self._router, self._engines, self._metrics.retried, self._traffic
        )
        self._steps.loop = asyncio.get_running_loop()
        await self._router.start(self._session)

    async def _stop(self) -> None:
        try:
            await self._router.close()
        finally:
            if self._engines is not None:
                self._engines.close()
            if self._session is not None:
                await self._session.close()

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = clock()
        try:
            key = self._keys.authenticate(self.snapshot, scope)
        except ApiError as error:
            await refuse(send, error, gateway_headers(started))
            return
        snapshot = self.snapshot
        cards = [_card(snapshot, model) for model in snapshot.models_for(key)]
        body = msgspec.json.encode(_ModelList(data=cards))
        await respond(send, 200, body, [JSON, *gateway_headers(started)])

    async def _model(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = clock()
        snapshot = self.snapshot
        model = scope["path"].removeprefix(_MODEL_PATH)
        try:
            key = self._keys.authenticate(snapshot, scope)
            if not model:
                raise model_id_missing()
            if not snapshot.shows(key, model):
                raise model_not_found(model)
        except ApiError as error:
            await refuse(send, error, gateway_headers(started))
            return
        body = msgspec.json.encode(_card(snapshot, model))
        await respond(send, 200, body, [JSON, *gateway_headers(started)])

    async def _healthz(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, b"ok\n", [_TEXT])

    async def _readyz(self, scope: Scope, receive: Receive, send: Send) -> None:
        reason = self._stale_reason()
        limits = self._limits_reason()
        if reason is None and limits is None:
            await respond(send, 200, b'{"status":"ready"}', [JSON])
            return
        if reason is None:
            # Still serving, and ready: only the limits are approximate meanwhile.
            body = msgspec.json.encode({"status": "degraded", "limits": limits})
            await respond(send, 200, body, [JSON])
            return
        view: dict[str, str] = {"status": "stale", "reason": reason}
        if limits is not None:
            view["limits"] = limits
        await respond(send, 503, msgspec.json.encode(view), [JSON])


class MetricsApp:
    """``GET /metrics`` (Prometheus text) and nothing else: the app of a gateway's internal
    listener."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        send = bodiless(scope, send)
        if path != "/metrics":
            await refuse(send, not_found(path), [])
        elif not takes(scope["method"], "GET"):
            await refuse(send, method_not_allowed("GET", path), [])
        else:
            await respond(send, 200, self._metrics.render(), [_METRICS])
