"""``/metrics`` read by a scraper: the admin API over a fresh PostgreSQL database, the
cluster seeded as agents, the reconciler and operators would have recorded it."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from app.admin.metrics import LiveFigures
from app.domain.decision import AUTOSCALER
from app.domain.events import (
    ModelDeclared,
    ModelScaled,
    ModelUnplaceable,
    NodeCordoned,
    NodeDisconnected,
    NodeDrainRequested,
    ReplicaDrainStarted,
    ReplicaPlaced,
    ReplicaServing,
    ShardPlacement,
)
from app.domain.model_spec import AutoscalePolicy, ModelSpec
from app.store.database import connection
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import record, seed_node, serving_admin

TOKEN = secrets.token_hex(16)
LEADER = LiveFigures(
    agents_connected=2,
    reconcile_passes=41,
    recent_pass_durations_s=[0.004, 0.002, 0.009],
    agent_handshakes_refused=7,
    agent_certificates_refused=3,
    agent_hellos_connected_elsewhere=5,
    earliest_agent_certificate_end=datetime(2027, 3, 1, tzinfo=UTC),
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(pg_store, tokens={TOKEN: "alice"}, live=lambda: LEADER) as url,
        httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {TOKEN}"}) as client,
    ):
        yield client


async def scrape(admin: httpx.AsyncClient) -> Samples:
    page = await admin.get("/metrics", headers={"authorization": ""})
    assert page.status_code == 200, page.text
    assert page.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(page.text)
        for sample in family.samples
    }


def placed(replica_id: str, node_id: str, gpu: int) -> ReplicaPlaced:
    model, number = replica_id.rsplit("-", 1)
    shard = ShardPlacement(index=0, node_id=node_id, gpus=(gpu,), port=20000 + gpu)
    return ReplicaPlaced(replica_id=replica_id, model=model, number=int(number), shards=(shard,))


async def stored_counts(store: PostgresEventStore) -> dict[str, int]:
    async with connection(store.engine) as db:
        rows = await db.fetch("SELECT type, count(*) AS n FROM events GROUP BY type")
    return {row["type"]: row["n"] for row in rows}


async def test_a_scrape_reads_the_cluster_as_the_log_and_the_leader_have_it(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    # Given a model of three replicas with one serving, one placed, and no room for a third:
    # its only connected node is draining and full, the other node is gone.
    busy, gone = f"gpu-{secrets.token_hex(3)}", f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, busy)
    await seed_node(pg_store, gone)
    await record(pg_store, f"agent:{gone}", NodeDisconnected(node_id=gone, reason="closed"))
    spec = {"command": "vllm serve {model} --port {port}", "replicas": 3}
    assert (await admin.put("/admin/v1/models/llama", json=spec)).status_code == 200
    await record(
        pg_store,
        "reconciler",
        placed("llama-1", busy, 0),
        ReplicaServing(replica_id="llama-1"),
        placed("llama-2", busy, 1),
        ModelUnplaceable(model="llama", reason="needs 1 node(s) ...", missing_replicas=1),
    )
    drain = NodeDrainRequested(node_id=busy, drain_id="drain-a", grace_s=60)
    await record(pg_store, "alice", drain)
    await record(
        pg_store,
        "reconciler",
        ReplicaDrainStarted(replica_id="llama-1", drain_id="drain-b", reason="drain requested"),
    )

    samples = await scrape(admin)

    assert samples[("llmgw_leader", ())] == 1
    assert samples[("llmgw_agents_connected", ())] == 2
    assert samples[("llmgw_agent_handshakes_refused_total", ())] == 7
    assert samples[("llmgw_agent_certificates_refused_total", ())] == 3
    assert samples[("llmgw_agent_hellos_connected_elsewhere_total", ())] == 5
    assert samples[("llmgw_agent_certificate_earliest_expiry_timestamp_seconds", ())] == (
        datetime(2027, 3, 1, tzinfo=UTC).timestamp()
    )
    assert samples[("llmgw_reconcile_passes_total", ())] == 41
    assert samples[("llmgw_reconcile_pass_duration_seconds", (("quantile", "1"),))] == 0.009
    assert samples[("llmgw_reconcile_pass_duration_seconds", (("quantile", "0.5"),))] == 0.004
    replicas = {
        labels[1][1]: value
        for (name, labels), value in samples.items()
        if name == "llmgw_replicas" and labels[0] == ("model", "llama")
    }
    assert replicas["draining"] == 1
    assert replicas["placed"] == 1
    assert replicas["serving"] == 0
    assert replicas["stopped"] == 0
    assert samples[("llmgw_nodes", (("state", "connected"),))] == 1
    assert samples[("llmgw_nodes", (("state", "disconnected"),))] == 1
    assert samples[("llmgw_drains_in_progress", ())] == 2
    assert samples[("llmgw_models_unplaceable", ())] == 1
    rejections = {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "llmgw_placement_rejections" and dict(labels)["model"] == "llama"
    }
    assert rejections["not connected"] == 1
    assert rejections["draining"] == 1
    assert rejections["not enough healthy free GPUs"] == 1
    assert rejections["cordoned"] == 0
    appended = {
        dict(labels)["type"]: value
        for (name, labels), value in samples.items()
        if name == "llmgw_events_total"
    }
    assert appended == await stored_counts(pg_store)


async def test_events_are_counted_once_across_scrapes(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    node_id = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node_id)
    first = await scrape(admin)

    await record(pg_store, "alice", NodeCordoned(node_id=node_id, reason="maintenance"))
    second = await scrape(admin)
    third = await scrape(admin)

    cordoned = ("llmgw_events_total", (("type", "node_cordoned"),))
    connected = ("llmgw_events_total", (("type", "node_connected"),))
    assert (first.get(cordoned), second[cordoned], third[cordoned]) == (None, 1, 1)
    assert first[connected] == second[connected] == third[connected] == 1


async def test_a_standby_reports_no_leader_no_agents_and_no_demand(
    pg_store: PostgresEventStore,
) -> None:
    policy = AutoscalePolicy(min_replicas=1, max_replicas=4)
    spec = ModelSpec(name="auto", command="vllm serve {model} --port {port}", autoscale=policy)
    await record(pg_store, "alice", ModelDeclared(model="auto", spec=spec))
    async with (
        serving_admin(pg_store) as url,
        httpx.AsyncClient(base_url=url) as scraper,
    ):
        samples = await scrape(scraper)

    assert samples[("llmgw_leader", ())] == 0
    assert samples[("llmgw_agents_connected", ())] == 0
    assert samples[("llmgw_agent_handshakes_refused_total", ())] == 0
    assert samples[("llmgw_agent_certificates_refused_total", ())] == 0
    assert ("llmgw_agent_certificate_earliest_expiry_timestamp_seconds", ()) not in samples
    assert samples[("llmgw_reconcile_passes_total", ())] == 0
    assert samples[("llmgw_model_desired_replicas", (("model", "auto"),))] == 1
    assert [key for key in samples if key[0] == "llmgw_model_demand"] == []
    assert [key for key in samples if key[0] == "llmgw_gateways"] == []


async def test_each_model_has_its_desired_and_serving_counts_and_the_leader_its_demand(
    pg_store: PostgresEventStore,
) -> None:
    # Given an autoscaled model the autoscaler took to 4 replicas, one of them serving, a
    # model an operator set to 2 with none serving, and a removed one.
    node_id, auto, manual, gone = (f"m-{secrets.token_hex(3)}" for _ in range(4))
    await seed_node(pg_store, node_id)
    command = "vllm serve {model} --port {port}"
    leader = LiveFigures(
        agents_connected=1,
        reconcile_passes=3,
        recent_pass_durations_s=[0.002],
        demand={auto: 13.5},
        gateways_reporting=2,
        gateways_silent=1,
    )
    async with (
        serving_admin(pg_store, tokens={TOKEN: "alice"}, live=lambda: leader) as url,
        httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {TOKEN}"}) as admin,
    ):
        for name, fields in (
            (auto, {"replicas": 1, "autoscale": {"min": 1, "max": 8}}),
            (manual, {"replicas": 2}),
            (gone, {"replicas": 1}),
        ):
            answer = await admin.put(
                f"/admin/v1/models/{name}", json={"command": command, **fields}
            )
            assert answer.status_code == 200, answer.text
        assert (await admin.delete(f"/admin/v1/models/{gone}")).status_code == 200
        await record(
            pg_store,
            "reconciler",
            placed(f"{auto}-1", node_id, 0),
            ReplicaServing(replica_id=f"{auto}-1"),
            placed(f"{manual}-1", node_id, 1),
        )
        await record(pg_store, AUTOSCALER, ModelScaled(model=auto, replicas=4, previous=1))

        samples = await scrape(admin)

    def by_model(metric: str) -> dict[str, float]:
        return {
            dict(labels)["model"]: value
            for (name, labels), value in samples.items()
            if name == metric and dict(labels)["model"] in (auto, manual, gone)
        }

    assert by_model("llmgw_model_desired_replicas") == {auto: 4, manual: 2}
    assert by_model("llmgw_model_serving_replicas") == {auto: 1, manual: 0}
    assert by_model("llmgw_model_demand") == {auto: 13.5}
    assert samples[("llmgw_gateways", (("state", "reporting"),))] == 2
    assert samples[("llmgw_gateways", (("state", "silent"),))] == 1
