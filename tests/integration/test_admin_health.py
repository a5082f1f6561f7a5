"""Load balancers and supervisors probing the admin API: `/healthz` says the process
answers, `/readyz` whether it can serve. Both are asked without a token, over real HTTP to
the app served by uvicorn on a loopback socket, against real PostgreSQL databases: a
migrated one, an empty one, one an older or a newer release migrated, and one that is not
there."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import httpx
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from app.admin.health import Readiness
from app.store import migrate
from app.store.database import create_engine
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import serving_admin
from tests.support.ports import free_port
from tests.support.postgres import PostgresServer, unique_database_name

LOOPBACK = "127.0.0.1"


class ControlPlaneRole:
    """What the control plane's ``role`` attribute reads, changed as an election would."""

    def __init__(self, role: str) -> None:
        self.role = role

    def __call__(self) -> str:
        return self.role


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def probing(readiness: Readiness) -> AsyncIterator[httpx.AsyncClient]:
    """A client without a token, of the admin API served with ``readiness``."""
    store = PostgresEventStore(readiness.engine)
    async with (
        serving_admin(store, readiness=readiness) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def empty_database(postgres_server: PostgresServer) -> AsyncIterator[str]:
    """A database nobody has migrated yet."""
    name = unique_database_name("llmgw_empty")
    await postgres_server.create_database(name)
    yield postgres_server.url(name)
    await postgres_server.drop_database(name)


@asynccontextmanager
async def engine_for(url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(url, pool_size=2)
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_a_running_process_is_healthy_without_a_token(engine: AsyncEngine) -> None:
    async with probing(Readiness(engine)) as probe:
        answer = await probe.get("/healthz")

    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}


async def test_a_standby_on_a_migrated_database_is_ready_and_says_its_role(
    engine: AsyncEngine,
) -> None:
    control_plane = ControlPlaneRole("standby")
    async with probing(Readiness(engine, role=control_plane)) as probe:
        as_standby = await probe.get("/readyz")
        control_plane.role = "leader"
        as_leader = await probe.get("/readyz")

    assert as_standby.status_code == 200
    body = as_standby.json()
    assert (body["ready"], body["role"], body["failing"]) == (True, "standby", [])
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["migrations"] == {
        "ok": True,
        "detail": f"at revision {migrate.head_revision()}",
    }
    assert as_leader.status_code == 200
    assert as_leader.json()["role"] == "leader"


@pytest.mark.parametrize("off_s", [7200.0, -7200.0, 120.0])
async def test_a_server_whose_clock_is_far_from_the_database_s_is_not_ready_saying_how_far(
    engine: AsyncEngine, off_s: float
) -> None:
    """Its every write would be refused (the database takes no events more than 60 s from
    its clock): a load balancer should send operators to another server."""
    skewed = Readiness(engine, wall_clock=lambda: time.time() + off_s)
    async with probing(skewed) as probe, probing(Readiness(engine)) as right:
        answer = await probe.get("/readyz")
        in_step = await right.get("/readyz")

    assert answer.status_code == 503
    body = answer.json()
    assert (body["ready"], body["failing"]) == (False, ["clock"])
    side = "ahead of" if off_s > 0 else "behind"
    assert f"clock is {abs(off_s):.1f} s {side} the database's" in body["checks"]["clock"]["detail"]
    assert in_step.status_code == 200
    assert in_step.json()["checks"]["clock"]["ok"] is True
    assert in_step.json()["checks"]["clock"]["detail"].endswith(" s from the database's")


async def test_an_unmigrated_database_is_not_ready_until_the_revision_is_read_again(
    empty_database: str,
) -> None:
    clock = ManualClock()
    async with (
        engine_for(empty_database) as engine,
        probing(Readiness(engine, revision_ttl_s=5, clock=clock)) as probe,
    ):
        before = await probe.get("/readyz")
        await asyncio.to_thread(migrate.upgrade, empty_database)
        while_cached = await probe.get("/readyz")
        clock.now += 5
        after_the_cache_expired = await probe.get("/readyz")

    assert before.status_code == 503
    body = before.json()
    assert (body["ready"], body["failing"]) == (False, ["migrations"])
    assert body["checks"]["database"]["ok"] is True
    assert "schema at revision (none)" in body["checks"]["migrations"]["detail"]
    assert while_cached.status_code == 503, "the revision is read at most every 5 s"
    assert after_the_cache_expired.status_code == 200


async def _set_revision(url: str, revision: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute("UPDATE alembic_version SET version_num = $1", revision)
    finally:
        await connection.close()


@pytest.mark.parametrize(
    ("revision", "advice"),
    [
        (
            None,
            "the database is not migrated; `llmgw-server migrate` of this release brings it there",
        ),
        ("0016", "`llmgw-server migrate` of this release upgrades it"),
        ("0099", "a newer llmgw release migrated it; run that release"),
    ],
    ids=["missing", "older", "newer"],
)
async def test_a_schema_of_another_release_is_not_ready_with_what_to_do_about_it(
    empty_database: str, revision: str | None, advice: str
) -> None:
    """A schema a newer release migrated used to get the advice to run ``migrate``, which
    cannot take it back."""
    if revision is not None:
        await asyncio.to_thread(migrate.upgrade, empty_database)
        await _set_revision(empty_database, revision)
    async with engine_for(empty_database) as engine, probing(Readiness(engine)) as probe:
        readiness = await probe.get("/readyz")

    assert readiness.status_code == 503
    body = readiness.json()
    assert (body["ready"], body["failing"]) == (False, ["migrations"])
    assert body["checks"]["migrations"] == {
        "ok": False,
        "detail": f"schema at revision {revision or '(none)'}, this server needs "
        f"{migrate.head_revision()} ({advice})",
    }


async def test_an_unreachable_database_is_not_ready_and_is_named() -> None:
    url = f"postgresql://llmgw@{LOOPBACK}:{free_port()}/llmgw"
    async with engine_for(url) as engine, probing(Readiness(engine, timeout_s=5)) as probe:
        health = await probe.get("/healthz")
        readiness = await probe.get("/readyz")

    assert health.status_code == 200, "the process itself still answers"
    assert readiness.status_code == 503
    body = readiness.json()
    assert (body["ready"], body["failing"]) == (False, ["database"])
    assert body["checks"]["database"]["ok"] is False
    assert "unreachable" in body["checks"]["database"]["detail"]
    assert "migrations" not in body["checks"]
