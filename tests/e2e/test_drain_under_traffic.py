"""An operator drains a node while twenty clients use the model through the gateway: no
client notices, the replica moves, and the log tells who did it and in what order."""

from __future__ import annotations

import json

import pytest

from agent.simulator.launcher import simulator_command
from tests.support.cluster import (
    ADMIN_TOKEN_NAME,
    Cluster,
    JsonObject,
    LoggedEvent,
    about,
    first,
    node_of,
)
from tests.support.traffic import Traffic, serves
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

NODES = ("gpu-a", "gpu-b", "gpu-c")
MODEL = "sim"
CLIENTS = 20
PACED_ENGINE = (
    f"{simulator_command()} --port {{port}} --model {{model}} "
    "--decode-base-ms 20 --decode-per-seq-ms 0 --prefill-ms-per-token 0"
)
"""About 20 ms a token: requests are in flight when routing changes under them."""


async def test_a_drain_under_traffic_moves_the_replica_and_no_client_sees_an_error(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    server = await cluster.wait_for_leader()
    serving = await cluster.start_fleet(NODES, MODEL, replicas=2, command=PACED_ENGINE)
    assert len({node_of(r) for r in serving}) == 2, serving
    original, _ = serving
    drained_node = node_of(original)
    key = await cluster.create_key("drain-traffic", [MODEL])
    await wait_until(
        lambda: serves(server.gateway_url, key, MODEL), within_s=10.0, what="the gateway routes"
    )

    async with Traffic(server.gateway_url, key, MODEL, clients=CLIENTS) as traffic:
        await traffic.wait_for_successes(2 * CLIENTS)
        drain_id = await cluster.drain_node(drained_node)
        await cluster.wait_for_event("node_drain_finished", about(drain_id=drain_id), within_s=30.0)
        await traffic.wait_for_successes(2 * CLIENTS)
    traffic.assert_no_failures()
    streamed = [o for o in traffic.outcomes if o.call.endswith("stream")]
    assert len(streamed) >= CLIENTS, traffic.summary()

    log = await cluster.events()
    placed = first(log, "replica_placed", replaces=original["id"])
    replacement = str(placed.get("replica_id"))
    assert nodes_of_placement(placed) != [drained_node]
    replacement_serves = first(log, "replica_serving", replica_id=replacement)
    handed_over = first(log, "replacement_serving", replica_id=original["id"])
    original_stops = first(log, "replica_stopping", replica_id=original["id"])
    engine_stopped = first(log, "shard_stopped", replica_id=original["id"])
    original_stopped = first(log, "replica_stopped", replica_id=original["id"])
    assert (
        placed.position
        < replacement_serves.position
        < handed_over.position
        < original_stops.position
        < engine_stopped.position
        < original_stopped.position
    )
    assert await cluster.replicas(model=MODEL, phase="serving", node=drained_node) == []

    node_history = await history(cluster, "node", drained_node)
    (requested,) = [e for e in node_history if e["type"] == "node_drain_requested"]
    assert requested["actor"] == ADMIN_TOKEN_NAME, requested
    assert requested["correlation_id"] == drain_id, requested
    moved = await history(cluster, "replica", str(original["id"]))
    steps = [e["type"] for e in moved if e["correlation_id"] == drain_id]
    assert steps == [
        "replica_drain_started",
        "replacement_serving",
        "replica_stopping",
        "replica_stopped",
    ], moved
    arrived = await history(cluster, "replica", replacement)
    assert arrived[0]["type"] == "replica_placed", arrived
    assert arrived[0]["correlation_id"] == drain_id, arrived


def nodes_of_placement(placed: LoggedEvent) -> list[str]:
    shards = placed.get("shards")
    assert isinstance(shards, list), placed
    return [str(shard["node_id"]) for shard in shards]


async def history(cluster: Cluster, subject: str, key: str) -> list[JsonObject]:
    """``llmgw-cli history SUBJECT KEY --output json``, as the operator runs it."""
    shown = await cluster.cli("history", subject, key, "--output", "json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    events: list[JsonObject] = json.loads(shown.stdout)
    return events
