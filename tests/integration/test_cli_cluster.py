"""``llmgw-cli drain --wait`` against a cluster of real processes where drains really run:
``llmgw-server serve``, two ``llmgw-agent`` processes with fake GPUs and the engine
simulators they start (tests/support/cluster.py). And a server stopping while an operator
follows its event stream."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import (
    ADMIN_TOKEN,
    Cluster,
    ClusterPki,
    JsonObject,
    ServerProcess,
    issue_pki,
)
from tests.support.operator_cli import Operator
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(150)

SUFFIX = secrets.token_hex(2)
NODES = (f"gpu-a-{SUFFIX}", f"gpu-b-{SUFFIX}")
MODEL = f"sim-{SUFFIX}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ClusterPki:
    return issue_pki(tmp_path_factory.mktemp("cli-pki"), NODES)


async def serving_server(cluster: Cluster) -> ServerProcess:
    server = cluster.start_server()
    await cluster.wait_for_leader()
    await cluster.wait_until_serving_admin(server)
    return server


async def one_serving_replica(cluster: Cluster) -> JsonObject:
    serving: list[JsonObject] = []

    async def one() -> bool:
        serving[:] = await cluster.replicas(model=MODEL, phase="serving")
        return len(serving) == 1

    await wait_until(one, within_s=30, every_s=0.1, what="one replica serving")
    return serving[0]


def the_node(replica: JsonObject) -> str:
    nodes = replica["nodes"]
    assert isinstance(nodes, list), replica
    assert len(nodes) == 1, replica
    return str(nodes[0])


async def test_drain_wait_follows_each_drain_to_its_end_and_exits_with_how_it_ended(
    cluster: Cluster, tmp_path: Path
) -> None:
    server = await serving_server(cluster)
    for node in NODES:
        cluster.start_agent(node)
    await cluster.wait_for_nodes_connected(NODES)
    await cluster.apply_simulated_model(MODEL, replicas=1)
    original = await one_serving_replica(cluster)
    operator = Operator(home=tmp_path, admin_url=server.admin_url, token=ADMIN_TOKEN)

    # One replica, moved on its own.
    replica_moved = await operator.run("drain", "--replica", str(original["id"]), "--wait")
    replacement = await one_serving_replica(cluster)
    # Then its node: the replica moves to the other node.
    first_node = the_node(replacement)
    node_moved = await operator.run("drain", first_node, "--wait")
    survivor = await one_serving_replica(cluster)
    # Then the other node, where nothing can take the replica: the grace runs out.
    (second_node,) = set(NODES) - {first_node}
    stranded = await operator.run(
        "drain", second_node, "--grace", "2", "--wait", "--output", "json"
    )

    assert replica_moved.code == 0, replica_moved.stderr
    assert replacement["replaces"] == original["id"]
    assert "replacement_serving" in replica_moved.stdout
    assert node_moved.code == 0, node_moved.stderr
    steps = [line.split()[2] for line in node_moved.stdout.splitlines() if line[:2] == "20"]
    assert steps[0] == "node_drain_requested"
    assert steps[-1] == "node_drain_finished"
    assert "replacement_serving" in steps
    assert "done: every replica moved" in node_moved.stdout
    assert "latest steps" not in node_moved.stdout  # the steps were printed as they came
    assert (survivor["replaces"], the_node(survivor)) == (replacement["id"], second_node)
    assert stranded.code == 1
    progress = json.loads(stranded.stdout)
    assert (progress["node_id"], progress["finished"]) == (second_node, True)
    assert progress["state"] == "failed"
    assert progress["outcome"] == "grace ran out; what was left was stopped"
    assert f"{progress['drain_id']} failed: grace ran out" in stranded.stderr


async def test_a_drain_that_is_refused_says_why_and_drain_progress_shows_a_finished_one(
    cluster: Cluster, tmp_path: Path
) -> None:
    server = await serving_server(cluster)
    cluster.start_agent(NODES[0])
    await cluster.wait_for_nodes_connected(NODES[:1])
    operator = Operator(home=tmp_path, admin_url=server.admin_url, token=ADMIN_TOKEN)

    started = await operator.run("drain", NODES[0], "--output", "json")
    drain_id = started.json()["drain_id"]
    await cluster.wait_for_event("node_drain_finished", lambda e: e.get("drain_id") == drain_id)
    again = await operator.run("drain", NODES[0])
    unknown = await operator.run("drain", "--replica", f"{MODEL}-99")
    shown = await operator.run("drain-progress", drain_id, "--output", "json")

    assert again.code == 0, again.stderr  # a finished drain leaves the node free to drain again
    assert unknown.code == 1
    assert f"no replica '{MODEL}-99' is known" in unknown.stderr
    assert (shown.json()["finished"], shown.json()["outcome"]) == (
        True,
        "no replica was serving on the node",
    )
    assert shown.json()["state"] == "succeeded"


async def test_a_server_stops_promptly_while_an_operator_follows_its_events(
    cluster: Cluster,
) -> None:
    server = await serving_server(cluster)

    async with (
        httpx.AsyncClient(headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as client,
        client.stream("GET", f"{server.admin_url}/admin/v1/events") as response,
    ):
        assert response.status_code == 200
        lines = response.aiter_lines()
        assert (await anext(lines)).startswith(": following the log")
        # terminate() waits STOP_WAIT_S for the exit, and fails the test if it waits longer.
        exit_code = await asyncio.to_thread(server.terminate)
        remaining = [line async for line in lines]

    assert exit_code == 0
    # The stream ended cleanly (a cut one raises in the loop above), saying why.
    said = [line for line in remaining if line.startswith((":", "data:"))]
    assert said == [": the server stops: reconnect to resume"]
    log = server.log_path.read_text()
    assert "Exception in ASGI application" not in log  # uvicorn's line (the admin API)
    assert "asgi_app_failed" not in log  # the client listener's (app.listeners)
