"""Replicas of several shards on real processes: each shard of a replica runs on a node of
its own; when one shard's engine dies, or one shard's node is lost, the whole replica ends,
the engines of its other shards are stopped on their nodes (none is left holding GPUs), and
a replacement serves under a new id.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.support.cluster import (
    SIMULATOR_COMMAND,
    Cluster,
    JsonObject,
    ServerSettings,
    about,
)
from tests.support.fleet import is_running
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

NODES = ("gpu-a", "gpu-b", "gpu-c")
MODEL = "wide"
LOST_TIMEOUT_S = 3.0


async def serving_two_shard_replica(cluster: Cluster) -> JsonObject:
    """A leader, three agents, and one replica of a two-shard model serving; its view."""
    cluster.start_server()
    await cluster.wait_for_leader()
    for node in NODES:
        cluster.start_agent(node)
    await cluster.wait_for_nodes_connected(NODES)
    await cluster.apply_simulated_model(MODEL, replicas=1, shards_per_replica=2)
    (replica,) = await cluster.wait_for_serving(MODEL, 1)
    return await replica_view(cluster, str(replica["id"]))


async def replica_view(cluster: Cluster, replica_id: str) -> JsonObject:
    view = await cluster.admin("GET", f"/admin/v1/replicas/{replica_id}")
    assert isinstance(view, dict), view
    return view


def shards_of(view: JsonObject) -> list[JsonObject]:
    shards = view["shards"]
    assert isinstance(shards, list), view
    return shards


def engines_of(view: JsonObject) -> dict[str, int]:
    """Engine pid by node."""
    engines = {str(s["node_id"]): s["pid"] for s in shards_of(view)}
    assert all(isinstance(pid, int) for pid in engines.values()), view
    return {node: int(str(pid)) for node, pid in engines.items()}


async def assert_replaced(cluster: Cluster, ended: str, after: int) -> None:
    placed = await cluster.wait_for_event("replica_placed", about(model=MODEL), after=after)
    replacement = str(placed.get("replica_id"))
    await cluster.wait_for_event(
        "replica_serving", about(replica_id=replacement), after=after, within_s=20.0
    )
    serving = {str(r["id"]) for r in await cluster.replicas(model=MODEL, phase="serving")}
    assert serving == {replacement}, serving
    view = await replica_view(cluster, replacement)
    assert len(set(engines_of(view))) == 2, view
    verified = await cluster.verify_projections()
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_the_shards_of_a_replica_run_on_distinct_nodes(cluster: Cluster) -> None:
    view = await serving_two_shard_replica(cluster)
    engines = engines_of(view)
    assert len(engines) == 2, view
    assert all(is_running(pid) for pid in engines.values()), view
    assert [s["index"] for s in shards_of(view)] == [0, 1], view


async def test_one_shard_engine_killed_fails_the_replica_and_stops_its_other_shard(
    cluster: Cluster,
) -> None:
    view = await serving_two_shard_replica(cluster)
    replica = str(view["id"])
    engines = engines_of(view)
    killed_node = str(shards_of(view)[1]["node_id"])
    kept_node = str(shards_of(view)[0]["node_id"])
    at = await cluster.last_position()
    os.kill(engines[killed_node], signal.SIGKILL)

    await cluster.wait_for_event("replica_failed", about(replica_id=replica), after=at)
    await wait_until(
        lambda: not is_running(engines[kept_node]),
        within_s=20.0,
        what=f"shard 0's engine on {kept_node} stopped",
    )
    await cluster.wait_for_event(
        "shard_stopped", about(replica_id=replica, node_id=kept_node), after=at
    )
    await assert_replaced(cluster, replica, at)


async def test_one_shard_node_lost_loses_the_replica_and_stops_its_other_shard(
    cluster: Cluster,
) -> None:
    cluster.settings = ServerSettings(lost_timeout_s=LOST_TIMEOUT_S)
    view = await serving_two_shard_replica(cluster)
    replica = str(view["id"])
    engines = engines_of(view)
    cut_off = str(shards_of(view)[1]["node_id"])
    kept_node = str(shards_of(view)[0]["node_id"])
    at = await cluster.last_position()
    agent = cluster.agents[cut_off]
    os.kill(agent.pid, signal.SIGSTOP)
    try:
        await cluster.wait_for_event(
            "replica_lost", about(replica_id=replica), after=at, within_s=LOST_TIMEOUT_S + 10
        )
        await wait_until(
            lambda: not is_running(engines[kept_node]),
            within_s=20.0,
            what=f"shard 0's engine on {kept_node} stopped",
        )
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    await cluster.wait_for_event(
        "stray_stopped", about(replica_id=replica, node_id=cut_off), after=at, within_s=20.0
    )
    await wait_until(lambda: not is_running(engines[cut_off]), what="the cut-off engine gone")
    await assert_replaced(cluster, replica, at)


async def test_a_restarted_leader_adopts_starting_shards_from_agents_back_at_different_times(
    cluster: Cluster,
) -> None:
    """The leader is killed while both shards start; one shard's agent is killed too and
    comes back only after the new leader leads. Each shard is adopted from its own agent,
    and the replica serves under its id, with the engines it had."""
    server = cluster.start_server()
    await cluster.wait_for_leader()
    for node in NODES:
        cluster.start_agent(node)
    await cluster.wait_for_nodes_connected(NODES)
    slow = SIMULATOR_COMMAND.replace("--instant", "--instant --start-delay 4")
    await cluster.apply_simulated_model(MODEL, replicas=1, shards_per_replica=2, command=slow)
    first = await cluster.wait_for_event("shard_starting", about(shard_index=0))
    await cluster.wait_for_event("shard_starting", about(shard_index=1))
    replica = str(first.get("replica_id"))
    view = await replica_view(cluster, replica)
    engines = engines_of(view)
    late = str(shards_of(view)[1]["node_id"])
    at = await cluster.last_position()
    cluster.agents[late].kill()
    server.kill()
    server = cluster.restart_server(server)
    await cluster.wait_for_leader()
    await cluster.wait_for_event(
        "replica_adopted",
        about(replica_id=replica, node_id=str(shards_of(view)[0]["node_id"])),
        after=at,
    )
    cluster.start_agent(late)
    await cluster.wait_for_event(
        "replica_serving", about(replica_id=replica), after=at, within_s=20.0
    )
    ended = await cluster.events(
        "replica_failed", "replica_lost", "stray_stopped", "replica_placed", after=at
    )
    assert ended == [], [(e.type, e.data) for e in ended]
    assert engines_of(await replica_view(cluster, replica)) == engines
    assert all(is_running(pid) for pid in engines.values())
    verified = await cluster.verify_projections()
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_one_shard_stopped_by_its_agent_while_the_other_ran_on_is_replaced_whole(
    cluster: Cluster,
) -> None:
    """One shard's agent stops its engine on the way out and comes back; the other shard's
    engine ran on all along. Before, the stopped shard alone was started again beside it
    (a real multi-node engine would hang there, every GPU of the replica held); now the
    replica is stopped, both shards, and replaced whole."""
    cluster.start_server()
    await cluster.wait_for_leader()
    for node in NODES:
        cluster.start_agent(node, engines_on_exit="stop")
    await cluster.wait_for_nodes_connected(NODES)
    await cluster.apply_simulated_model(MODEL, replicas=1, shards_per_replica=2)
    (serving,) = await cluster.wait_for_serving(MODEL, 1)
    view = await replica_view(cluster, str(serving["id"]))
    replica, engines = str(view["id"]), engines_of(view)
    stopped, ran_on = (str(s["node_id"]) for s in shards_of(view)[::-1])
    at = await cluster.last_position()

    assert cluster.stop_agent(stopped) == 0
    await cluster.wait_for_event("shard_stopped", about(replica_id=replica, node_id=stopped))
    cluster.start_agent(stopped, engines_on_exit="stop")

    stopping = await cluster.wait_for_event(
        "replica_stopping", about(replica_id=replica), after=at, within_s=15.0
    )
    assert "cannot rejoin its peers" in str(stopping.get("reason")), stopping.data
    await wait_until(
        lambda: not is_running(engines[ran_on]), what=f"the engine that ran on {ran_on} stopped"
    )
    started_again = await cluster.events("shard_starting", after=at)
    assert [e for e in started_again if e.get("replica_id") == replica] == [], started_again
    await assert_replaced(cluster, replica, at)
