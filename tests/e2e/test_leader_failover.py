"""The leading control plane is killed with a standby running: the standby leads within
10 s, every agent reconnects to it with its engines still running, the new leader acts on
what the operator asks, and clients of a standalone gateway never notice."""

from __future__ import annotations

import pytest

from tests.support.cluster import Cluster, about
from tests.support.traffic import Traffic, serves
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.serial]  # asserts how soon things happen

NODES = ("gpu-a", "gpu-b", "gpu-c")
MODEL = "sim"
CLIENTS = 8
FAILOVER_WITHIN_S = 10.0


async def test_a_standby_leads_within_seconds_of_the_leader_being_killed_under_traffic(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    leader = await cluster.wait_for_leader()
    standby = cluster.start_server()
    await cluster.wait_until_serving_admin(standby)
    serving = await cluster.start_fleet(NODES, MODEL, replicas=2)
    gateway = await cluster.start_gateway()
    key = await cluster.create_key("failover-traffic", [MODEL])
    await wait_until(lambda: serves(gateway.url, key, MODEL), what="the gateway routes")
    before = await cluster.leadership()
    assert before is not None
    assert before.holder == leader.server_id

    async with Traffic(gateway.url, key, MODEL, clients=CLIENTS) as traffic:
        await traffic.wait_for_successes(2 * CLIENTS)
        killed_at = await cluster.last_position()
        leader.kill()
        successor = await cluster.wait_for_leader(
            after_epoch=before.epoch, within_s=FAILOVER_WITHIN_S
        )
        assert successor is standby
        now = await cluster.leadership()
        assert now is not None
        assert now.epoch == before.epoch + 1

        for node in NODES:
            back = await cluster.wait_for_event(
                "node_connected", about(node_id=node), after=killed_at
            )
            assert back.epoch == now.epoch, back
        for replica in serving:
            adopted = await cluster.wait_for_event(
                "replica_adopted", about(replica_id=replica["id"]), after=killed_at
            )
            assert adopted.epoch == now.epoch, adopted
        await traffic.wait_for_successes(2 * CLIENTS)

        await cluster.scale(MODEL, 3)
        third = await cluster.wait_for_event("replica_placed", after=killed_at)
        assert third.epoch == now.epoch, third
        await cluster.wait_for_serving(MODEL, 3)
        await traffic.wait_for_successes(2 * CLIENTS)
    traffic.assert_no_failures()

    placed = await cluster.events("replica_placed")
    assert len(placed) == 3, [e.data for e in placed]
    assert len(await cluster.events("shard_starting")) == 3
