"""``llmgw-server serve`` with its gateway, on a database of generated history whose engine
addresses it is not allowed to contact: no connection to any of them is attempted.

The history (``benchmarks/history.py``) puts its nodes in 127.77.0.0/24 and the server is
started with ``--engine-networks 127.0.0.1/32``. Since that network is loopback, the test
can listen on the exact address and port of every route of the history, and does: had
the gateway scraped one engine or sent one request there, the listener would have seen
the connection. That nothing arrives means something only because the gateway is seen
doing what it would do to them to an engine it is allowed, meanwhile: a replica of a
control model, recorded as the control plane records one, on 127.0.0.1, which the gateway
scrapes again and again and serves a request through. The refusals are then read back
from the gateway's own metrics and log.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.domain.envelope import Meta
from app.services.operations import Caller, Operations
from app.store.database import driver_url
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from benchmarks.history import ClusterHistory
from tests.support.admin_server import write_pki
from tests.support.databases import runtime_url
from tests.support.ports import free_port
from tests.support.routing import connect_node, declare_model, serve_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

SERVER = str(Path(sys.executable).parent / "llmgw-server")
HISTORY_NETWORK = "127.77.0.0/24"
ALLOWED = "127.0.0.1/32"
HISTORY_STEPS = 1_500
CONTROL_MODEL = "control"
SCRAPES_TO_WAIT_FOR = 8
"""Scrapes of the control engine: as many scrape rounds in which any other engine would
have been contacted too (the gateway scrapes every route it has every 0.25 s)."""
STARTED_WITHIN_S = 30.0
METRICS_PAGE = (
    b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.1\n"
)
CHAT_ANSWER = json.dumps(
    {
        "id": "control",
        "object": "chat.completion",
        "model": CONTROL_MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


@dataclass(eq=False)
class Listener:
    """An HTTP/1.1 server on one address and port that counts what reaches it, and answers
    ``/metrics`` and completions as an engine would."""

    host: str
    port: int
    connections: int = 0
    paths: list[str] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def start(self) -> bool:
        """Listen; False when the address and port are taken already."""
        try:
            self.server = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError:
            return False
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ValueError):
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = next(
                    (
                        int(v)
                        for k, _, v in (h.partition(":") for h in lines[1:])
                        if k.lower() == "content-length"
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.paths.append(f"{method} {path}")
                body, kind = (
                    (METRICS_PAGE, b"text/plain")
                    if path == "/metrics"
                    else (CHAT_ANSWER, b"application/json")
                )
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                    % (kind, len(body), body)
                )
                await writer.drain()
        writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@dataclass(frozen=True)
class RouteRow:
    replica_id: str
    model: str
    address: str
    port: int


async def load_history(store: PostgresEventStore) -> None:
    """The first steps of a generated history, appended as the control plane would."""
    history = ClusterHistory(seed=7, models=2, nodes=12, in_flight=16, network=HISTORY_NETWORK)
    steps = list(itertools.islice(history.steps(), HISTORY_STEPS))
    meta = Meta(actor="reconciler")
    for offset in range(0, len(steps), 500):
        batch = steps[offset : offset + 500]
        requests = [
            AppendRequest(stream, None, [NewEvent(event) for _, event in run])
            for stream, run in itertools.groupby(batch, key=lambda step: step[0])
        ]
        await store.append_many(requests, meta)


async def routing_table(database_url: str) -> list[RouteRow]:
    db = await asyncpg.connect(driver_url(database_url))
    try:
        rows = await db.fetch("SELECT replica_id, model, address, port FROM routing_table")
    finally:
        await db.close()
    return [RouteRow(r["replica_id"], r["model"], r["address"], r["port"]) for r in rows]


@contextlib.contextmanager
def serving(
    database_url: str, directory: Path, client_port: int, admin_port: int
) -> Iterator[subprocess.Popen[bytes]]:
    pki = write_pki(directory / "pki", operator="alice", node="gpu-0001")
    certificate, key = pki.pair("server")
    log = directory / "server.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                SERVER,
                "serve",
                *("--database-url", runtime_url(database_url), "--server-id", "egress-test"),
                *("--admin-host", "127.0.0.1", "--admin-port", str(admin_port)),
                *("--agent-host", "127.0.0.1", "--agent-port", str(free_port())),
                *("--client-host", "127.0.0.1", "--client-port", str(client_port)),
                *("--tls-cert", str(certificate), "--tls-key", str(key), "--tls-ca", str(pki.ca)),
                *("--engine-networks", ALLOWED),
                # Nothing placed, lost or timed out meanwhile: the routing table stays put.
                *("--adoption-grace", "600", "--lost-timeout", "600"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        print(f"----- {log} -----\n{log.read_text(errors='replace')}")  # shown if it fails


@contextlib.asynccontextmanager
async def listening(routes: list[RouteRow]) -> AsyncIterator[list[Listener]]:
    """A listener on every route's address and port that can be had."""
    listeners = [Listener(route.address, route.port) for route in routes]
    started = [listener for listener in listeners if await listener.start()]
    try:
        yield started
    finally:
        for listener in started:
            listener.close()


def sample(page: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", page, re.MULTILINE)
    assert match is not None, f"{name} not in the gateway's metrics"
    return float(match.group(1))


async def test_the_gateway_contacts_no_engine_of_a_generated_history_outside_its_networks(
    pg_store: PostgresEventStore, database_url: str, tmp_path: Path
) -> None:
    await load_history(pg_store)
    foreign = await routing_table(database_url)
    assert len(foreign) > 50, "the history should have put many replicas in routing"
    assert all(
        ipaddress.ip_address(r.address) in ipaddress.ip_network(HISTORY_NETWORK) for r in foreign
    )

    control = Listener("127.0.0.1", free_port())
    assert await control.start()
    await connect_node(pg_store, "control-node", "127.0.0.1")
    await declare_model(pg_store, CONTROL_MODEL)
    await serve_replica(pg_store, CONTROL_MODEL, 1, "control-node", control.port)
    key = (await Operations(pg_store).create_key(Caller(actor="alice"), "egress", ["*"])).key
    client_port, admin_port = free_port(), free_port()

    async with listening(foreign) as watched:
        assert len(watched) >= 0.9 * len(foreign), "too few routes could be listened for"
        with serving(database_url, tmp_path, client_port, admin_port) as server:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{client_port}", timeout=10
            ) as http:

                async def ready() -> bool:
                    assert server.poll() is None, "llmgw-server exited"
                    with contextlib.suppress(httpx.TransportError):
                        return (await http.get("/readyz")).status_code == 200
                    return False

                await wait_until(ready, within_s=STARTED_WITHIN_S, what="the gateway ready")
                await wait_until(
                    lambda: control.paths.count("GET /metrics") >= SCRAPES_TO_WAIT_FOR,
                    within_s=STARTED_WITHIN_S,
                    what="the control engine scraped",
                )
                chat = {"messages": [{"role": "user", "content": "Hello!"}]}
                headers = {"authorization": f"Bearer {key}"}
                to_control = await http.post(
                    "/v1/chat/completions", json={**chat, "model": CONTROL_MODEL}, headers=headers
                )
                to_history = await http.post(
                    "/v1/chat/completions",
                    json={**chat, "model": foreign[0].model},
                    headers=headers,
                )
                # The gateway's page is on the admin listener, where operators read it.
                metrics = f"http://127.0.0.1:{admin_port}/metrics"
                page = (await http.get(metrics)).text

            assert to_control.status_code == 200, to_control.text
            assert to_history.status_code == 503, to_history.text
            assert [(w.host, w.port) for w in watched if w.connections] == []
            refusals = (
                'llmgw_gateway_engine_egress_refusals_total{reason="outside_engine_networks"}'
            )
            assert sample(page, refusals) == len(foreign)
            assert sample(page, "llmgw_gateway_egress_refused_routes") == len(foreign)

            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=15) == 0

    control.close()
    warned = [
        entry["address"]
        for entry in map(json.loads, _json_lines(tmp_path / "server.log"))
        if entry.get("event") == "engine_address_refused"
    ]
    assert sorted(warned) == sorted({r.address for r in foreign})


def _json_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
