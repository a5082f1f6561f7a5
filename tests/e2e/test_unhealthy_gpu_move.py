"""A fake GPU marked unhealthy under a serving replica, as an operator marks one
(``llmgw-agent fake-gpu mark``): the control plane moves the replica to a healthy GPU on
its own, a replacement first, the original stopped only once that serves."""

from __future__ import annotations

import pytest

from tests.support.cluster import Cluster, about, node_of
from tests.support.fleet import mark_fake_gpu

pytestmark = pytest.mark.timeout(60)

NODES = ("gpu-a", "gpu-b")
MODEL = "sim"
REASON = "XID 48: double-bit ECC error"


async def test_a_replica_on_a_gpu_marked_unhealthy_is_moved_by_the_reconciler(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    await cluster.wait_for_leader()
    for node in NODES:
        cluster.start_agent(node, fake_gpus="1x80GB")
    await cluster.wait_for_nodes_connected(NODES)
    await cluster.apply_simulated_model(MODEL, replicas=1)
    (replica,) = await cluster.wait_for_serving(MODEL, 1)
    original, node = str(replica["id"]), node_of(replica)
    marked_at = await cluster.last_position()

    assert await mark_fake_gpu(cluster.directory / f"state-{node}", 0, REASON) == 0

    started = await cluster.wait_for_event(
        "replica_drain_started", about(replica_id=original), after=marked_at
    )
    assert started.actor == "reconciler"
    assert started.get("reason") == f"GPU 0 of node {node} is unhealthy ({REASON})"
    placed = await cluster.wait_for_event(
        "replica_placed", about(replaces=original), after=marked_at
    )
    replacement = str(placed.get("replica_id"))
    serving = await cluster.wait_for_event(
        "replica_serving", about(replica_id=replacement), after=marked_at
    )
    stopping = await cluster.wait_for_event(
        "replica_stopping", about(replica_id=original), after=marked_at
    )
    assert stopping.position > serving.position
    (moved,) = await cluster.wait_for_serving(MODEL, 1)
    assert (str(moved["id"]), node_of(moved)) == (replacement, *set(NODES) - {node})
    drains = await cluster.events("replica_drain_started", after=marked_at)
    assert [e.get("replica_id") for e in drains] == [original]
