"""Agent faults under traffic through a standalone gateway: an agent killed and started
again re-attaches the engines it left running; an agent cut off for longer than the lost
timeout has its replicas replaced, and its own copies are stopped as strays once it is back
(and where it is the only place for them, their replacements start there beside the strays,
on GPUs and ports the strays do not hold); an engine that crashes is replaced and traffic
moves away from it; an agent started again with another port range has the replica whose
engine it left outside the range replaced.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest

from tests.support.cluster import Cluster, JsonObject, ServerSettings, about, node_of
from tests.support.fleet import LOOPBACK, is_running
from tests.support.traffic import Traffic, serves
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

NODES = ("gpu-a", "gpu-b", "gpu-c")
MODEL = "sim"
CLIENTS = 6
LOST_TIMEOUT_S = 3.0
REPLACED_EVENTS = ("replica_placed", "shard_starting", "replica_lost", "replica_failed")


@dataclass(frozen=True)
class Serving:
    """The two replicas of the model, each on a node of its own, and their engines."""

    replicas: list[JsonObject]
    engines: dict[str, int]
    """Engine pid by replica id."""

    def replica_on(self, node: str) -> str:
        return next(str(r["id"]) for r in self.replicas if node_of(r) == node)

    @property
    def nodes(self) -> list[str]:
        return [node_of(r) for r in self.replicas]


async def test_a_killed_agent_comes_back_and_re_attaches_its_running_engines(
    cluster: Cluster,
) -> None:
    async with fleet_under_traffic(cluster) as (serving, traffic):
        victim = serving.nodes[0]
        killed_at = await cluster.last_position()
        cluster.agents[victim].kill()
        await cluster.wait_for_event("node_disconnected", about(node_id=victim), after=killed_at)
        assert await engine_healthy(cluster, serving.replica_on(victim)), "with nobody watching"
        await traffic.wait_for_successes(2 * CLIENTS)

        cluster.start_agent(victim)
        await cluster.wait_for_event("node_connected", about(node_id=victim), after=killed_at)
        await traffic.wait_for_successes(2 * CLIENTS)
    traffic.assert_no_failures()

    since = await cluster.events(*REPLACED_EVENTS, "shard_stopped", after=killed_at)
    assert since == [], [(e.type, e.data) for e in since]
    for replica_id, pid in serving.engines.items():
        assert is_running(pid), f"the engine of {replica_id} ({pid}) is gone"
        assert await engine_pid(cluster, replica_id) == pid
    assert {str(r["id"]) for r in await cluster.replicas(phase="serving")} == set(serving.engines)
    started_again = cluster.agents[victim].log()
    assert f"{serving.replica_on(victim)}/0" in started_again, started_again


async def test_an_agent_cut_off_past_the_lost_timeout_is_replaced_and_its_copies_stopped(
    cluster: Cluster,
) -> None:
    cluster.settings = ServerSettings(lost_timeout_s=LOST_TIMEOUT_S)
    async with fleet_under_traffic(cluster) as (serving, traffic):
        cut_off = serving.nodes[0]
        stranded = serving.replica_on(cut_off)
        cut_at = await cluster.last_position()
        agent = cluster.agents[cut_off]
        os.kill(agent.pid, signal.SIGSTOP)
        try:
            await cluster.wait_for_event(
                "node_lost", about(node_id=cut_off), after=cut_at, within_s=LOST_TIMEOUT_S + 10
            )
            await cluster.wait_for_event("replica_lost", about(replica_id=stranded), after=cut_at)
            replacement = await cluster.wait_for_event(
                "replica_placed", about(model=MODEL), after=cut_at
            )
            assert cut_off not in placement_nodes(replacement.data), replacement
            await cluster.wait_for_event(
                "replica_serving", about(replica_id=replacement.get("replica_id")), after=cut_at
            )
            await traffic.wait_for_successes(2 * CLIENTS)
        finally:
            os.kill(agent.pid, signal.SIGCONT)

        stray = await cluster.wait_for_event(
            "stray_stopped", about(replica_id=stranded), after=cut_at, within_s=20.0
        )
        assert stray.get("node_id") == cut_off
        assert stray.get("pid") == serving.engines[stranded]
        await wait_until(
            lambda: not is_running(serving.engines[stranded]), what="the stray engine gone"
        )
        await traffic.wait_for_successes(2 * CLIENTS)
    traffic.assert_no_failures()

    verified = await cluster.verify_projections()
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_the_only_node_back_past_the_lost_timeout_starts_a_replacement_beside_its_stray(
    cluster: Cluster,
) -> None:
    """The replica's engine outlives the node's loss; once its agent is back, the engine is
    stopped as a stray with a grace, and the replacement is placed in the same pass on the
    only node there is. Before, it took the stray's port and GPU, the agent refused its
    start (port in use) and the replica failed, its model backing off."""
    cluster.settings = ServerSettings(lost_timeout_s=LOST_TIMEOUT_S)
    cluster.start_server()
    await cluster.wait_for_leader()
    (replica,) = await cluster.start_fleet(NODES[:1], MODEL, replicas=1)
    lost = str(replica["id"])
    engine, port = await engine_pid(cluster, lost), await engine_port(cluster, lost)
    cut_at = await cluster.last_position()
    agent = cluster.agents[NODES[0]]
    os.kill(agent.pid, signal.SIGSTOP)
    try:
        await cluster.wait_for_event(
            "replica_lost", about(replica_id=lost), after=cut_at, within_s=LOST_TIMEOUT_S + 10
        )
    finally:
        os.kill(agent.pid, signal.SIGCONT)

    stray = await cluster.wait_for_event("stray_stopped", about(replica_id=lost), after=cut_at)
    assert stray.get("pid") == engine
    placed = await cluster.wait_for_event("replica_placed", about(model=MODEL), after=cut_at)
    replacement = str(placed.get("replica_id"))
    ended = await cluster.wait_for_event(
        ("replica_serving", "replica_failed"), about(replica_id=replacement), after=cut_at
    )
    assert ended.type == "replica_serving", ended.data
    failed = await cluster.events("replica_failed", after=cut_at)
    assert failed == [], [(e.type, e.data) for e in failed]
    assert await engine_port(cluster, replacement) != port
    await wait_until(lambda: not is_running(engine), what="the stray engine gone")


async def test_a_crashed_engine_is_replaced_and_traffic_moves_away_from_it(
    cluster: Cluster,
) -> None:
    async with fleet_under_traffic(cluster) as (serving, traffic):
        crashed = str(serving.replicas[0]["id"])
        crashed_at = await cluster.last_position()
        killed_at = time.monotonic()
        os.kill(serving.engines[crashed], signal.SIGKILL)

        await cluster.wait_for_event("replica_failed", about(replica_id=crashed), after=crashed_at)
        await traffic.wait_for_successes(2 * CLIENTS)  # on the other replica alone
        replacement = await cluster.wait_for_event(
            "replica_placed", about(model=MODEL), after=crashed_at, within_s=25.0
        )
        await cluster.wait_for_event(
            "replica_serving", about(replica_id=replacement.get("replica_id")), after=crashed_at
        )
        await traffic.wait_for_successes(2 * CLIENTS)
    # An answer the engine was sending when it was killed is cut, as docs/engines.md says
    # (its client gets the error event, or a 502 for a whole answer); every request sent
    # after the kill is served.
    assert traffic.successes() > 0, traffic.summary()
    for failed in traffic.failures():
        assert failed.started_at < killed_at, traffic.summary()
        assert failed.kind in ("stream error event", "status 502"), traffic.summary()

    serving_now = {str(r["id"]) for r in await cluster.replicas(model=MODEL, phase="serving")}
    assert crashed not in serving_now
    assert serving_now == {str(serving.replicas[1]["id"]), str(replacement.get("replica_id"))}


@pytest.mark.timeout(90)  # on top of the fleet's start: a quiesced stop, then a new start
async def test_an_agent_back_with_another_port_range_has_its_engine_replaced_not_failed(
    cluster: Cluster,
) -> None:
    """The agent is killed (its engine lives on) and started with a port range that no
    longer holds the engine's port. Before, the engine was stopped as a stray and its
    replica failed "stopped without being asked to"; now the replica leaves routing, is
    stopped with the port and the range as its reason, and is replaced, clients unaware."""
    async with fleet_under_traffic(cluster) as (serving, traffic):
        moved = serving.nodes[0]
        replica = serving.replica_on(moved)
        old_range = cluster.engine_ports.ranges.pop(moved)
        while cluster.engine_ports.of(moved) == old_range:
            del cluster.engine_ports.ranges[moved]
        restarted_at = await cluster.last_position()
        cluster.restart_agent(moved)

        stopping = await cluster.wait_for_event(
            ("replica_stopping", "replica_failed"), about(replica_id=replica), after=restarted_at
        )
        assert stopping.type == "replica_stopping", stopping.data
        port = await engine_port(cluster, replica)
        new_range = cluster.engine_ports.of(moved)
        reason = f"port {port} is outside {moved}'s port range {new_range}"
        assert stopping.get("reason") == reason
        await cluster.wait_for_event(
            "replica_stopped", about(replica_id=replica), after=restarted_at
        )
        replacement = await cluster.wait_for_event(
            "replica_placed", about(model=MODEL), after=restarted_at
        )
        await cluster.wait_for_event(
            "replica_serving", about(replica_id=replacement.get("replica_id")), after=restarted_at
        )
        await wait_until(
            lambda: not is_running(serving.engines[replica]), what="the old engine gone"
        )
        await traffic.wait_for_successes(2 * CLIENTS)
    traffic.assert_no_failures()

    since = await cluster.events("replica_failed", "stray_stopped", after=restarted_at)
    assert since == [], [(e.type, e.data) for e in since]
    shown = await cluster.cli("history", "replica", replica, "--output", "json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    told = [(event["type"], event["summary"]) for event in json.loads(shown.stdout)]
    assert told[-3:] == [
        ("replica_stopping", f"replica {replica} out of routing, stopping: {reason}"),
        ("shard_stopped", f"replica {replica} shard 0 stopped on {moved}"),
        ("replica_stopped", f"replica {replica} stopped"),
    ], told


@asynccontextmanager
async def fleet_under_traffic(cluster: Cluster) -> AsyncIterator[tuple[Serving, Traffic]]:
    """A leader, three agents, the model's two replicas serving on two nodes, and clients
    sending to them through a standalone gateway (already succeeding)."""
    cluster.start_server()
    await cluster.wait_for_leader()
    replicas = await cluster.start_fleet(NODES, MODEL, replicas=2)
    assert len({node_of(r) for r in replicas}) == 2, replicas
    engines = {str(r["id"]): await engine_pid(cluster, str(r["id"])) for r in replicas}
    gateway = await cluster.start_gateway()
    key = await cluster.create_key("agent-faults", [MODEL])
    await wait_until(
        lambda: serves(gateway.url, key, MODEL), within_s=10.0, what="the gateway routes"
    )
    async with Traffic(gateway.url, key, MODEL, clients=CLIENTS) as traffic:
        await traffic.wait_for_successes(2 * CLIENTS)
        yield Serving(replicas, engines), traffic


async def engine_healthy(cluster: Cluster, replica_id: str) -> bool:
    """The engine answers its health check, asked directly, not through any llmgw process."""
    view = await cluster.admin("GET", f"/admin/v1/replicas/{replica_id}")
    assert isinstance(view, dict), view
    (shard,) = view["shards"]
    async with httpx.AsyncClient(timeout=5.0) as http:
        answer = await http.get(f"http://{LOOPBACK}:{shard['port']}/health")
    return answer.status_code == 200


async def engine_pid(cluster: Cluster, replica_id: str) -> int:
    view = await cluster.admin("GET", f"/admin/v1/replicas/{replica_id}")
    assert isinstance(view, dict), view
    (shard,) = view["shards"]
    pid = shard["pid"]
    assert isinstance(pid, int), view
    return pid


async def engine_port(cluster: Cluster, replica_id: str) -> int:
    view = await cluster.admin("GET", f"/admin/v1/replicas/{replica_id}")
    assert isinstance(view, dict), view
    (shard,) = view["shards"]
    port = shard["port"]
    assert isinstance(port, int), view
    return port


def placement_nodes(placed: JsonObject) -> list[str]:
    shards = placed["shards"]
    assert isinstance(shards, list), placed
    return [str(shard["node_id"]) for shard in shards]
