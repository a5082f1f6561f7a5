"""Following the log: wake on NOTIFY, poll as a fallback, catch up after every reconnect.

LISTEN only says "something was appended"; what was appended is always read from the
table by position, so a lost notification, a killed LISTEN connection or a database
restart can only delay a subscriber, never make it skip an event.

The LISTEN connection is asked a ``SELECT 1`` every ``check_s`` and given ``check_s`` to
answer (``LISTEN`` itself too): one cut off without a reset (a partition, a NAT that forgot
it) carries no notification and says nothing, and would leave the subscriber deaf for good,
woken by its poll alone. Any failure, the driver's own errors included, is logged as one
line and the subscription listens again on a new connection, after a backoff of at most
``MAX_BACKOFF_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any, Protocol

import asyncpg
import structlog

from app.domain.envelope import Recorded
from app.store.database import driver_url
from app.store.errors import StoreUnavailable
from app.store.postgres import NOTIFY_CHANNEL

log = structlog.get_logger(__name__)
_ids = itertools.count(1)

DEFAULT_CHECK_S = 5.0
MIN_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0


class LogReader(Protocol):
    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[Recorded]: ...


class Subscription:
    """``async for recorded in Subscription(...)`` yields every event after ``after_position``,
    in order, forever."""

    def __init__(
        self,
        reader: LogReader,
        database_url: str,
        after_position: int = 0,
        *,
        poll_interval_s: float = 1.0,
        batch_size: int = 1000,
        channel: str = NOTIFY_CHANNEL,
        name: str = "subscriber",
        check_s: float = DEFAULT_CHECK_S,
    ) -> None:
        self.position = after_position
        self._reader = reader
        self._url = driver_url(database_url)
        self._poll_interval_s = poll_interval_s
        self._batch_size = batch_size
        self._channel = channel
        self._check_s = check_s
        self.application_name = f"llmgw-listen-{name}-{next(_ids)}"
        self._wake = asyncio.Event()
        self.listening = asyncio.Event()
        """Set while a LISTEN connection is up (tests and readiness checks wait on it)."""
        self.connections = 0
        """How many LISTEN connections this subscription has opened."""

    async def __aiter__(self) -> AsyncIterator[Recorded]:
        listener = asyncio.create_task(self._listen(), name=self.application_name)
        try:
            while True:
                self._wake.clear()
                try:
                    batch = await self._reader.read_all(self.position, self._batch_size)
                except StoreUnavailable as exc:
                    log.warning("subscription_read_failed", error=str(exc))
                    batch = []
                for recorded in batch:
                    self.position = recorded.position
                    yield recorded
                if len(batch) == self._batch_size:
                    continue
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that arrives as the event is set, and the subscription would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._poll_interval_s):
                        await self._wake.wait()
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _listen(self) -> None:
        backoff = MIN_BACKOFF_S
        while True:
            try:
                await self._listen_once()
                backoff = MIN_BACKOFF_S
            except Exception as exc:
                # Whatever it is (a reset, no answer, the driver's InternalClientError), the
                # subscriber must not go deaf: say it once, listen again on a new connection.
                log.info(
                    "subscription_listen_failed",
                    application_name=self.application_name,
                    error=str(exc) or type(exc).__name__,
                    retry_in_s=backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _listen_once(self) -> None:
        closed = asyncio.Event()
        conn = await asyncpg.connect(
            self._url,
            server_settings={"application_name": self.application_name},
            timeout=self._check_s,
        )

        def on_notify(*_: Any) -> None:
            self._wake.set()

        def on_close(*_: Any) -> None:
            closed.set()

        try:
            conn.add_termination_listener(on_close)
            async with asyncio.timeout(self._check_s):
                await conn.add_listener(self._channel, on_notify)
            self.connections += 1
            self.listening.set()
            # Anything appended while we were not listening is read now.
            self._wake.set()
            while not closed.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._check_s):
                        await closed.wait()
                if closed.is_set() or conn.is_closed():
                    break
                # TimeoutError when it gets no answer: the connection is taken for cut off.
                await conn.fetchval("SELECT 1", timeout=self._check_s)
            log.info("subscription_listen_lost", application_name=self.application_name)
        finally:
            self.listening.clear()
            if not conn.is_closed():
                conn.terminate()
