"""PostgreSQL fails over under a live cluster: the primary is SIGKILLed and its hot standby
promoted, as Patroni or a managed service does. Servers and gateways are given both hosts
in one libpq URL (``target_session_attrs=read-write``) and find the new primary by
themselves.

- Synchronous replication: nothing acknowledged is lost; the projections rebuild to what
  they hold; an append of the old leader's epoch is still refused; the gateway serves from
  its last routing table throughout and picks up what changes after the promotion.
- Asynchronous replication, with the standby cut off before the last events: the server
  that takes over finds the log behind the fold it kept, builds its fold again from the
  database, and the agents' reports settle what runs: the engine started by events the new
  primary never saw is stopped as a stray, its replica id is never handed out again, and
  no shard ends up with two engines.

Each test runs its own primary and standby (``tests.support.replication``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from app.domain.envelope import Meta
from app.domain.events import NodeCordoned, node_stream
from app.store.database import create_engine
from app.store.errors import FencedError
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from devcluster.errors import DevDatabaseError
from devcluster.postgres import find_bindir
from tests.support.cluster import ClusterPki, about, reported_cluster
from tests.support.databases import migrate_for_tests, runtime_url
from tests.support.replication import ReplicatedPostgres
from tests.support.traffic import Traffic, serves
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(150), pytest.mark.serial]  # kills and promotes under load

NODES = ("gpu-a", "gpu-b", "gpu-c")
MODEL = "sim"
CLIENTS = 4
BACK_WITHIN_S = 30.0
"""The supervisor restarts the deposed server a second after it exits; agents may be up to
a few seconds into their reconnect backoff."""


async def replicated(synchronous: bool) -> AsyncIterator[ReplicatedPostgres]:
    try:
        find_bindir()
    except DevDatabaseError as exc:
        pytest.skip(str(exc))
    async with ReplicatedPostgres(synchronous=synchronous) as pair:
        connection_url = pair.primary_url()
        await _create_database(connection_url, "llmgw")
        await asyncio.to_thread(migrate_for_tests, pair.url("llmgw"))  # both hosts
        yield pair


async def _create_database(admin_url: str, name: str) -> None:
    connection = await asyncpg.connect(admin_url)
    try:
        await connection.execute(f"CREATE DATABASE {name}")
    finally:
        await connection.close()


@pytest_asyncio.fixture(loop_scope="session")
async def synchronous_pair() -> AsyncIterator[ReplicatedPostgres]:
    async for pair in replicated(synchronous=True):
        yield pair


@pytest_asyncio.fixture(loop_scope="session")
async def asynchronous_pair() -> AsyncIterator[ReplicatedPostgres]:
    async for pair in replicated(synchronous=False):
        yield pair


async def old_epoch_refused(url: str, epoch: int) -> None:
    """An append stamped with ``epoch`` (the leader's before the failover) is fenced."""
    engine = create_engine(runtime_url(url), pool_size=1)
    try:
        store = PostgresEventStore(engine, policy=None)
        late = [NewEvent(NodeCordoned(node_id="gpu-fence", reason="the old leader, late"))]
        with pytest.raises(FencedError):
            await store.append(
                node_stream("gpu-fence"), None, late, Meta(actor="reconciler", epoch=epoch)
            )
    finally:
        await engine.dispose()


async def test_a_synchronous_failover_loses_nothing_acknowledged(
    synchronous_pair: ReplicatedPostgres,
    tmp_path: Path,
    pki: ClusterPki,
    request: pytest.FixtureRequest,
) -> None:
    url = synchronous_pair.url("llmgw")
    async with reported_cluster(url, tmp_path, pki, request) as cluster:
        cluster.start_server()
        await cluster.wait_for_leader()
        await cluster.start_fleet(NODES, MODEL, replicas=2)
        gateway = await cluster.start_gateway()
        key = await cluster.create_key("failover-traffic", [MODEL])
        await wait_until(lambda: serves(gateway.url, key, MODEL), what="the gateway routes")

        async with (
            cluster.supervised() as exits,
            Traffic(gateway.url, key, MODEL, clients=CLIENTS) as traffic,
        ):
            await traffic.wait_for_successes(2 * CLIENTS)
            await cluster.scale(MODEL, 3)  # answered: its events must survive the failover
            acknowledged = await cluster.events()
            term = await cluster.leadership()
            assert term is not None

            await synchronous_pair.kill_primary()
            await traffic.wait_for_successes(2 * CLIENTS)  # from the last routing table
            await synchronous_pair.promote_standby()

            await cluster.reconnect_database()
            await cluster.wait_for_leader(after_epoch=term.epoch, within_s=BACK_WITHIN_S)
            assert (await cluster.events())[: len(acknowledged)] == acknowledged
            await cluster.wait_for_serving(MODEL, 3, within_s=BACK_WITHIN_S)
            later_key = await cluster.create_key("after-promotion", [MODEL])
            await wait_until(
                lambda: serves(gateway.url, later_key, MODEL),
                within_s=BACK_WITHIN_S,
                what="the gateway reading the promoted primary",
            )
            await traffic.wait_for_successes(2 * CLIENTS)
        traffic.assert_no_failures()
        assert exits, "the leader never lost its primary"

        await old_epoch_refused(url, term.epoch)
        verified = await cluster.verify_projections()
        assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_an_asynchronous_failover_is_settled_by_what_the_agents_report(
    asynchronous_pair: ReplicatedPostgres,
    tmp_path: Path,
    pki: ClusterPki,
    request: pytest.FixtureRequest,
) -> None:
    pair = asynchronous_pair
    url = pair.url("llmgw")
    async with reported_cluster(url, tmp_path, pki, request) as cluster:
        leader = cluster.start_server()
        await cluster.wait_for_leader()
        standby = cluster.start_server()
        await cluster.wait_until_serving_admin(standby)
        first = {str(r["id"]) for r in await cluster.start_fleet(NODES, MODEL, replicas=2)}
        kept = await cluster.last_position()
        replicated = await cluster.events()

        await pair.cut_replication()
        await cluster.scale(MODEL, 3)
        (lost,) = [r for r in await cluster.wait_for_serving(MODEL, 3) if r["id"] not in first]
        lost_events = await cluster.events(after=kept)
        lost_starts = [e for e in lost_events if e.type == "shard_starting"]
        assert [e.get("replica_id") for e in lost_starts] == [lost["id"]], lost_events
        # The standby server's fold reads the events the new primary will never have.
        assert len(await cluster.replicas(via=standby, model=MODEL)) == 3

        await pair.kill_primary()
        await pair.promote_standby()
        await cluster.reconnect_database()
        promoted = await cluster.events()
        assert promoted[: len(replicated)] == replicated
        about_lost = [e for e in promoted if e.get("replica_id") == lost["id"]]
        assert {e.type for e in about_lost} <= {"stray_stopped"}, "the standby lost nothing"

        successor = await cluster.wait_for_leader(after_epoch=0, within_s=BACK_WITHIN_S)
        assert successor is standby, "the old leader exits when it loses its primary"
        await wait_until(leader.exited, within_s=BACK_WITHIN_S, what="the old leader gone")
        stray = await cluster.wait_for_event(
            "stray_stopped", about(replica_id=lost["id"]), after=kept, within_s=BACK_WITHIN_S
        )
        assert "fold_ahead_of_log" in cluster.logs()
        pid = stray.get("pid")
        assert isinstance(pid, int)
        await wait_until(lambda: not _runs(pid), within_s=BACK_WITHIN_S, what="the stray gone")

        serving = await cluster.wait_for_serving(MODEL, 2, within_s=BACK_WITHIN_S)
        await cluster.scale(MODEL, 3, via=successor)
        serving = await cluster.wait_for_serving(MODEL, 3, within_s=BACK_WITHIN_S)
        ids = {str(r["id"]) for r in serving}
        assert lost["id"] not in ids, "a replica id from the lost events was handed out again"
        shards = [(str(r["id"]), tuple(r["nodes"])) for r in serving]  # type: ignore[arg-type]
        assert len(shards) == len(set(shards)) == 3
        placed = [e.get("replica_id") for e in await cluster.events("replica_placed")]
        assert len(placed) == len(set(placed)) == 3, placed

        verified = await cluster.verify_projections()
        assert verified.returncode == 0, verified.stdout + verified.stderr


def _runs(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
