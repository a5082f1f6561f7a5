"""Leader election on real PostgreSQL: one leader at a time, a standby takes over when the
leader's lock connection dies, a deposed leader's appends are fenced by the store, a
candidate whose clock is far from the database's does not lead, and a control plane leads
only while it holds leadership."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from app import bootstrap
from app.bootstrap import AgentHubConfig
from app.domain.envelope import Meta
from app.domain.events import NodeCordoned, node_stream
from app.hub.reconnects import ConnectLimits
from app.services.control_plane import ControlPlane, ControlPlaneConfig, Outcome, Role
from app.services.leader import DEFAULT_LEASE_S, LeaderElection
from app.settings import ServeSettings
from app.store.database import driver_url
from app.store.errors import FencedError, StoreUnavailable
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore, PostgresRecorder
from tests.support.fake_agents import LOOPBACK, gpu, make_pki
from tests.support.waiting import wait_until
from wire.messages import PROTOCOL_VERSION, Hello, encode

pytestmark = pytest.mark.timeout(60)

TAKEOVER_S = 5.0
FENCE_STREAM = node_stream("gpu-fence")


@pytest_asyncio.fixture(loop_scope="session")
async def candidates(database_url: str) -> AsyncIterator[tuple[LeaderElection, LeaderElection]]:
    pair = tuple(
        LeaderElection(database_url, holder, retry_interval_s=0.1, check_interval_s=0.1)
        for holder in ("server-a", "server-b")
    )
    yield pair[0], pair[1]
    for election in pair:
        await election.close()


async def terminate_backend(database_url: str, pid: int | None) -> None:
    """What an operator's ``pg_terminate_backend`` or a dropped TCP connection does."""
    assert pid is not None
    admin = await asyncpg.connect(driver_url(database_url))
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()


async def leadership_row(database_url: str) -> tuple[int, str]:
    conn = await asyncpg.connect(driver_url(database_url))
    try:
        row = await conn.fetchrow("SELECT epoch, holder FROM leadership WHERE id = 1")
    finally:
        await conn.close()
    assert row is not None
    return row["epoch"], row["holder"]


async def read_until_closed(websocket: ClientConnection) -> None:
    while True:
        await websocket.recv()


def cordon(n: int, epoch: int) -> list[NewEvent]:
    return [NewEvent(NodeCordoned(node_id="gpu-fence", reason=f"write {n} of epoch {epoch}"))]


async def test_one_candidate_leads_and_the_other_takes_over_when_its_lock_connection_dies(
    candidates: tuple[LeaderElection, LeaderElection], database_url: str
) -> None:
    first, second = candidates
    acquiring = {
        asyncio.create_task(first.acquire()): first,
        asyncio.create_task(second.acquire()): second,
    }
    done, pending = await asyncio.wait(
        acquiring, timeout=TAKEOVER_S, return_when=asyncio.FIRST_COMPLETED
    )
    [won] = done
    [waiting] = pending
    leader, standby = acquiring[won], acquiring[waiting]
    epoch = won.result()
    try:
        assert await leadership_row(database_url) == (epoch, leader.holder_id)
        # The standby keeps asking, and keeps being refused.
        asked = standby.tries
        await wait_until(lambda: standby.tries >= asked + 3, what="three more refused tries")
        assert not waiting.done()
        assert [leader.leading, standby.leading] == [True, False]

        await terminate_backend(database_url, leader.backend_pid)

        reason = await asyncio.wait_for(leader.lost(), TAKEOVER_S)
        assert "leader lock" in reason
        assert await asyncio.wait_for(waiting, TAKEOVER_S) == epoch + 1
        assert [leader.leading, standby.leading] == [False, True]
        assert await leadership_row(database_url) == (epoch + 1, standby.holder_id)
    finally:
        waiting.cancel()


def skewed_election(database_url: str, holder: str, skew_s: list[float]) -> LeaderElection:
    """A candidate on a machine whose clock is ``skew_s[0]`` ahead of the database's (the
    test's machine is the database's)."""
    return LeaderElection(
        database_url,
        holder,
        retry_interval_s=0.1,
        check_interval_s=0.1,
        wall_clock=lambda: time.time() + skew_s[0],
    )


async def test_a_candidate_whose_clock_is_hours_ahead_stands_aside_for_one_whose_clock_is_right(
    candidates: tuple[LeaderElection, LeaderElection], database_url: str
) -> None:
    """It would win the lock and then append nothing: the database refuses events whose
    time is more than a minute from its clock."""
    good, _ = candidates
    fast = skewed_election(database_url, "server-fast", [7200.0])
    with capture_logs() as logs:
        fast_acquiring = asyncio.create_task(fast.acquire())
        try:
            await wait_until(lambda: fast.tries >= 3, what="three tries by the fast clock")
            assert not fast_acquiring.done()
            assert await asyncio.wait_for(good.acquire(), TAKEOVER_S) >= 1
            assert (await leadership_row(database_url))[1] == good.holder_id
        finally:
            fast_acquiring.cancel()
            await fast.close()
    warnings = [line for line in logs if line["event"] == "leader_clock_off"]
    assert len(warnings) == 1, "said once a minute, not on every try"
    assert "clock is 7200.0 s ahead of the database's" in warnings[0]["problem"]


async def test_a_leader_whose_clock_is_set_two_minutes_back_gives_up_to_a_standby(
    database_url: str,
) -> None:
    skew_s = [0.0]
    leader = skewed_election(database_url, "server-stepped", skew_s)
    standby = skewed_election(database_url, "server-steady", [0.0])
    epoch = await asyncio.wait_for(leader.acquire(), TAKEOVER_S)
    standing_by = asyncio.create_task(standby.acquire())
    try:
        await wait_until(lambda: standby.tries >= 2, what="the standby asking")

        skew_s[0] = -120.0
        reason = await asyncio.wait_for(leader.lost(), TAKEOVER_S)
        assert "clock is 120.0 s behind the database's" in reason
        assert await asyncio.wait_for(standing_by, TAKEOVER_S) == epoch + 1
    finally:
        standing_by.cancel()
        await leader.close()
        await standby.close()


async def test_a_deposed_leader_is_fenced_and_none_of_its_events_land_after_the_new_ones(
    candidates: tuple[LeaderElection, LeaderElection], database_url: str, engine: AsyncEngine
) -> None:
    old, new = candidates
    old_epoch = await old.acquire()
    old_store, new_store = PostgresEventStore(engine), PostgresEventStore(engine)
    written = 0

    async def old_leader_keeps_writing() -> None:
        # As a deposed leader that has not noticed yet would, through its pooled connections.
        nonlocal written
        while True:
            meta = Meta(actor="reconciler", epoch=old_epoch)
            await old_store.append(FENCE_STREAM, None, cordon(written, old_epoch), meta)
            written += 1

    writer = asyncio.create_task(old_leader_keeps_writing())
    acquiring = asyncio.create_task(new.acquire())
    try:
        await wait_until(lambda: written >= 3, what="the old leader writing")

        await terminate_backend(database_url, old.backend_pid)
        new_epoch = await asyncio.wait_for(acquiring, TAKEOVER_S)
        assert new_epoch == old_epoch + 1
        await new_store.append(
            FENCE_STREAM, None, cordon(0, new_epoch), Meta(actor="reconciler", epoch=new_epoch)
        )

        with pytest.raises(FencedError, match=f"superseded by epoch {new_epoch}"):
            await asyncio.wait_for(writer, TAKEOVER_S)
        late = Meta(actor="reconciler", epoch=old_epoch)
        with pytest.raises(FencedError):
            await old_store.append(FENCE_STREAM, None, cordon(written, old_epoch), late)
    finally:
        writer.cancel()
        acquiring.cancel()

    recorded = await new_store.read_stream(FENCE_STREAM)
    old_positions = [r.position for r in recorded if r.meta.epoch == old_epoch]
    new_positions = [r.position for r in recorded if r.meta.epoch == new_epoch]
    assert len(old_positions) == written
    assert len(new_positions) == 1
    assert max(old_positions) < min(new_positions)


async def test_a_control_plane_stands_by_leads_when_the_leader_stops_and_exits_when_deposed(
    candidates: tuple[LeaderElection, LeaderElection],
    database_url: str,
    engine: AsyncEngine,
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path)

    def control_plane(election: LeaderElection) -> ControlPlane:
        config = ControlPlaneConfig(
            server_id=election.holder_id,
            agent_host=LOOPBACK,
            agent_port=0,
            reconcile_interval_s=0.2,
        )
        hub = AgentHubConfig(tls=pki.server_context())
        store = PostgresEventStore(engine)
        return bootstrap.control_plane(store, database_url, config, hub, election=election)

    first_election, second_election = candidates
    first, second = control_plane(first_election), control_plane(second_election)
    stop_first, stop_second = asyncio.Event(), asyncio.Event()
    first_run = asyncio.create_task(first.run(stop_first))
    second_run: asyncio.Task[Outcome] | None = None
    try:
        await wait_until(lambda: first.role is Role.LEADER, what="the first leading")
        second_run = asyncio.create_task(second.run(stop_second))
        await wait_until(lambda: second_election.tries >= 3, what="the second asking")
        assert (second.role, second.leader) == (Role.STANDBY, None)

        stop_first.set()
        assert await asyncio.wait_for(first_run, TAKEOVER_S) is Outcome.STOPPED
        await wait_until(lambda: second.role is Role.LEADER, what="the second leading")
        assert [first_election.epoch, second_election.epoch] == [1, 2]

        await terminate_backend(database_url, second_election.backend_pid)
        assert await asyncio.wait_for(second_run, TAKEOVER_S) is Outcome.DEPOSED
        assert second.role is Role.STOPPED
    finally:
        stop_first.set()
        stop_second.set()
        await asyncio.gather(
            first_run, *([second_run] if second_run else []), return_exceptions=True
        )


async def test_serve_s_leader_lease_bounds_its_lock_session_and_its_pool_s_transactions(
    database_url: str, tmp_path: Path
) -> None:
    """``--leader-lease`` reaches both places a frozen server would hold others up: the
    election (its lock's session ends after the lease idle) and the idle transactions of
    serve's pool."""
    make_pki(tmp_path)
    settings = ServeSettings(
        database_url=database_url,
        tls_cert=tmp_path / "server.crt",
        tls_key=tmp_path / "server.key",
        tls_ca=tmp_path / "ca.crt",
        gateway=False,
        leader_lease=7.5,
    )
    server = bootstrap.Server.from_settings(settings)
    election = server.election()
    engine = server.database_engine()
    try:
        async with engine.connect() as connection:
            pooled = await connection.exec_driver_sql("SHOW idle_in_transaction_session_timeout")
            pool_setting = pooled.scalar_one()
    finally:
        await engine.dispose()
    assert election.lease_s == 7.5
    assert pool_setting == "7500ms"


def test_serve_s_connect_budget_flags_reach_its_agent_hub(
    database_url: str, tmp_path: Path
) -> None:
    make_pki(tmp_path)
    settings = ServeSettings(
        database_url=database_url,
        tls_cert=tmp_path / "server.crt",
        tls_key=tmp_path / "server.key",
        tls_ca=tmp_path / "ca.crt",
        gateway=False,
        agent_connect_burst=3,
        agent_connects_per_minute=0.5,
    )
    server = bootstrap.Server.from_settings(settings)

    assert server.agent_hub.connects == ConnectLimits(burst=3, per_minute=0.5)


async def test_a_leader_frozen_inside_its_append_transaction_does_not_stop_the_next_appending(
    candidates: tuple[LeaderElection, LeaderElection], database_url: str
) -> None:
    """A leader that must catch up before it appends does so in a transaction that holds the
    append lock; frozen there (SIGSTOP between two statements), its session sits idle in
    that transaction. The new leader's appends take the same lock: they wait only until the
    frozen session's transaction has been idle for the lease, not for as long as it stays
    frozen."""
    old, new = candidates
    old_epoch = await old.acquire()
    old_engine = bootstrap.control_plane_engine(database_url)
    new_store = PostgresEventStore(bootstrap.control_plane_engine(database_url))
    holding = asyncio.Event()
    thawed = asyncio.Event()

    async def old_leader_freezes_holding_the_append_lock() -> None:
        async with PostgresRecorder(old_engine).session() as session, session.exclusive():
            holding.set()
            await thawed.wait()

    frozen = asyncio.create_task(old_leader_freezes_holding_the_append_lock())
    try:
        await wait_until(holding.is_set, what="the old leader holding the append lock")
        await terminate_backend(database_url, old.backend_pid)  # its lease ran out
        new_epoch = await asyncio.wait_for(new.acquire(), TAKEOVER_S)
        assert new_epoch == old_epoch + 1

        meta = Meta(actor="reconciler", epoch=new_epoch)
        appending = new_store.append(FENCE_STREAM, None, cordon(0, new_epoch), meta)
        recorded = await asyncio.wait_for(appending, DEFAULT_LEASE_S + TAKEOVER_S)
        assert [r.meta.epoch for r in recorded] == [new_epoch]

        thawed.set()
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(frozen, TAKEOVER_S)
    finally:
        thawed.set()
        frozen.cancel()
        await asyncio.gather(frozen, return_exceptions=True)
        await old_engine.dispose()
        await new_store.engine.dispose()


async def test_a_deposed_leader_sends_its_agents_elsewhere_and_logs_one_line(
    candidates: tuple[LeaderElection, LeaderElection],
    database_url: str,
    engine: AsyncEngine,
    tmp_path: Path,
) -> None:
    """A leader whose term another took over (here: the epoch moved on in the database, as
    a new leader's election does) learns it from its next append, an agent's hello. That
    agent is told to try another server (1013, try again later), and the log says so in one
    line, not with a traceback of the fencing and an "internal error" to the agent."""
    pki = make_pki(tmp_path)
    election = candidates[0]
    config = ControlPlaneConfig(
        server_id=election.holder_id, agent_host=LOOPBACK, agent_port=0, reconcile_interval_s=0.2
    )
    hub = AgentHubConfig(tls=pki.server_context())
    plane = bootstrap.control_plane(
        PostgresEventStore(engine), database_url, config, hub, election=election
    )
    stop = asyncio.Event()
    running = asyncio.create_task(plane.run(stop))
    hello = Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id="gpu-late",
        agent_version="test",
        address=LOOPBACK,
        port_range=(20000, 20099),
        gpus=(gpu(0),),
        shards=(),
    )
    try:
        await wait_until(lambda: plane.role is Role.LEADER, what="the control plane leading")
        assert plane.leader is not None
        port = plane.leader.hub.port
        owner = await asyncpg.connect(driver_url(database_url))
        try:
            await owner.execute("UPDATE leadership SET epoch = epoch + 1 WHERE id = 1")
        finally:
            await owner.close()
        with capture_logs() as logs:
            async with connect(
                f"wss://{LOOPBACK}:{port}", ssl=pki.node("gpu-late"), open_timeout=TAKEOVER_S
            ) as websocket:
                await websocket.send(encode(hello), text=True)
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(read_until_closed(websocket), TAKEOVER_S)
            assert await asyncio.wait_for(running, TAKEOVER_S) is Outcome.DEPOSED
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == CloseCode.TRY_AGAIN_LATER
        assert "no longer leads" in closed.value.rcvd.reason
        events = [entry["event"] for entry in logs]
        assert "agent_connection_failed" not in events
        assert events.count("agent_connection_closed_deposed") == 1
    finally:
        stop.set()
        await asyncio.gather(running, return_exceptions=True)
