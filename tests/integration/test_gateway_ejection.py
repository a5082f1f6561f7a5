"""A replica killed mid-run is ejected by every gateway, and traffic moves off it.

Three ``llmgw-server gateway`` processes follow one database, in front of three simulator
replicas of one model. Clients stream and send whole requests through all three without a
pause; one replica's engine is killed (SIGKILL) mid-run, and nothing tells the control
plane (no agent runs here): the replica stays in the routing table, as it would while an
agent is cut off or before its report arrives. Then

- the streams that the dead engine was answering break (their head was sent: nothing can
  save them), and those are the only failed requests; a whole request in flight at the
  kill had no answer yet and is retried on another replica;
- each gateway ejects the replica after its failures in a row, says so in its log and its
  ``/metrics``, and sends nothing more to it (its retries stop growing);
- the gateways' reports reach the admin API, and ``llmgw-cli replicas`` says
  ``ejected by 3 of 3 gateways``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.services.operations import Caller, Operations
from app.store.postgres import PostgresEventStore
from tests.support.gateway_process import gateway_process
from tests.support.operator_cli import Operator, live_admin_api
from tests.support.ports import free_port
from tests.support.routing import connect_node, declare_model, serve_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

SERVER = str(Path(sys.executable).parent / "llmgw-server")
ALICE = Caller(actor="alice")
STARTED_WITHIN_S = 20.0
GATEWAYS = ("gw-a", "gw-b", "gw-c")
STREAMS_PER_GATEWAY = 2
"""Clients streaming one request after another through each gateway: six streams are
always open, so the kill finds some mid-way."""
WHOLE_PER_GATEWAY = 1
PACE = ("--prefill-ms-per-token", "0", "--decode-base-ms", "15", "--decode-per-seq-ms", "0")
"""15 ms a token: a stream of 30 tokens takes about half a second."""
COOL_OFF_S = "120"
EJECTION_OPTIONS = (
    *("--scrape-interval", "0.05"),
    *("--eject-after-failures", "3", "--ejection-cool-off", COOL_OFF_S),
    *("--max-ejection-cool-off", COOL_OFF_S),
)
"""Longer than the test: no probe goes to the dead replica while it runs."""


@dataclass(frozen=True)
class Attempt:
    gateway: str
    stream: bool
    started: float
    ended: float
    ok: bool
    detail: str


@dataclass
class Replicas:
    model: str
    key: str
    engines: dict[str, SimulatorProcess]


@pytest_asyncio.fixture(loop_scope="session")
async def replicas(pg_store: PostgresEventStore) -> AsyncIterator[Replicas]:
    """Three replicas of one model, each on a simulator of its own, and a key for it."""
    model = f"ej-{uuid.uuid4().hex[:8]}"
    with (
        start_simulator("--model", model, *PACE) as one,
        start_simulator("--model", model, *PACE) as two,
        start_simulator("--model", model, *PACE) as three,
    ):
        await declare_model(pg_store, model, 3)
        engines: dict[str, SimulatorProcess] = {}
        for number, engine in enumerate((one, two, three), start=1):
            engine.wait_healthy()
            node = f"{model}-node-{number}"
            await connect_node(pg_store, node, "127.0.0.1")
            replica_id = await serve_replica(pg_store, model, number, node, engine.port)
            engines[replica_id] = engine
        created = await Operations(pg_store).create_key(ALICE, "ejection", [model])
        yield Replicas(model, created.key, engines)


def body(model: str, *, stream: bool) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"{uuid.uuid4().hex} tell me more"}],
        "max_tokens": 30 if stream else 8,
        "stream": stream,
    }


async def attempt(http: httpx.AsyncClient, gateway: str, model: str, stream: bool) -> Attempt:
    started = time.monotonic()
    try:
        if stream:
            async with http.stream(
                "POST", "/v1/chat/completions", json=body(model, stream=True)
            ) as answer:
                text = (await answer.aread()).decode(errors="replace")
            ok = answer.status_code == 200 and '"error"' not in text and "[DONE]" in text
            detail = f"{answer.status_code} {text[-300:]}"
        else:
            whole = await http.post("/v1/chat/completions", json=body(model, stream=False))
            ok = whole.status_code == 200
            detail = f"{whole.status_code} {whole.text[:300]}"
    except httpx.HTTPError as exc:
        ok, detail = False, repr(exc)
    return Attempt(gateway, stream, started, time.monotonic(), ok, detail)


async def client(
    http: httpx.AsyncClient,
    gateway: str,
    model: str,
    stream: bool,
    stop: asyncio.Event,
    log: list[Attempt],
) -> None:
    """Requests one after another until ``stop``."""
    while not stop.is_set():
        log.append(await attempt(http, gateway, model, stream))


def sample(page: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a Prometheus text page."""
    for line in page.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_killed_replica_is_ejected_by_every_gateway_and_traffic_moves_off_it(
    replicas: Replicas, database_url: str, pg_store: PostgresEventStore, tmp_path: Path
) -> None:
    model = replicas.model
    victim = f"{model}-2"
    ports = {gateway: (free_port(), free_port()) for gateway in GATEWAYS}
    headers = {"authorization": f"Bearer {replicas.key}"}
    with contextlib.ExitStack() as processes:
        for gateway, (port, metrics_port) in ports.items():
            processes.enter_context(
                gateway_process(
                    database_url,
                    gateway_id=gateway,
                    port=port,
                    log=tmp_path / f"{gateway}.log",
                    metrics_port=metrics_port,
                    options=EJECTION_OPTIONS,
                )
            )
        clients = {
            gateway: httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30.0
            )
            for gateway, (port, _) in ports.items()
        }
        metrics = httpx.AsyncClient(timeout=10.0)

        async def page(gateway: str) -> str:
            return (await metrics.get(f"http://127.0.0.1:{ports[gateway][1]}/metrics")).text

        try:
            for gateway, http in clients.items():

                async def routes(http: httpx.AsyncClient = http, gateway: str = gateway) -> bool:
                    return (await attempt(http, gateway, model, False)).ok

                await wait_until(routes, within_s=STARTED_WITHIN_S, what=f"{gateway} routes")

            stop = asyncio.Event()
            log: list[Attempt] = []
            kinds = [True] * STREAMS_PER_GATEWAY + [False] * WHOLE_PER_GATEWAY
            workers = [
                asyncio.create_task(client(http, gateway, model, stream, stop, log))
                for gateway, http in clients.items()
                for stream in kinds
            ]
            try:
                await wait_until(
                    lambda: len(log) >= 30, within_s=30.0, what="traffic through every gateway"
                )
                killed_at = time.monotonic()
                replicas.engines[victim].process.kill()  # SIGKILL, mid-run
                pages: dict[str, str] = {}

                async def every_gateway_ejects() -> bool:
                    for gateway in GATEWAYS:
                        pages[gateway] = await page(gateway)
                    return all(
                        sample(p, "llmgw_gateway_replica_ejected", replica=victim) == 1.0
                        for p in pages.values()
                    )

                await wait_until(every_gateway_ejects, within_s=20.0, what="ejections")
                ejected_at = time.monotonic()
                for gateway, text in pages.items():
                    assert (
                        sample(text, "llmgw_gateway_replica_ejections_total", replica=victim) == 1.0
                    ), gateway
                    for other in (f"{model}-1", f"{model}-3"):
                        assert (
                            sample(text, "llmgw_gateway_replica_ejected", replica=other) == 0.0
                        ), (gateway, other)
                retries = {
                    g: sample(t, "llmgw_gateway_upstream_retries_total", reason="unreachable")
                    for g, t in pages.items()
                }
                served_after = len(log)
                await wait_until(
                    lambda: len(log) >= served_after + 30,
                    within_s=30.0,
                    what="traffic after the ejections",
                )
            finally:
                stop.set()
                await asyncio.gather(*workers)

            # Traffic moved: once ejected, no gateway tried the dead replica again.
            for gateway in GATEWAYS:
                now = sample(
                    await page(gateway),
                    "llmgw_gateway_upstream_retries_total",
                    reason="unreachable",
                )
                assert now == retries[gateway], f"{gateway} still sends to {victim}"

            failed = [a for a in log if not a.ok]
            in_flight_at_kill = [a for a in log if a.started < killed_at < a.ended]
            after_kill = [a for a in log if a.started >= killed_at]
            print(
                f"{len(log)} requests, {len(after_kill)} sent after the kill, "
                f"{len(in_flight_at_kill)} in flight at it, {len(failed)} failed; "
                f"ejected by all {ejected_at - killed_at:.2f} s after the kill"
            )
            # No failed request beyond those in flight at the kill, and of those only
            # streams (their answer had begun); whole requests were retried elsewhere.
            assert all(a.ok for a in after_kill), [a.detail for a in after_kill if not a.ok]
            assert all(a in in_flight_at_kill and a.stream for a in failed), failed
            assert len(failed) <= len(workers)
            assert all(a.ok for a in in_flight_at_kill if not a.stream)
            assert any(a.stream for a in in_flight_at_kill), "the kill caught no stream"

            # The admin API and llmgw-cli say how many gateways eject it.
            async with live_admin_api(pg_store) as url:
                operator = Operator(home=tmp_path, admin_url=url)

                async def reported() -> bool:
                    listed = await operator.run("replicas", "--model", model, "--output", "json")
                    by_id = {r["id"]: r["ejection"] for r in listed.json()}
                    return bool(by_id[victim] == {"ejected_by": 3, "gateways": 3})

                await wait_until(reported, within_s=10.0, what="the gateways' reports")
                listed = await operator.run("replicas", "--model", model, "--output", "wide")
                assert listed.code == 0, listed.stderr
                rows = {
                    line.split()[1]: line for line in listed.stdout.splitlines() if model in line
                }
                assert "yes (ejected by 3 of 3 gateways)" in rows[victim], listed.stdout
                for other in (f"{model}-1", f"{model}-3"):
                    assert "ejected" not in rows[other], listed.stdout
                shown = await operator.run("replica", victim)
                assert re.search(r"ejected:\s+by 3 of 3 gateways", shown.stdout), shown.stdout
                healthy = await operator.run("replica", f"{model}-1", "--output", "json")
                assert healthy.json()["ejection"] == {"ejected_by": 0, "gateways": 3}
        finally:
            for http in clients.values():
                await http.aclose()
            await metrics.aclose()

    for gateway in GATEWAYS:
        text = (tmp_path / f"{gateway}.log").read_text()
        ejected = [line for line in text.splitlines() if "replica_ejected" in line]
        assert len(ejected) == 1, (gateway, ejected)
        assert victim in ejected[0], ejected
