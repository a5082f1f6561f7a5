"""A client that honours a quota refusal's ``retry-after-ms`` is served when it comes back,
and the ``openai`` SDK, retrying as it does by default, is served without an error.

One ``llmgw-server gateway`` on a real database, in front of a simulator replica. A key of
tpm 1000 whose minute another gateway has mostly spent (800 tokens granted 50 s ago,
written into ``rate_budgets`` as that gateway's grant would be): a first request takes a
little of what is left, then one larger than the rest is refused, and its client waits
what ``retry-after-ms`` says before each new try. It is served at the first or second try
after the first refusal. Before, the refusal said "Retry after 0.1 s" (retry-after-ms:
50) until this gateway's word on the room was a second old: some twenty tries. The SDK,
told ``x-should-retry: false``, raised ``RateLimitError`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import openai
import pytest

from agent.simulator.launcher import start_simulator
from app.services.operations import Caller, Operations
from app.store.database import driver_url
from app.store.postgres import PostgresEventStore
from tests.support.gateway_process import gateway_process
from tests.support.ports import free_port
from tests.support.routing import connect_node, declare_model, serve_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

ALICE = Caller(actor="alice")
TPM = 1000
HELD_ELSEWHERE = 800
STARTED_WITHIN_S = 20.0
MOST_TRIES = 3
"""The first refusal, then the first or the second try after its wait."""
LARGER_THAN_THE_ROOM = 300
"""Tokens to generate: more than what the minute has left once the first request ran."""


@contextlib.asynccontextmanager
async def a_minute_mostly_spent_elsewhere(
    database_url: str, pg_store: PostgresEventStore, tmp_path: Path
) -> AsyncIterator[tuple[Client, str]]:
    """A gateway in front of a simulator, and a key of tpm 1000 whose minute another
    gateway has mostly spent, of which a first request has taken a little more: the client
    and the key."""
    model = f"ra-{uuid.uuid4().hex[:8]}"
    with start_simulator("--model", model, "--instant", port=free_port()) as engine:
        engine.wait_healthy()
        await declare_model(pg_store, model, 1)
        await connect_node(pg_store, f"{model}-node", "127.0.0.1")
        await serve_replica(pg_store, model, 1, f"{model}-node", engine.port)
        operations = Operations(pg_store)
        probe = await operations.create_key(ALICE, "probe", [model])
        limited = await operations.create_key(ALICE, "limited", [model], tpm=TPM)
        port = free_port()
        with gateway_process(
            database_url, gateway_id=f"gw-{model}", port=port, log=tmp_path / "gateway.log"
        ):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as http:
                client = Client(http, model)

                async def routes() -> bool:
                    with contextlib.suppress(httpx.TransportError):
                        return (await client.ask(probe.key, 1)).status_code == 200
                    return False

                await wait_until(routes, within_s=STARTED_WITHIN_S, what="the gateway routes")
                await spend_most_of_the_minute_elsewhere(database_url, limited.record.id)
                assert (await client.ask(limited.key, 60)).status_code == 200
                yield client, limited.key


async def test_a_client_honouring_retry_after_ms_is_served_at_its_next_try(
    database_url: str, pg_store: PostgresEventStore, tmp_path: Path
) -> None:
    async with a_minute_mostly_spent_elsewhere(database_url, pg_store, tmp_path) as (
        client,
        key,
    ):
        statuses, waits_ms = await client.honouring_retry_after(key, LARGER_THAN_THE_ROOM)
    assert statuses[0] == 429, "the request does not fit what the minute has left"
    assert statuses[-1] == 200, (statuses, waits_ms)
    assert len(statuses) <= MOST_TRIES, (statuses, waits_ms)


async def test_the_openai_sdk_retries_a_quota_refusal_and_is_served(
    database_url: str, pg_store: PostgresEventStore, tmp_path: Path
) -> None:
    async with (
        a_minute_mostly_spent_elsewhere(database_url, pg_store, tmp_path) as (client, key),
        openai.AsyncOpenAI(base_url=client.base_url, api_key=key, max_retries=2) as sdk,
    ):
        raw = await sdk.chat.completions.with_raw_response.create(
            model=client.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=LARGER_THAN_THE_ROOM,
        )
    assert raw.retries_taken >= 1, "the first try was refused: the minute has no room"
    assert raw.parse().choices[0].message.content


class Client:
    def __init__(self, http: httpx.AsyncClient, model: str) -> None:
        self._http = http
        self.model = model
        self.base_url = f"{http.base_url}".rstrip("/") + "/v1"

    async def ask(self, key: str, max_tokens: int) -> httpx.Response:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
        }
        return await self._http.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        )

    async def honouring_retry_after(
        self, key: str, max_tokens: int, *, most: int = 10
    ) -> tuple[list[int], list[int]]:
        """The statuses of each try until one is not a 429, and the waits it was told."""
        statuses: list[int] = []
        waits_ms: list[int] = []
        while len(statuses) < most:
            answer = await self.ask(key, max_tokens)
            statuses.append(answer.status_code)
            if answer.status_code != 429:
                break
            waits_ms.append(int(answer.headers["retry-after-ms"]))
            await asyncio.sleep(waits_ms[-1] / 1000)  # what the client was told to wait
        return statuses, waits_ms


async def spend_most_of_the_minute_elsewhere(database_url: str, key_id: str) -> None:
    """Another gateway's grant of 50 s ago, as ``app.store.rate_budgets.grant`` writes it."""
    connection = await asyncpg.connect(driver_url(database_url))
    try:
        await connection.execute(
            "INSERT INTO rate_budgets (key_id, resource, second, granted) VALUES "
            "($1, 'tpm', floor(extract(epoch FROM clock_timestamp()))::bigint - 50, $2)",
            key_id,
            HELD_ELSEWHERE,
        )
    finally:
        await connection.close()
