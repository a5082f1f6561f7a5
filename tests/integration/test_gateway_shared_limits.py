"""A key's rpm holds across four gateways, and one of them SIGKILLed mid-minute does not
raise it.

Four ``llmgw-server gateway`` processes follow one database, in front of one simulator
replica. One key is limited to 600 requests a minute. Each gateway has a client sending
the key's requests at four a second, 960 a minute in all, for a minute; half way through,
one gateway is killed with SIGKILL (the slices it held are never given back). Counted on
the clients' side, the requests answered 200 over that minute are 600 within 5 %: counted
per gateway, as before, they would be all 840 the clients sent. It takes about 75 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest

from agent.simulator.launcher import start_simulator
from app.services.operations import Caller, Operations
from app.store.database import driver_url
from app.store.postgres import PostgresEventStore
from tests.support.gateway_process import gateway_process
from tests.support.ports import free_port
from tests.support.routing import connect_node, declare_model, serve_replica
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.serial]

SERVER = str(Path(sys.executable).parent / "llmgw-server")
ALICE = Caller(actor="alice")
STARTED_WITHIN_S = 20.0
GATEWAYS = ("gw-a", "gw-b", "gw-c", "gw-d")
RPM = 600
PER_GATEWAY_PER_S = 4.0
MINUTE_S = 60.0
KILL_AT_S = 30.0


@dataclass(frozen=True)
class Answer:
    gateway: str
    sent_at: float
    status: int


async def paced_client(
    http: httpx.AsyncClient, gateway: str, body: dict[str, object], until: float, log: list[Answer]
) -> None:
    """The key's requests at ``PER_GATEWAY_PER_S``, on a schedule (the load's shape, not a
    wait for anything), until ``until`` or the gateway is gone."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while loop.time() < until:
        sent_at = time.monotonic()
        try:
            answer = await http.post("/v1/chat/completions", json=body)
        except httpx.TransportError:
            return  # killed
        log.append(Answer(gateway, sent_at, answer.status_code))
        next_at += 1.0 / PER_GATEWAY_PER_S
        await asyncio.sleep(max(0.0, next_at - loop.time()))


async def test_a_keys_rpm_holds_across_four_gateways_and_a_killed_one_does_not_raise_it(
    database_url: str, pg_store: PostgresEventStore, tmp_path: Path
) -> None:
    model = f"sl-{uuid.uuid4().hex[:8]}"
    with start_simulator("--model", model, "--instant", port=free_port()) as engine:
        engine.wait_healthy()
        await declare_model(pg_store, model, 1)
        await connect_node(pg_store, f"{model}-node", "127.0.0.1")
        await serve_replica(pg_store, model, 1, f"{model}-node", engine.port)
        operations = Operations(pg_store)
        probe = await operations.create_key(ALICE, "probe", [model])
        limited = await operations.create_key(ALICE, "limited", [model], rpm=RPM)
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        ports = {gateway: free_port() for gateway in GATEWAYS}
        with contextlib.ExitStack() as stack:
            processes = {
                gateway: stack.enter_context(
                    gateway_process(
                        database_url,
                        gateway_id=gateway,
                        port=port,
                        log=tmp_path / f"{gateway}.log",
                        metrics_port=free_port(),
                    )
                )
                for gateway, port in ports.items()
            }
            clients = {
                gateway: httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10.0)
                for gateway, port in ports.items()
            }
            try:
                for gateway, http in clients.items():

                    async def routes(http: httpx.AsyncClient = http) -> bool:
                        with contextlib.suppress(httpx.TransportError):
                            answer = await http.post(
                                "/v1/chat/completions",
                                json=body,
                                headers={"authorization": f"Bearer {probe.key}"},
                            )
                            return answer.status_code == 200
                        return False

                    await wait_until(routes, within_s=STARTED_WITHIN_S, what=f"{gateway} routes")
                for http in clients.values():
                    http.headers["authorization"] = f"Bearer {limited.key}"

                log: list[Answer] = []
                started = time.monotonic()
                until = asyncio.get_running_loop().time() + MINUTE_S
                workers = [
                    asyncio.create_task(paced_client(http, gateway, body, until, log))
                    for gateway, http in clients.items()
                ]
                victim = GATEWAYS[1]
                await wait_until(
                    lambda: time.monotonic() - started >= KILL_AT_S,
                    within_s=KILL_AT_S + 5,
                    what="half the minute",
                )
                processes[victim].send_signal(signal.SIGKILL)
                await asyncio.gather(*workers)
            finally:
                for http in clients.values():
                    await http.aclose()

    in_minute = [a for a in log if a.sent_at - started < MINUTE_S]
    admitted = sum(1 for a in in_minute if a.status == 200)
    refused = sum(1 for a in in_minute if a.status == 429)
    others = [a for a in in_minute if a.status not in (200, 429)]
    by_gateway = {
        g: sum(1 for a in in_minute if a.gateway == g and a.status == 200) for g in GATEWAYS
    }
    print(
        f"{len(in_minute)} sent in the minute: {admitted} admitted, {refused} refused; {by_gateway}"
    )
    assert not others, others
    assert len(in_minute) >= 780, "the clients sent well over the limit"
    assert RPM * 0.95 <= admitted <= RPM * 1.05, (admitted, by_gateway)
    assert all(count > 0 for count in by_gateway.values()), by_gateway

    # What the database counted: no more than the limit, whatever the dead gateway held.
    connection = await asyncpg.connect(driver_url(database_url))
    try:
        granted = await connection.fetchval(
            "SELECT coalesce(sum(granted), 0) FROM rate_budgets WHERE key_id = $1",
            limited.record.id,
        )
    finally:
        await connection.close()
    assert admitted <= granted + len(GATEWAYS) <= RPM + len(GATEWAYS), granted
