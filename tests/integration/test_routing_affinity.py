"""Prefix and session affinity across gateways, with real processes: three
``llmgw-server gateway`` processes read one routing table from PostgreSQL and stand in
front of four simulated engines. The turns of a conversation enter by whichever gateway
comes next, and every one lands on the same replica: the route header says so, and so does
the engines' own prefix cache (only that replica found the conversation's earlier turns in
its cache). With the ``session`` policy, a session id does the same; and the gateways count
each decision's reason in ``/metrics``."""

from __future__ import annotations

import contextlib
import itertools
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.domain.events import ModelDeclared
from app.domain.model_spec import ModelSpec, RoutingSettings
from app.services.operations import Caller, Operations
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import record
from tests.support.gateway_process import FAST_SCRAPE, gateway_process
from tests.support.ports import free_port
from tests.support.routing import connect_node, serve_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

GATEWAYS = 3
ENGINES = 4
SYSTEM = "You are a careful assistant who answers in short sentences. " * 8
ROUTE = re.compile(r"replica=(?P<replica>[^;]+); policy=(?P<policy>\w+); reason=(?P<reason>\w+)")


@contextlib.contextmanager
def engines(model: str) -> Iterator[list[SimulatorProcess]]:
    with contextlib.ExitStack() as stack:
        started = [stack.enter_context(start_simulator("--model", model)) for _ in range(ENGINES)]
        for engine in started:
            engine.wait_healthy()
        yield started


@contextlib.asynccontextmanager
async def cluster(
    pg_store: PostgresEventStore, database_url: str, tmp_path: Path, routing: RoutingSettings
) -> AsyncIterator[tuple[str, list[httpx.AsyncClient], dict[str, SimulatorProcess]]]:
    """A model of four replicas on simulators, three gateways in front of them: the model,
    a client per gateway, and the engines by replica id."""
    model = f"m{secrets.token_hex(3)}"
    spec = ModelSpec(
        name=model, command="sim --port {port} --model {model}", replicas=ENGINES, routing=routing
    )
    with engines(model) as started, contextlib.ExitStack() as stack:
        await connect_node(pg_store, "gpu-1", "127.0.0.1")
        await record(pg_store, "alice", ModelDeclared(model=model, spec=spec))
        by_replica = {
            await serve_replica(pg_store, model, n, "gpu-1", engine.port): engine
            for n, engine in enumerate(started, start=1)
        }
        key = (await Operations(pg_store).create_key(Caller(actor="alice"), "c", [model])).key
        ports = [free_port() for _ in range(GATEWAYS)]
        for n, port in enumerate(ports):
            log = tmp_path / f"gateway-{n}.log"
            stack.enter_context(
                gateway_process(
                    database_url, gateway_id=f"gw-{n}", port=port, log=log, options=FAST_SCRAPE
                )
            )
        async with contextlib.AsyncExitStack() as clients:
            http = [
                await clients.enter_async_context(
                    httpx.AsyncClient(
                        base_url=f"http://127.0.0.1:{port}",
                        headers={"authorization": f"Bearer {key}", "x-llmgw-route": "1"},
                        timeout=30.0,
                    )
                )
                for port in ports
            ]
            for client in http:
                await wait_until(
                    lambda client=client: answers(client, model),  # type: ignore[misc]
                    within_s=30.0,
                    what="the gateway routes",
                )
                await wait_until(
                    lambda client=client: knows_every_replica(client, model),  # type: ignore[misc]
                    within_s=10.0,
                    what="the gateway routes to all four replicas",
                )
            yield model, http, by_replica


async def answers(client: httpx.AsyncClient, model: str) -> bool:
    with contextlib.suppress(httpx.TransportError):
        answer = await client.post(
            "/v1/completions", json={"model": model, "prompt": "ping", "max_tokens": 1}
        )
        return answer.status_code == 200
    return False


async def knows_every_replica(client: httpx.AsyncClient, model: str) -> bool:
    """Some conversation's home is each replica: 40 of them all but surely cover four."""
    seen = set()
    for n in range(40):
        answer = await client.post(
            "/v1/completions", json={"model": model, "prompt": f"probe {n}", "max_tokens": 1}
        )
        seen.add(ROUTE.match(answer.headers["x-llmgw-route"])["replica"])  # type: ignore[index]
    return len(seen) == ENGINES


async def turn(
    client: httpx.AsyncClient, model: str, messages: list[dict[str, str]], **extra: object
) -> tuple[str, str, str]:
    """Send a chat turn; the replica, policy and reason of its route header."""
    answer = await client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": messages, "max_tokens": 8},
        **extra,  # type: ignore[arg-type]
    )
    assert answer.status_code == 200, answer.text
    matched = ROUTE.match(answer.headers["x-llmgw-route"])
    assert matched is not None, answer.headers["x-llmgw-route"]
    messages.append(answer.json()["choices"][0]["message"])
    return matched["replica"], matched["policy"], matched["reason"]


def prefix_cache_hits(engine: SimulatorProcess) -> float:
    text = httpx.get(f"http://127.0.0.1:{engine.port}/metrics", timeout=5.0).text
    found = re.search(r"^vllm:prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    assert found is not None, text
    return float(found[1])


async def test_every_turn_of_a_conversation_lands_on_one_replica_whichever_gateway_it_enters(
    pg_store: PostgresEventStore, database_url: str, tmp_path: Path
) -> None:
    routing = RoutingSettings(policy="prefix", target_waiting=50)
    async with cluster(pg_store, database_url, tmp_path, routing) as (model, http, engines):
        hits_before = {replica: prefix_cache_hits(e) for replica, e in engines.items()}
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Tell me about consistent hashing in three steps."},
        ]
        landed = []
        for n, gateway in zip(range(6), itertools.cycle(http), strict=False):
            replica, policy, reason = await turn(gateway, model, messages)
            landed.append(replica)
            assert (policy, reason) == ("prefix", "home")
            messages.append({"role": "user", "content": f"Go on with step {n + 2}."})
        assert len(set(landed)) == 1, landed
        (home,) = set(landed)
        # The engines agree: the home found the conversation's earlier turns in its prefix
        # cache, and no other replica saw it at all.
        gained = {r: prefix_cache_hits(e) - hits_before[r] for r, e in engines.items()}
        assert gained[home] > 0
        assert all(gained[r] == 0 for r in engines if r != home), gained

        # Other conversations spread over the replicas, each on one of its own.
        homes = set()
        for n in range(12):
            conversation = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Question number {n}: why is the sky blue?"},
            ]
            first, *_ = await turn(http[0], model, conversation)
            conversation.append({"role": "user", "content": "And at sunset?"})
            for gateway in http[1:]:
                assert (await turn(gateway, model, conversation))[0] == first
            homes.add(first)
        assert len(homes) >= 2, homes


async def test_a_session_id_keeps_a_conversation_on_one_replica_across_gateways(
    pg_store: PostgresEventStore, database_url: str, tmp_path: Path
) -> None:
    routing = RoutingSettings(policy="session", target_waiting=50)
    async with cluster(pg_store, database_url, tmp_path, routing) as (model, http, _):
        homes = set()
        for session in (f"session-{n}" for n in range(8)):
            landed = set()
            for n, gateway in zip(range(6), itertools.cycle(http), strict=False):
                # Each turn opens differently: only the session id ties them together.
                messages = [{"role": "user", "content": f"turn {n} of {session}"}]
                replica, policy, reason = await turn(
                    gateway, model, messages, headers={"x-session-id": session}
                )
                assert (policy, reason) == ("session", "home")
                landed.add(replica)
            assert len(landed) == 1, (session, landed)
            homes |= landed
        assert len(homes) >= 2, homes  # sessions spread: not one replica for everything
