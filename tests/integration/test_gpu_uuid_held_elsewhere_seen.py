"""A GPU whose UUID another node holds, seen where an operator looks, through the real
admin API over PostgreSQL and `llmgw-cli`: `/metrics` counts it by node, `llmgw-cli nodes`
(and its JSON) lists it after the node's state, `llmgw-cli node` explains it, and a
replica already running on it keeps running while its view names the GPU and the node
that holds its UUID.

Two nodes registered as a cloned machine's would be: the second lists the first's GPU
UUID. Before, only the node's own view and explain-placement said so: no figure for an
alert, and the list and the replica looked healthy. Later, the node's view said only the
first reason a GPU took no shard (``unhealthy: ...`` hid that it was held elsewhere), its
state line left it out, and the replica list did not flag a replica on it."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from types import MappingProxyType

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.domain.events import GpuInfo, NodeConnected, NodeRegistered
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import record, seed_serving_replica
from tests.support.operator_cli import Operator

pytestmark = pytest.mark.timeout(120)

NONE: Mapping[int, str] = MappingProxyType({})


def an_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


async def register(
    store: PostgresEventStore, node_id: str, *uuids: str, unhealthy: Mapping[int, str] = NONE
) -> None:
    """``node_id`` registered and connected, listing a GPU of each UUID, in that order; each
    index in ``unhealthy`` unhealthy for its reason."""
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=uuid,
            name="H100",
            memory_total_mib=81559,
            healthy=i not in unhealthy,
            unhealthy_reason=unhealthy.get(i),
        )
        for i, uuid in enumerate(uuids)
    )
    address = "127.0.0.9"
    await record(
        store,
        f"agent:{node_id}",
        NodeRegistered(node_id=node_id, address=address, gpus=gpus),
        NodeConnected(node_id=node_id, address=address, gpus=gpus, agent_version="0.1"),
    )


async def held_elsewhere_by_node(admin_url: str) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=admin_url) as scraper:
        page = await scraper.get("/metrics")
    assert page.status_code == 200, page.text
    return {
        sample.labels["node"]: sample.value
        for family in text_string_to_metric_families(page.text)
        if family.name == "llmgw_gpus_held_elsewhere"
        for sample in family.samples
    }


async def a_clone(
    store: PostgresEventStore, unhealthy: Mapping[int, str] = NONE
) -> tuple[str, str, str]:
    """Two connected nodes, the second listing the first's GPU 0 UUID as its own GPU 0 (and
    its GPUs in ``unhealthy`` unhealthy): the holder's id, the clone's, and the shared
    UUID."""
    holder, clone = an_id("gpu"), an_id("gpu")
    shared = f"GPU-{secrets.token_hex(16)}"
    await register(store, holder, shared, f"GPU-{holder}-1")
    await register(store, clone, shared, f"GPU-{clone}-1", unhealthy=unhealthy)
    return holder, clone, shared


async def test_metrics_count_each_nodes_gpus_held_elsewhere(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    holder, clone, _ = await a_clone(pg_store)

    counted = await held_elsewhere_by_node(operator.admin_url)

    assert (counted.get(clone), counted.get(holder)) == (1, 0)


async def test_the_node_list_says_which_gpus_are_held_elsewhere(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    holder, clone, _ = await a_clone(pg_store)

    listed = await operator.run("nodes", "--output", "json")
    table = await operator.run("nodes")

    summaries = {n["id"]: n for n in listed.json()}
    assert summaries[clone].get("held_elsewhere_gpus") == [0]
    assert summaries[holder].get("held_elsewhere_gpus") == []
    assert summaries[clone]["free_gpus"] == 1
    [clone_row] = [line for line in table.stdout.splitlines() if clone in line]
    assert "connected, GPU 0 held elsewhere" in clone_row


async def test_a_replica_on_a_gpu_held_elsewhere_keeps_running_and_says_so(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    holder, clone, shared = await a_clone(pg_store)
    replica = f"{an_id('llama')}-1"
    await seed_serving_replica(pg_store, replica, clone)  # on the clone's GPU 0

    shown = await operator.run("node", clone, "--output", "json")
    answer = (await operator.run("replica", replica, "--output", "json")).json()
    told = " ".join((await operator.run("replica", replica)).stdout.split())

    reason = f"its UUID {shared} is listed by node {holder} too, connected longer"
    [shared_gpu, own_gpu] = shown.json()["gpus"]
    assert shared_gpu["excluded_because"] == (
        f"held elsewhere: {reason}; used by replica {replica}"
    )
    assert shared_gpu["used_by"] == replica
    assert own_gpu["excluded_because"] is None
    assert answer["phase"] == "serving", "the replica was disturbed"
    [shard] = answer["shards"]
    assert shard.get("gpus_held_elsewhere") == [
        {"index": 0, "uuid": shared, "held_by": holder, "reason": reason}
    ]
    assert f"held elsewhere: shard 0 on {clone}, GPU 0: {reason}" in told


async def test_every_view_of_a_gpu_held_elsewhere_says_it_beside_its_other_troubles(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    holder, clone, shared = await a_clone(pg_store, unhealthy={0: "XID 79: fell off the bus"})
    replica = f"{an_id('llama')}-1"
    await seed_serving_replica(pg_store, replica, clone)  # on the clone's GPU 0

    shown = (await operator.run("node", clone, "--output", "json")).json()
    node_table = await operator.run("node", clone)
    listed = (await operator.run("replicas", "--node", clone, "--output", "json")).json()
    replica_table = await operator.run("replicas", "--node", clone)

    reason = f"its UUID {shared} is listed by node {holder} too, connected longer"
    [shared_gpu, own_gpu] = shown["gpus"]
    assert shared_gpu["excluded_because"] == (
        f"held elsewhere: {reason}; unhealthy: XID 79: fell off the bus; used by replica {replica}"
    )
    assert (shared_gpu.get("held_elsewhere_by"), own_gpu.get("held_elsewhere_by")) == (
        holder,
        None,
    )
    [state] = [line for line in node_table.stdout.splitlines() if line.startswith("state")]
    assert state.endswith("UTC, GPU 0 held elsewhere"), state
    [summary] = listed
    assert summary.get("held_elsewhere_gpus") == {clone: [0]}
    [row] = [line for line in replica_table.stdout.splitlines() if replica in line]
    assert f"{clone} (GPU 0 held elsewhere)" in row
