"""A subscriber's LISTEN connection broken each way a network or the driver breaks one: the
subscriber logs one line and listens again on a new connection, and hears the next append
at once; it never goes deaf for good, waking on its poll alone.

Its poll is slowed to a minute, so only LISTEN delivers within the deadlines. The LISTEN
connection reaches PostgreSQL through a relay (``tests.support.tcp_relay``); the log is
read and appended to directly."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

from app.domain.envelope import Meta
from app.domain.events import NodeCordoned
from app.store import subscription as subscription_module
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from app.store.subscription import Subscription
from tests.support.tcp_relay import Break, TcpRelay
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

ACTOR = Meta(actor="test")
CHECK_S = 0.5
"""How often the LISTEN connection is asked whether it still answers, and how long it has."""
HEARD_WITHIN_S = 10.0


class Follower:
    """A subscription followed on a task of its own: what it yields goes to ``received``."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.received: asyncio.Queue[int] = asyncio.Queue()
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        async for recorded in self.subscription:
            await self.received.put(recorded.position)

    async def hears(self, store: PostgresEventStore, n: int) -> None:
        recorded = await store.append(
            "node-a", None, [NewEvent(NodeCordoned(node_id="a", reason=f"step {n}"))], ACTOR
        )
        async with asyncio.timeout(HEARD_WITHIN_S):
            while (position := await self.received.get()) != recorded[0].position:
                assert position < recorded[0].position

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def subscribe(pg_store: PostgresEventStore, url: str) -> Follower:
    return Follower(Subscription(pg_store, url, poll_interval_s=60, name="broken", check_s=CHECK_S))


@pytest.mark.parametrize("how", [Break.HOLD, Break.RESET, Break.LOST])
async def test_a_listen_statement_broken_on_its_way_is_sent_again_on_a_new_connection(
    database_url: str, pg_store: PostgresEventStore, relay: TcpRelay, how: Break
) -> None:
    broken = relay.break_after_sending(b"LISTEN", how)
    with capture_logs() as logs:
        follower = subscribe(pg_store, relay.in_front_of(database_url))
        try:
            await asyncio.wait_for(broken.wait(), HEARD_WITHIN_S)
            await wait_until(
                lambda: follower.subscription.listening.is_set(),
                within_s=HEARD_WITHIN_S,
                what="listening again on a new connection",
            )
            await follower.hears(pg_store, 1)
        finally:
            await follower.stop()
            relay.mend()
    failures = [log for log in logs if log["event"] == "subscription_listen_failed"]
    assert len(failures) == 1, logs


async def test_a_listen_connection_cut_off_is_found_out_and_replaced(
    database_url: str, pg_store: PostgresEventStore, relay: TcpRelay
) -> None:
    follower = subscribe(pg_store, relay.in_front_of(database_url))
    try:
        await wait_until(lambda: follower.subscription.listening.is_set(), what="listening")
        relay.cut()  # carries nothing, resets nothing: a partition, a NAT that forgot it
        await wait_until(
            lambda: not follower.subscription.listening.is_set(),
            within_s=HEARD_WITHIN_S,
            what="the cut-off LISTEN connection found out",
        )
        relay.mend()
        await wait_until(
            lambda: follower.subscription.listening.is_set(),
            within_s=HEARD_WITHIN_S,
            what="listening again",
        )
        await follower.hears(pg_store, 1)
    finally:
        await follower.stop()


def _connect_failing_once(
    error: Exception,
) -> Callable[..., Awaitable[asyncpg.Connection]]:
    """``asyncpg.connect`` whose first call for a LISTEN connection raises ``error``, as the
    driver raises it from a protocol state it cannot go on from; every other call connects
    to the real database (the store's pool connects through it too)."""
    real = asyncpg.connect
    failed = False

    async def connect(*args: Any, **kwargs: Any) -> asyncpg.Connection:
        nonlocal failed
        name = (kwargs.get("server_settings") or {}).get("application_name", "")
        if not failed and name.startswith("llmgw-listen-"):
            failed = True
            raise error
        return await real(*args, **kwargs)

    return connect


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.InternalClientError("cannot switch to state 15; another operation in progress"),
        asyncpg.exceptions.InterfaceError("cannot perform operation: connection is closed"),
    ],
)
async def test_a_driver_error_is_logged_once_and_the_subscription_listens_again(
    database_url: str,
    pg_store: PostgresEventStore,
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
) -> None:
    monkeypatch.setattr(subscription_module.asyncpg, "connect", _connect_failing_once(error))
    with capture_logs() as logs:
        follower = subscribe(pg_store, database_url)
        try:
            await wait_until(
                lambda: follower.subscription.listening.is_set(),
                within_s=HEARD_WITHIN_S,
                what="listening after the driver's error",
            )
            await follower.hears(pg_store, 1)
        finally:
            await follower.stop()
    failures = [log for log in logs if log["event"] == "subscription_listen_failed"]
    assert [log["error"] for log in failures] == [str(error)], logs
