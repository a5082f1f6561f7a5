"""A model starting from zero, through a real ``llmgw-server gateway`` process.

The model is declared with an autoscaling policy of ``min: 0`` and has no replica. A
request for it is held by the gateway, which reports it queued in ``gateway_reports``
within a second (what the leader's autoscaler reads); when a serving replica is recorded
(as the control plane records one, ``tests.support.routing``) the held request is answered
200. Past the model's cold-start timeout without a replica it is answered 503 with
``Retry-After``; a client that gives up while held leaves the queue; a gateway told to stop
answers what it holds at once, so its clients can go to another gateway. A model whose
replica fails as it starts is answered 503 at once until its failure backoff ends, those
held for it too, with ``Retry-After`` the time to the next attempt; why it failed (an
engine's error, naming nodes and paths) is the operators' and is not told to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.domain.model_spec import AutoscalePolicy
from app.services.operations import Caller, Operations
from app.store.gateway_reports import InFlightReports
from app.store.postgres import PostgresEventStore
from tests.support.gateway_process import gateway_process
from tests.support.ports import free_port
from tests.support.routing import connect_node, declare_model, fail_replica, serve_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

SERVER = str(Path(sys.executable).parent / "llmgw-server")
ALICE = Caller(actor="alice")
STARTED_WITHIN_S = 20.0
REPORTED_WITHIN_S = 1.0


def scale_to_zero(cold_start_timeout_s: float) -> AutoscalePolicy:
    return AutoscalePolicy(
        min_replicas=0, max_replicas=2, cold_start_timeout_s=cold_start_timeout_s
    )


def chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4}


class Gateway:
    """A running gateway process: its client API with one key, and its ``/metrics``."""

    def __init__(
        self, port: int, metrics_port: int, key: str, process: subprocess.Popen[bytes]
    ) -> None:
        self.process = process
        self.http = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers={"authorization": f"Bearer {key}"},
            timeout=90.0,
        )
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"

    async def until_ready(self) -> None:
        async def ready() -> bool:
            with contextlib.suppress(httpx.TransportError):
                return (await self.http.get("/readyz")).status_code == 200
            return False

        await wait_until(ready, within_s=STARTED_WITHIN_S, what="the gateway ready")

    async def chat(self, model: str) -> httpx.Response:
        return await self.http.post("/v1/chat/completions", json=chat(model))

    async def metric(self, line_start: str) -> float | None:
        async with httpx.AsyncClient(timeout=5.0) as plain:
            text = (await plain.get(self.metrics_url)).text
        for line in text.splitlines():
            if line.startswith(line_start + " "):
                return float(line.rsplit(" ", 1)[1])
        return None


@contextlib.asynccontextmanager
async def running_gateway(database_url: str, key: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    port, metrics_port = free_port(), free_port()
    with gateway_process(
        database_url,
        gateway_id="gw-cold",
        port=port,
        log=tmp_path / "gateway.log",
        metrics_port=metrics_port,
    ) as process:
        gateway = Gateway(port, metrics_port, key, process)
        try:
            await gateway.until_ready()
            yield gateway
        finally:
            await gateway.http.aclose()


@pytest.fixture
def simulator() -> Iterator[SimulatorProcess]:
    with start_simulator("--model", "cold", "--instant") as simulator:
        simulator.wait_healthy()
        yield simulator


async def queued_within(
    reports: InFlightReports, expected: dict[str, int], within_s: float
) -> None:
    async def reported() -> bool:
        return await reports.read_queued() == expected

    await wait_until(reported, within_s=within_s, what=f"{expected} reported queued")


async def test_a_request_for_a_model_at_zero_is_held_reported_and_served_when_a_replica_serves(
    pg_store: PostgresEventStore,
    database_url: str,
    engine: AsyncEngine,
    simulator: SimulatorProcess,
    tmp_path: Path,
) -> None:
    model = "cold"
    await connect_node(pg_store, "gpu-1", "127.0.0.1")
    await declare_model(pg_store, model, replicas=0, autoscale=scale_to_zero(60.0))
    created = await Operations(pg_store).create_key(ALICE, "cold", [model])
    reports = InFlightReports(engine)

    async with running_gateway(database_url, created.key, tmp_path) as gateway:
        listed = (await gateway.http.get("/v1/models")).json()
        assert [card["id"] for card in listed["data"]] == [model]  # listed with no replica

        sent_at = time.monotonic()
        held = asyncio.create_task(gateway.chat(model))
        await queued_within(reports, {model: 1}, REPORTED_WITHIN_S)
        assert not held.done()
        assert await gateway.metric(f'llmgw_gateway_queued{{model="{model}"}}') == 1.0

        await serve_replica(pg_store, model, 1, "gpu-1", simulator.port)
        answer = await held
        print(f"held for a cold start, answered in {time.monotonic() - sent_at:.3f} s")

        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        await queued_within(reports, {}, 2.0)
        served = f'llmgw_gateway_cold_start_holds_total{{model="{model}",outcome="served"}}'
        assert await gateway.metric(served) == 1.0
        assert (await gateway.chat(model)).status_code == 200  # served at once from now on


async def test_a_model_that_stays_at_zero_answers_503_with_retry_after_once_its_timeout_passes(
    pg_store: PostgresEventStore, database_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    quick, patient = "quick", "patient"
    await declare_model(pg_store, quick, replicas=0, autoscale=scale_to_zero(1.0))
    await declare_model(pg_store, patient, replicas=0, autoscale=scale_to_zero(60.0))
    created = await Operations(pg_store).create_key(ALICE, "cold", [quick, patient])
    reports = InFlightReports(engine)

    async with running_gateway(database_url, created.key, tmp_path) as gateway:
        sent_at = time.monotonic()
        answer = await gateway.chat(quick)
        waited_s = time.monotonic() - sent_at

        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"] == "1"
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "cold_start_timeout")
        assert error["message"] == (
            "The model `quick` is starting from zero and no replica served within 1 s; "
            "retry after 1 s."
        )
        assert waited_s >= 1.0

        # A client that gives up while held leaves the queue, and the report says so.
        walking_away = asyncio.create_task(gateway.chat(patient))
        await queued_within(reports, {patient: 1}, REPORTED_WITHIN_S)
        walking_away.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await walking_away
        await queued_within(reports, {}, 2.0)

        holds = "llmgw_gateway_cold_start_holds_total"
        assert await gateway.metric(f'{holds}{{model="{quick}",outcome="timed_out"}}') == 1.0
        assert await gateway.metric(f'{holds}{{model="{patient}",outcome="cancelled"}}') == 1.0
        rejected = 'llmgw_gateway_admission_rejections_total{reason="cold_start_timeout"}'
        assert await gateway.metric(rejected) == 1.0


async def test_a_request_held_for_a_model_that_is_removed_is_answered_404_at_once(
    pg_store: PostgresEventStore, database_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    """Not 503 "try again shortly" after the model is gone: the answer a retry would get."""
    model = "doomed"
    await declare_model(pg_store, model, replicas=0, autoscale=scale_to_zero(60.0))
    operations = Operations(pg_store)
    created = await operations.create_key(ALICE, "cold", [model])
    reports = InFlightReports(engine)

    async with running_gateway(database_url, created.key, tmp_path) as gateway:
        held = asyncio.create_task(gateway.chat(model))
        await queued_within(reports, {model: 1}, REPORTED_WITHIN_S)

        await operations.remove(ALICE, model)
        answer = await asyncio.wait_for(held, timeout=30)

        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["code"] == "model_not_found"
        removed = 'llmgw_gateway_admission_rejections_total{reason="model_removed"}'
        assert await gateway.metric(removed) == 1.0


async def test_a_gateway_told_to_stop_answers_held_requests_at_once_with_503(
    pg_store: PostgresEventStore, database_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    """Without this, the held request would wait out the graceful shutdown (30 s) and end
    with the connection closed and no answer."""
    model = "stays-cold"
    await declare_model(pg_store, model, replicas=0, autoscale=scale_to_zero(60.0))
    created = await Operations(pg_store).create_key(ALICE, "cold", [model])
    reports = InFlightReports(engine)

    async with running_gateway(database_url, created.key, tmp_path) as gateway:
        held = asyncio.create_task(gateway.chat(model))
        await queued_within(reports, {model: 1}, REPORTED_WITHIN_S)

        gateway.process.send_signal(signal.SIGTERM)
        answer = await held

        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"] == "1"
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "gateway_shutting_down")
        assert "this gateway is shutting down" in error["message"]
        assert await asyncio.to_thread(gateway.process.wait, 30) == 0


async def test_a_model_failing_to_start_is_answered_at_once_not_after_its_cold_start_timeout(
    pg_store: PostgresEventStore, database_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    """Held 300 s by default to end in "starting from zero" before: the gateway knew."""
    model, parked = "crashing", "parked"
    await connect_node(pg_store, "gpu-1", "127.0.0.1")
    await declare_model(pg_store, model, replicas=0, autoscale=scale_to_zero(60.0))
    await declare_model(pg_store, parked, replicas=0)
    created = await Operations(pg_store).create_key(ALICE, "cold", [model, parked])
    reports = InFlightReports(engine)

    async with running_gateway(database_url, created.key, tmp_path) as gateway:
        held = asyncio.create_task(gateway.chat(model))
        await queued_within(reports, {model: 1}, REPORTED_WITHIN_S)

        why = "engine exited with code 1: CUDA out of memory on gpu-1 (/var/lib/llmgw/x)"
        await fail_replica(pg_store, model, 1, "gpu-1", free_port(), why)
        released = await asyncio.wait_for(held, timeout=10.0)

        assert released.status_code == 503, released.text
        error = released.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "model_failing_to_start")
        assert error["message"].startswith(
            "The model `crashing` is failing to start: 1 failure (a start that failed or an "
            "engine that crashed within 60s of serving); the next attempt is in "
        )
        assert "gpu-1" not in released.text
        assert "exited" not in released.text
        assert 1 <= int(released.headers["retry-after"]) <= 10  # the first backoff: 10 s

        sent_at = time.monotonic()
        again = await gateway.chat(model)
        assert time.monotonic() - sent_at < 5.0, "held instead of answered at once"
        assert again.status_code == 503, again.text
        assert again.json()["error"]["code"] == "model_failing_to_start"
        assert 1 <= int(again.headers["retry-after"]) <= 10

        holds = "llmgw_gateway_cold_start_holds_total"
        assert await gateway.metric(f'{holds}{{model="{model}",outcome="failed"}}') == 1.0
        rejected = 'llmgw_gateway_admission_rejections_total{reason="failing_to_start"}'
        assert await gateway.metric(rejected) == 2.0

        # Scaled to zero by its operator, without autoscaling: nothing comes back shortly.
        answer = await gateway.chat(parked)
        assert answer.status_code == 503, answer.text
        assert "retry-after" not in answer.headers
        # Nor do the openai SDKs' default retries, which obey this before the 503.
        assert answer.headers["x-should-retry"] == "false"
        assert answer.json()["error"]["message"] == (
            "The model `parked` is scaled to zero by its operator; it has no replica until an "
            "operator scales it up."
        )


BOUNDARY = "cold-start-boundary"


def upload(model: str, key: str, port: int, file_bytes: int) -> bytes:
    """A whole ``/v1/audio/transcriptions`` request, its file ``file_bytes`` long."""
    form = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{model}\r\n'
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + b"w" * file_bytes
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )
    head = (
        f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {key}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {len(form)}\r\n\r\n"
    ).encode()
    return head + form


async def test_a_held_upload_whose_client_leaves_gives_its_place_up(
    pg_store: PostgresEventStore, database_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    """An upload is held before its file is read (it is streamed to the engine once a
    replica takes it): a client that leaves meanwhile is no demand any more."""
    model = "cold-audio"
    await declare_model(
        pg_store, model, replicas=0, autoscale=scale_to_zero(60.0), apis=("transcriptions",)
    )
    created = await Operations(pg_store).create_key(ALICE, "cold", [model])
    reports = InFlightReports(engine)

    async with running_gateway(database_url, created.key, tmp_path) as gateway:
        port = gateway.http.base_url.port
        assert port is not None
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(upload(model, created.key, port, 1024))
        await writer.drain()
        await queued_within(reports, {model: 1}, REPORTED_WITHIN_S)

        writer.close()
        await writer.wait_closed()

        await queued_within(reports, {}, 2.0)
        holds = "llmgw_gateway_cold_start_holds_total"
        assert await gateway.metric(f'{holds}{{model="{model}",outcome="cancelled"}}') == 1.0
