"""A key that expires, end to end: an operator creates it with `llmgw-cli keys create
--expires-in` against the admin API (uvicorn on a loopback socket, over this test's
PostgreSQL database), and a real `llmgw-server gateway` process on the same database serves
it in front of a real engine (the simulator) until its time is up, then refuses it with
401 saying when it expired.

Nothing is recorded when a key expires, and the gateway refreshes its snapshot only every
60 s here (a NOTIFY brings one at once, but nothing is appended): the refusal comes from the
gateway's own clock, at once, moved by how far the database's was from it when the
gateway last read the keys (the expiry is the database's time, as the last test shows for
a gateway whose clock is hours behind)."""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.domain.envelope import Meta
from app.domain.events import ApiKeyCreated, key_stream
from app.domain.keys import format_key, hash_key
from app.gateway.asgi import KeyCheck
from app.gateway.errors import ApiError
from app.gateway.snapshot import read_snapshot
from app.store.database import driver_url
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import serving_admin
from tests.support.gateway_process import gateway_process
from tests.support.operator_cli import TOKEN, Operator
from tests.support.ports import free_port
from tests.support.routing import connect_node, declare_model, serve_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

MODEL = "sim"
LIFETIME_S = 10
"""Long enough for the gateway to start and serve the key on a busy machine first."""
STARTED_WITHIN_S = 30.0
REFUSED_WITHIN_S = 5.0
"""After its expiry, by the gateway's clock alone: no snapshot comes in between. (At once,
in fact: the margin is the requests' own time on a busy machine, far below the refresh.)"""
REFRESH_INTERVAL_S = 60.0
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4}


@pytest.fixture
def simulator() -> Iterator[SimulatorProcess]:
    with start_simulator("--model", MODEL, "--instant", port=free_port()) as simulator:
        simulator.wait_healthy()
        yield simulator


async def test_a_key_created_to_expire_is_served_until_then_and_refused_after_without_an_event(
    pg_store: PostgresEventStore,
    database_url: str,
    simulator: SimulatorProcess,
    tmp_path: Path,
) -> None:
    await connect_node(pg_store, "gpu-1", "127.0.0.1")
    port, log = free_port(), tmp_path / "gateway.log"
    async with serving_admin(pg_store, tokens={TOKEN: "alice"}) as admin_url:
        operator = Operator(home=tmp_path, admin_url=admin_url)
        await declare_model(pg_store, MODEL)
        await serve_replica(pg_store, MODEL, 1, "gpu-1", simulator.port)
        with gateway_process(
            database_url,
            gateway_id="gw-expiry",
            port=port,
            log=log,
            options=("--refresh-interval", str(REFRESH_INTERVAL_S)),
        ) as gateway:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as http:

                async def ready() -> bool:
                    with contextlib.suppress(httpx.TransportError):
                        return (await http.get("/readyz")).status_code == 200
                    assert gateway.poll() is None, log.read_text()
                    return False

                await wait_until(ready, within_s=STARTED_WITHIN_S, what="the gateway ready")
                created = await operator.run(
                    *("keys", "create", "--name", "demo", "--models", MODEL),
                    *("--expires-in", f"{LIFETIME_S}s", "--output", "json"),
                )
                body = created.json()
                key, expires_at = body["key"], datetime.fromisoformat(body["expires_at"])
                position = (await pg_store.catch_up()).position
                headers = {"authorization": f"Bearer {key}"}

                async def chat() -> httpx.Response:
                    return await http.post("/v1/chat/completions", json=CHAT, headers=headers)

                async def served() -> bool:
                    return (await chat()).status_code == 200

                await wait_until(served, within_s=LIFETIME_S / 2, what="the new key served")
                assert datetime.now(UTC) < expires_at

                async def refused() -> bool:
                    return (await chat()).status_code == 401

                await wait_until(
                    refused,
                    within_s=LIFETIME_S + REFUSED_WITHIN_S,
                    every_s=0.05,
                    what="the expired key refused",
                )
                refused_at = datetime.now(UTC)
                answer = await chat()
                models = await http.get("/v1/models", headers=headers)

    assert expires_at <= refused_at < expires_at + timedelta(seconds=REFUSED_WITHIN_S)
    assert answer.status_code == 401
    assert answer.json() == {
        "error": {
            "message": f"This API key expired at {expires_at:%Y-%m-%dT%H:%M:%SZ}.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert models.status_code == 401
    # Nothing was recorded: no new snapshot brought the refusal.
    assert (await pg_store.catch_up()).position == position
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", body["expires_at"])


@pytest.mark.parametrize("gateway_off_s", [-7200.0, -120.0, 120.0, 7200.0])
async def test_a_gateway_whose_clock_is_off_expires_a_key_by_the_database_s_clock(
    pg_store: PostgresEventStore, database_url: str, gateway_off_s: float
) -> None:
    """The expiry was set by the server's clock and recorded; a gateway hours behind would
    serve the key for hours more by its own, one ahead refuse it hours early. It reads the
    keys with the database's clock and moves its own by the difference."""
    database = await asyncpg.connect(driver_url(database_url))
    try:
        now: datetime = await database.fetchval("SELECT clock_timestamp()")
        keys = {}
        for name, expires_at in (
            ("ended", now - timedelta(minutes=1)),
            ("left", now + timedelta(minutes=1)),
        ):
            prefix = secrets.token_hex(4)
            keys[name] = key = format_key(prefix, secrets.token_urlsafe(32))
            created = ApiKeyCreated(
                key_id=f"k-{prefix}",
                name=f"skew-{prefix}",
                prefix=prefix,
                secret_hash=hash_key(key),
                expires_at=expires_at,
            )
            await pg_store.append(
                key_stream(created.key_id), None, [NewEvent(created)], Meta(actor="alice")
            )

        def gateway_clock() -> float:
            return time.time() + gateway_off_s

        snapshot = await read_snapshot(database, within_s=5.0, wall_clock=gateway_clock)
    finally:
        await database.close()
    check = KeyCheck(wall_clock=gateway_clock)

    def request(key: str) -> dict[str, object]:
        return {
            "headers": [(b"authorization", f"Bearer {key}".encode())],
            "client": ("127.0.0.9", 9),
        }

    with pytest.raises(ApiError) as refused:
        check.authenticate(snapshot, request(keys["ended"]))
    assert refused.value.status == 401
    assert refused.value.message.startswith("This API key expired at ")
    assert check.authenticate(snapshot, request(keys["left"])).prefix in keys["left"]
    assert snapshot.clock_offset_s == pytest.approx(-gateway_off_s, abs=5.0)
