"""The whole system on a real inference engine: ``llmgw-server serve``, two ``llmgw-agent``
processes with fake GPUs, and the real ``llama-server`` processes they start, serving a real
270M-parameter model on the CPU (``tests.support.real_engine``; skipped only where the
``llamacpp`` extra is not installed).

A model declared with a llama-server command is placed and becomes ready through the real
readiness probe, and the gateway serves it to the official ``openai`` SDK; the gateway's
scraper reads the engine's real ``/metrics``; a drain moves a real engine under traffic
without a failed request; an engine killed with SIGKILL is reported failed with its own
log's tail and replaced; a spec naming a missing model file fails with the engine's log.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import openai
import pytest

from app.gateway.signals import sum_samples
from tests.support.cluster import Cluster, JsonObject, LoggedEvent, about, node_of
from tests.support.fleet import LOOPBACK
from tests.support.real_engine import RealEngine
from tests.support.traffic import Traffic, serves
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

ENGINE = "llamacpp"
"""The spec's ``engine``: llama.cpp's profile (its readiness probe, metric names and
failure reasons, ``wire/engines.py``)."""
NODES = ("gpu-a", "gpu-b")
MODEL = "gemma"
MAX_TOKENS = 8
CLIENTS = 4
READY_WITHIN_S = 90.0
"""A real engine loads its model in a few seconds alone; two cores shared with other test
runs can make that many times longer."""
ENGINE_METRICS = ("llamacpp:requests_processing", "llamacpp:requests_deferred")
"""What llama.cpp reports as running and waiting (deferred) requests."""


async def test_a_real_engine_is_placed_ready_and_serves_the_openai_sdk_with_usage(
    cluster: Cluster, real_engine: RealEngine
) -> None:
    gateway, key, serving = await real_fleet(cluster, real_engine)
    assert {node_of(r) for r in serving} == set(NODES), serving
    for replica in serving:
        engine_url = await shard_url(cluster, str(replica["id"]))
        async with httpx.AsyncClient(timeout=10.0) as http:
            models = (await http.get(f"{engine_url}/v1/models")).json()
        assert [m["id"] for m in models["data"]] == [MODEL], models

    async with openai.AsyncOpenAI(base_url=gateway, api_key=key, max_retries=0) as sdk:
        chat = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
        )
        assert chat.choices[0].message.content, chat
        assert chat.usage is not None, chat
        assert chat.usage.prompt_tokens > 0, chat.usage
        assert chat.usage.completion_tokens == MAX_TOKENS, chat.usage  # --ignore-eos

        completion = await sdk.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=MAX_TOKENS
        )
        assert completion.choices[0].text, completion
        assert completion.usage is not None, completion
        assert completion.usage.completion_tokens == MAX_TOKENS, completion.usage

        chat_stream = await sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count to three."}],
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in chat_stream]
        text = "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices)
        assert text, chunks
        assert [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
        assert chunks[-1].usage is not None, chunks[-1]
        assert chunks[-1].usage.completion_tokens == MAX_TOKENS, chunks[-1].usage

        completion_stream = await sdk.completions.create(
            model=MODEL,
            prompt="One, two,",
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces = [piece async for piece in completion_stream]
        assert "".join(p.text for piece in pieces for p in piece.choices), pieces
        usage = [piece.usage for piece in pieces if piece.usage is not None]
        assert usage, pieces
        assert usage[-1].completion_tokens == MAX_TOKENS, usage


async def test_the_gateway_scrapes_the_real_engines_metrics(
    cluster: Cluster, real_engine: RealEngine
) -> None:
    gateway, key, serving = await real_fleet(cluster, real_engine)
    for replica in serving:
        page = await engine_metrics(await shard_url(cluster, str(replica["id"])))
        assert set(ENGINE_METRICS) <= sum_samples(page, frozenset(ENGINE_METRICS)).keys(), page

    server = cluster.servers[0]
    # With llama.cpp's profile: requests_processing is read as running and
    # requests_deferred as waiting, no replica is stale, and running moves under load.
    running = "llmgw_gateway_replica_running"
    await wait_until(
        lambda: gateway_has(server.admin_url, running),
        within_s=30.0,
        what="the gateway's running gauge per replica",
    )
    assert await gateway_counts(server.admin_url, "llmgw_gateway_stale_replicas", 0)
    # llama.cpp has no KV-cache gauge: admission goes by the waiting queue, and says so.
    await wait_until(
        lambda: said_in(server_log(cluster), "engine_signals_absent"),
        within_s=10.0,
        what="the gateway saying which signal the engine lacks",
    )
    async with Traffic(gateway, key, MODEL, clients=CLIENTS, max_tokens=64) as traffic:
        await wait_until(
            lambda: gateway_above_zero(server.admin_url, running),
            within_s=60.0,
            what="running requests seen by the gateway",
        )
    traffic.assert_no_failures()


async def test_a_drain_moves_a_real_engine_under_traffic_without_a_failed_request(
    cluster: Cluster, real_engine: RealEngine
) -> None:
    gateway, key, serving = await real_fleet(cluster, real_engine)
    original = next(r for r in serving if node_of(r) == NODES[0])

    async with Traffic(gateway, key, MODEL, clients=CLIENTS, max_tokens=MAX_TOKENS) as traffic:
        await traffic.wait_for_successes(2 * CLIENTS, within_s=60.0)
        drain_id = await cluster.drain_node(NODES[0])
        await cluster.wait_for_event(
            "node_drain_finished", about(drain_id=drain_id), within_s=READY_WITHIN_S
        )
        await traffic.wait_for_successes(2 * CLIENTS, within_s=60.0)
    traffic.assert_no_failures()

    log = await cluster.events("replica_placed", "replica_stopped")
    placed = [e for e in log if e.get("replaces") == original["id"]]
    assert placed, log
    assert [e for e in log if e.type == "replica_stopped" and e.get("replica_id") == original["id"]]
    assert await cluster.replicas(model=MODEL, phase="serving", node=NODES[0]) == []
    assert len(await cluster.replicas(model=MODEL, phase="serving", node=NODES[1])) == 2


async def test_a_real_engine_killed_is_reported_with_its_log_and_replaced(
    cluster: Cluster, real_engine: RealEngine
) -> None:
    _, _, serving = await real_fleet(cluster, real_engine)
    killed = str(serving[0]["id"])
    killed_at = await cluster.last_position()
    os.kill(await engine_pid(cluster, killed), signal.SIGKILL)

    failed = await cluster.wait_for_event(
        "shard_failed", about(replica_id=killed), after=killed_at, within_s=30.0
    )
    assert written_by_llama_server(failed), failed.data
    await cluster.wait_for_event("replica_failed", about(replica_id=killed), after=killed_at)
    replacement = await cluster.wait_for_event(
        "replica_placed", about(model=MODEL), after=killed_at, within_s=30.0
    )
    await cluster.wait_for_event(
        "replica_serving",
        about(replica_id=replacement.get("replica_id")),
        after=killed_at,
        within_s=READY_WITHIN_S,
    )
    serving_now = {str(r["id"]) for r in await cluster.replicas(model=MODEL, phase="serving")}
    assert serving_now == {str(serving[1]["id"]), str(replacement.get("replica_id"))}


async def test_a_spec_naming_a_missing_model_file_fails_with_the_engines_log(
    cluster: Cluster, real_engine: RealEngine, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-model.gguf"
    cluster.start_server()
    await cluster.wait_for_leader()
    cluster.start_agent(NODES[0])
    await cluster.wait_for_nodes_connected(NODES[:1])
    await apply_real_model(cluster, real_engine.command(model_file=missing), replicas=1)

    failed = await cluster.wait_for_event("shard_failed", within_s=30.0)
    tail = log_tail(failed)
    assert any(str(missing) in line and "failed to open GGUF file" in line for line in tail), tail
    # The profile turns the tail into a one-line reason.
    assert "model file not found" in str(failed.get("error")), failed.data


# -- the fleet ------------------------------------------------------------------------


async def real_fleet(cluster: Cluster, engine: RealEngine) -> tuple[str, str, list[JsonObject]]:
    """A leader, an agent on each of ``NODES``, the real model's two replicas serving, and a
    key that the leader's gateway already serves: the gateway's URL, the key, the replicas."""
    cluster.start_server()
    server = await cluster.wait_for_leader()
    for node in NODES:
        cluster.start_agent(node)
    await cluster.wait_for_nodes_connected(NODES)
    await apply_real_model(cluster, engine.command(), replicas=2)
    serving = await cluster.wait_for_serving(MODEL, 2, within_s=READY_WITHIN_S)
    key = await cluster.create_key("real-engine", [MODEL])
    await wait_until(
        lambda: serves(server.gateway_url, key, MODEL), within_s=30.0, what="the gateway routes"
    )
    return server.gateway_url, key, serving


async def apply_real_model(cluster: Cluster, command: str, *, replicas: int) -> None:
    await cluster.apply_simulated_model(
        MODEL, replicas=replicas, command=command, engine=ENGINE, startup_timeout_s=120.0
    )


async def shard(cluster: Cluster, replica_id: str) -> JsonObject:
    view = await cluster.admin("GET", f"/admin/v1/replicas/{replica_id}")
    assert isinstance(view, dict), view
    (only,) = view["shards"]
    assert isinstance(only, dict), view
    return only


async def shard_url(cluster: Cluster, replica_id: str) -> str:
    return f"http://{LOOPBACK}:{(await shard(cluster, replica_id))['port']}"


async def engine_pid(cluster: Cluster, replica_id: str) -> int:
    pid = (await shard(cluster, replica_id))["pid"]
    assert isinstance(pid, int), pid
    return pid


# -- what the engines and the gateway say ----------------------------------------------


async def engine_metrics(engine_url: str) -> str:
    """The engine's own ``/metrics``, asked directly."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        answer = await http.get(f"{engine_url}/metrics")
    assert answer.status_code == 200, answer.text
    return answer.text


async def gateway_samples(admin_url: str, *names: str) -> dict[str, float]:
    """``names`` from the server's ``/metrics`` (its gateway's figures among them), summed
    over their series."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        answer = await http.get(f"{admin_url}/metrics")
    assert answer.status_code == 200, answer.text
    return sum_samples(answer.text, frozenset(names))


async def gateway_counts(admin_url: str, name: str, count: float) -> bool:
    return await gateway_samples(admin_url, name) == {name: count}


async def gateway_has(admin_url: str, name: str) -> bool:
    return name in await gateway_samples(admin_url, name)


async def gateway_above_zero(admin_url: str, name: str) -> bool:
    return (await gateway_samples(admin_url, name)).get(name, 0.0) > 0


def server_log(cluster: Cluster) -> Path:
    (path,) = sorted(cluster.directory.glob("server-0*.log"))[:1]
    return path


async def said_in(path: Path, words: str) -> bool:
    return words in await asyncio.to_thread(path.read_text, errors="replace")


def log_tail(event: LoggedEvent) -> list[str]:
    tail = event.get("log_tail")
    assert isinstance(tail, list), event.data
    return [str(line) for line in tail]


def written_by_llama_server(event: LoggedEvent) -> bool:
    """Whether the event's log tail holds lines of llama-server's own log (its slots and
    its HTTP server log under these tags)."""
    return any(" srv " in line or " slot " in line for line in log_tail(event))
