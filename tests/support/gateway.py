"""A real gateway (its own HTTP server, real sockets) on its own event loop in a thread.

Tests drive it with blocking clients (the ``openai`` SDK's sync client) as well as async
ones, so it cannot share the test's loop:

    with GatewayThread(StaticSource(snapshot)) as gateway:
        client = openai.OpenAI(base_url=gateway.url, api_key=key)
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

import uvloop

from app.domain.egress import EngineNetworks
from app.domain.keys import format_key, hash_key
from app.gateway.server import Gateway, StaticSource
from app.gateway.table import GatewaySnapshot, KeyRecord, Route

T = TypeVar("T")

START_TIMEOUT_S = 20.0
LOOPBACK_ENGINES = EngineNetworks.parse("127.0.0.0/8")
"""Every engine a test starts listens on loopback: the gateway may contact nothing else."""


def new_key(
    *, models: frozenset[str] = frozenset(), rpm: int | None = None, tpm: int | None = None
) -> tuple[str, KeyRecord]:
    """A fresh API key (as a client sends it) and the record a gateway checks it against."""
    prefix = secrets.token_hex(4)
    key = format_key(prefix, secrets.token_urlsafe(32))
    record = KeyRecord(
        key_id=str(uuid.uuid4()),
        name=f"test-{prefix}",
        prefix=prefix,
        secret_hash=hash_key(key),
        models=models,
        rpm=rpm,
        tpm=tpm,
    )
    return key, record


def snapshot_of(
    routes: list[Route], keys: list[KeyRecord], declared: frozenset[str] = frozenset()
) -> GatewaySnapshot:
    by_model: dict[str, tuple[Route, ...]] = {}
    for route in routes:
        by_model[route.model] = (*by_model.get(route.model, ()), route)
    return GatewaySnapshot(
        declared=declared | frozenset(by_model),
        routes=by_model,
        keys={key.prefix: key for key in keys},
    )


class GatewayThread:
    def __init__(self, source: StaticSource, **options: Any) -> None:
        self.source = source
        self._options = {
            "port": 0,
            "graceful_shutdown_s": 1,
            "log_requests": False,
            "engine_networks": LOOPBACK_ENGINES,
            "settle": False,
            **options,
        }
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)
        self._started: Future[Gateway] = Future()
        self._stop: asyncio.Event | None = None

    @property
    def gateway(self) -> Gateway:
        return self._started.result(timeout=START_TIMEOUT_S)

    @property
    def url(self) -> str:
        return self.gateway.url

    @property
    def base_url(self) -> str:
        return self.gateway.url.removesuffix("/v1")

    @property
    def metrics_url(self) -> str:
        """The gateway's ``/metrics``; start it with ``metrics_port=0`` to have one."""
        url = self.gateway.metrics_url
        assert url is not None, "this gateway serves no /metrics: pass metrics_port=0"
        return url

    def call(self, function: Callable[[], T]) -> T:
        """Run ``function`` on the gateway's loop and return its result."""

        async def run() -> T:
            return function()

        self.gateway  # noqa: B018 -- started, so the loop runs
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def publish(self, snapshot: GatewaySnapshot) -> None:
        self.call(lambda: self.source.publish(snapshot))

    def in_flight(self) -> dict[str, int]:
        return self.call(self.gateway.in_flight)

    def __enter__(self) -> GatewayThread:
        self._thread.start()
        self.gateway  # noqa: B018 -- raises what the start raised
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._stop is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        loop = self._loop = uvloop.new_event_loop()
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        gateway = Gateway(self.source, **self._options)
        try:
            await gateway.start()
        except BaseException as exc:
            self._started.set_exception(exc)
            return
        self._started.set_result(gateway)
        try:
            await self._stop.wait()
        finally:
            await gateway.stop()
