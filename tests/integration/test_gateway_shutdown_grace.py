"""``llmgw-server gateway --shutdown-grace``: how long a stopping gateway lets open requests
finish, set to match what runs it (Kubernetes' terminationGracePeriodSeconds, systemd's
TimeoutStopSec).

Given a real gateway process started with a grace of 2 s, in front of a simulator that
takes over a minute to stream its answer, when the gateway is sent SIGTERM mid-stream, then
the stream goes on for the grace and no longer: it ends with the error event that says the
gateway stopped, and the process exits, seconds before the default grace of 30 s would
have run out.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.services.operations import Caller, Operations
from app.store.postgres import PostgresEventStore
from tests.support.gateway_process import gateway_process
from tests.support.ports import free_port
from tests.support.routing import connect_node, declare_model, serve_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

GRACE_S = 2.0
DEFAULT_GRACE_S = 30.0
SLOW = ("--decode-base-ms", "40", "--decode-per-seq-ms", "0")
"""40 ms a token: 2,000 tokens take 80 s, far past either grace."""
LONG = 2000
STARTED_WITHIN_S = 20.0
MODEL = f"grace-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def simulator() -> Iterator[SimulatorProcess]:
    with start_simulator("--model", MODEL, *SLOW) as simulator:
        simulator.wait_healthy()
        yield simulator


async def test_a_stopping_gateway_ends_an_open_stream_after_its_shutdown_grace(
    database_url: str, pg_store: PostgresEventStore, simulator: SimulatorProcess, tmp_path: Path
) -> None:
    await connect_node(pg_store, f"{MODEL}-node", "127.0.0.1")
    await declare_model(pg_store, MODEL)
    await serve_replica(pg_store, MODEL, 1, f"{MODEL}-node", simulator.port)
    key = (await Operations(pg_store).create_key(Caller(actor="alice"), "grace", [MODEL])).key
    port = free_port()
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me everything"}],
        "max_tokens": LONG,
        "stream": True,
    }

    with gateway_process(
        database_url,
        gateway_id=f"gw-{MODEL}",
        port=port,
        log=tmp_path / "gateway.log",
        options=("--shutdown-grace", str(GRACE_S)),
    ) as gateway:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}/v1",
            headers={"authorization": f"Bearer {key}"},
            timeout=DEFAULT_GRACE_S * 2,
        ) as http:

            async def routes() -> bool:
                assert gateway.poll() is None, "the gateway exited"
                try:
                    answer = await http.post("/chat/completions", json={**chat, "max_tokens": 1})
                except httpx.TransportError:
                    return False
                return answer.status_code == 200

            await wait_until(routes, within_s=STARTED_WITHIN_S, what="the gateway routes")

            async with http.stream("POST", "/chat/completions", json=chat) as streamed:
                lines = streamed.aiter_lines()
                assert (await anext(lines)).startswith("data: {")  # the stream is under way
                gateway.send_signal(signal.SIGTERM)
                stopped_at = time.monotonic()
                rest = [line async for line in lines if line]
                ended_after_s = time.monotonic() - stopped_at

            exit_code = gateway.wait(timeout=DEFAULT_GRACE_S)

    assert rest[-1] == "data: [DONE]", rest[-3:]
    assert json.loads(rest[-2].removeprefix("data: "))["error"]["code"] == "gateway_shutting_down"
    assert GRACE_S <= ended_after_s < DEFAULT_GRACE_S / 2, (
        f"the stream ended {ended_after_s:.1f} s after SIGTERM, with a grace of {GRACE_S} s"
    )
    assert len(rest) < LONG, "the stream ran to its end instead of being cut off"
    assert exit_code == 0
