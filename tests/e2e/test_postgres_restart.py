"""PostgreSQL goes away under traffic and comes back: the standalone gateway serves from
the routing table it last read, the control plane (restarted by its supervisor when it
loses the database) leads again and carries out what it is asked, and the log still holds
every event written before.

The database is a throwaway cluster of the test's own, since the test stops it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from devcluster.errors import DevDatabaseError
from devcluster.postgres import LocalPostgres, find_bindir
from tests.support.cluster import (
    Cluster,
    ClusterPki,
    GatewayProcess,
    about,
    reported_cluster,
)
from tests.support.databases import migrate_for_tests
from tests.support.postgres import LocalServer
from tests.support.traffic import Traffic, serves
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(150)

NODES = ("gpu-a", "gpu-b", "gpu-c")
MODEL = "sim"
CLIENTS = 8
BACK_WITHIN_S = 30.0
"""The supervisor restarts the server a second after it exits; it then waits for the
election, and agents may be up to about 8 s into their reconnect backoff."""


@pytest.fixture
def own_postgres() -> Iterator[LocalServer]:
    try:
        find_bindir()
    except DevDatabaseError as exc:
        pytest.skip(str(exc))
    with LocalPostgres(durable=False) as postgres:
        yield LocalServer(postgres)


@pytest_asyncio.fixture(loop_scope="session")
async def own_cluster(
    own_postgres: LocalServer, tmp_path: Path, pki: ClusterPki, request: pytest.FixtureRequest
) -> AsyncIterator[Cluster]:
    await own_postgres.create_database("llmgw")
    url = own_postgres.url("llmgw")
    await asyncio.to_thread(migrate_for_tests, url)
    async with reported_cluster(url, tmp_path, pki, request) as cluster:
        yield cluster


async def ready_says(gateway: GatewayProcess, status: int) -> bool:
    """Whether the gateway's ``/readyz`` answers ``status`` now (503: serving from its
    last snapshot because the database is away)."""
    async with httpx.AsyncClient(timeout=5.0) as http:
        try:
            return (await http.get(gateway.readyz_url)).status_code == status
        except httpx.TransportError:
            return False


async def test_the_fleet_serves_through_a_database_restart_and_loses_no_event(
    own_cluster: Cluster, own_postgres: LocalServer
) -> None:
    cluster = own_cluster
    cluster.start_server()
    await cluster.wait_for_leader()
    serving = await cluster.start_fleet(NODES, MODEL, replicas=2)
    gateway = await cluster.start_gateway()
    key = await cluster.create_key("restart-traffic", [MODEL])
    await wait_until(lambda: serves(gateway.url, key, MODEL), what="the gateway routes")

    async with (
        cluster.supervised() as exits,
        Traffic(gateway.url, key, MODEL, clients=CLIENTS) as traffic,
    ):
        await traffic.wait_for_successes(2 * CLIENTS)
        before = await cluster.events()
        term = await cluster.leadership()
        assert term is not None

        await own_postgres.stop()
        await wait_until(lambda: ready_says(gateway, 503), within_s=10.0, what="the gateway stale")
        await wait_until(lambda: bool(exits), what="the server restarted by its supervisor")
        await traffic.wait_for_successes(2 * CLIENTS)
        await own_postgres.start()

        await cluster.reconnect_database()
        await cluster.wait_for_leader(after_epoch=term.epoch, within_s=BACK_WITHIN_S)
        now = await cluster.leadership()
        assert now is not None
        for node in NODES:
            back = await cluster.wait_for_event(
                "node_connected",
                about(node_id=node),
                after=before[-1].position,
                within_s=BACK_WITHIN_S,
            )
            assert back.epoch == now.epoch, back
        await wait_until(lambda: ready_says(gateway, 200), what="the gateway fresh")
        await cluster.scale(MODEL, 3)
        await cluster.wait_for_serving(MODEL, 3, within_s=BACK_WITHIN_S)
        await traffic.wait_for_successes(2 * CLIENTS)
    traffic.assert_no_failures()
    assert exits, "the server never lost the database"

    after = await cluster.events()
    assert after[: len(before)] == before
    adopted = {e.get("replica_id") for e in after[len(before) :] if e.type == "replica_adopted"}
    assert {replica["id"] for replica in serving} <= adopted
    placed = [e for e in after if e.type == "replica_placed"]
    assert len(placed) == 3, [e.data for e in placed]
    verified = await cluster.verify_projections()
    assert verified.returncode == 0, verified.stdout + verified.stderr
