"""A rollout's canary step, from the log to the gateway's routing table in PostgreSQL: the
``models`` row carries the canary's revision and share while the step runs (and NULLs
before and after), the ``routing_table`` view each route's revision, a rebuild from the
log agrees, and a gateway's snapshot source, connected as the runtime role as every
gateway is, hands the split to its router as soon as the step starts. Last, a real
``llmgw-server gateway`` in front of two engines sends a canary of share 1 every request,
and the model's first replica again once the rollout is over."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from agent.simulator.launcher import start_simulator
from app.domain.events import ModelDeclared, RolloutFinished, RolloutStarted, RolloutStepStarted
from app.domain.model_spec import CanaryStep, ModelSpec, RolloutPolicy
from app.domain.revisions import SpecChange
from app.gateway.source import PostgresSnapshotSource
from app.gateway.table import Canary, GatewaySnapshot
from app.services.operations import Caller, Operations
from app.store.database import connection
from app.store.gateway_reports import TrafficReports
from app.store.postgres import PostgresEventStore
from app.store.rebuild import rebuild
from tests.support.admin_server import record
from tests.support.databases import runtime_url
from tests.support.gateway_process import FAST_SCRAPE, gateway_process
from tests.support.ports import free_port
from tests.support.routing import connect_node, serve_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

SHARE = 0.1


@pytest_asyncio.fixture(loop_scope="session")
async def source(database_url: str) -> AsyncIterator[PostgresSnapshotSource]:
    source = PostgresSnapshotSource(
        runtime_url(database_url), gateway_id=f"gw-{secrets.token_hex(4)}"
    )
    await source.start()
    assert source.fresh(), source.stale_reason()
    yield source
    await source.close()


def specs(name: str) -> tuple[ModelSpec, ModelSpec]:
    """Revision 1 and 2 of a model whose rollout sends 10 % to one new replica first."""
    policy = RolloutPolicy(steps=(CanaryStep(replicas=1, traffic=SHARE, hold_s=600.0),))
    first = ModelSpec(
        name=name, command="sim --port {port} --model {model}", replicas=2, rollout=policy
    )
    return first, ModelSpec(
        name=name, command=f"{first.command} --fast", replicas=2, rollout=policy
    )


async def canary_columns(store: PostgresEventStore, name: str) -> tuple[object, object]:
    async with connection(store.engine) as db:
        row = await db.fetchrow(
            "SELECT canary_revision, canary_traffic FROM models WHERE name = $1", name
        )
    assert row is not None
    return row["canary_revision"], row["canary_traffic"]


async def test_a_canary_step_reaches_the_models_row_and_every_gateways_routing_table(
    pg_store: PostgresEventStore, source: PostgresSnapshotSource
) -> None:
    name = f"m{secrets.token_hex(3)}"
    rollout_id = f"rollout-{name}-r2"
    first, second = specs(name)
    seen: list[GatewaySnapshot] = []
    source.subscribe(seen.append)
    await connect_node(pg_store, "gpu-1", "127.0.0.1")
    await record(pg_store, "alice", ModelDeclared(model=name, spec=first))
    stable = [await serve_replica(pg_store, name, n, "gpu-1", 21000 + n) for n in (1, 2)]
    await wait_until(lambda: len(source.current().routes.get(name, ())) == 2, within_s=2.0)
    assert await canary_columns(pg_store, name) == (None, None)
    assert name not in source.current().canaries

    # Given revision 2 and its rollout, when its first step starts: the split is on, though
    # no route changed yet (no replica of revision 2 serves).
    change = SpecChange(field="command", old=first.command, new=second.command)
    await record(
        pg_store,
        "alice",
        ModelDeclared(model=name, spec=second, revision=2, changes=(change,)),
        RolloutStarted(model=name, rollout_id=rollout_id, revision=2, from_revision=1),
    )
    assert await canary_columns(pg_store, name) == (None, None)  # no step has started yet
    step = RolloutStepStarted(
        model=name, rollout_id=rollout_id, step=0, replicas=1, traffic=SHARE, hold_s=600.0
    )
    await record(pg_store, "reconciler", step, correlation_id=rollout_id)

    assert await canary_columns(pg_store, name) == (2, SHARE)
    await wait_until(
        lambda: bool(seen) and name in seen[-1].canaries,
        within_s=2.0,
        what="a snapshot with the canary handed to the gateway's listeners",
    )
    assert seen[-1].canaries[name] == Canary(revision=2, share=SHARE)

    canary = await serve_replica(pg_store, name, 3, "gpu-1", 21003, revision=2)
    await wait_until(lambda: len(source.current().routes.get(name, ())) == 3, within_s=2.0)
    routes = source.current().routes[name]
    assert [(r.replica_id, r.revision) for r in routes] == [
        (stable[0], 1),
        (stable[1], 1),
        (canary, 2),
    ]
    async with connection(pg_store.engine) as db:
        viewed = await db.fetch(
            "SELECT replica_id, revision FROM routing_table WHERE model = $1 ORDER BY 1", name
        )
    assert [tuple(r) for r in viewed] == [(stable[0], 1), (stable[1], 1), (canary, 2)]
    assert (await rebuild(pg_store.engine, verify=True)).differences == []

    # When the rollout finishes, the split is off again, in the table and in the gateway.
    finished = RolloutFinished(
        model=name, rollout_id=rollout_id, succeeded=True, outcome="every replica runs r2"
    )
    await record(pg_store, "reconciler", finished, correlation_id=rollout_id)

    assert await canary_columns(pg_store, name) == (None, None)
    await wait_until(
        lambda: name not in seen[-1].canaries,
        within_s=2.0,
        what="a snapshot without the canary handed to the gateway's listeners",
    )
    assert (await rebuild(pg_store.engine, verify=True)).differences == []


async def test_a_rebuild_writes_the_canary_columns_as_the_appends_did(
    pg_store: PostgresEventStore,
) -> None:
    name = f"m{secrets.token_hex(3)}"
    rollout_id = f"rollout-{name}-r2"
    first, second = specs(name)
    await record(pg_store, "alice", ModelDeclared(model=name, spec=first))
    await record(
        pg_store,
        "alice",
        ModelDeclared(model=name, spec=second, revision=2),
        RolloutStarted(model=name, rollout_id=rollout_id, revision=2, from_revision=1),
        RolloutStepStarted(model=name, rollout_id=rollout_id, step=0, replicas=1, traffic=SHARE),
    )
    async with connection(pg_store.engine) as db:
        await db.execute(
            "UPDATE models SET canary_revision = NULL, canary_traffic = 0.5 WHERE name = $1", name
        )

    verified = await rebuild(pg_store.engine, verify=True)
    rewritten = await rebuild(pg_store.engine, verify=False)

    assert {(d.table, d.key, d.problem) for d in verified.differences} == {
        ("models", name, "differs")
    }
    [difference] = verified.differences
    assert difference.columns == {"canary_revision": (None, 2), "canary_traffic": (0.5, SHARE)}
    assert rewritten.differences == []
    assert await canary_columns(pg_store, name) == (2, SHARE)


async def test_a_gateway_process_sends_a_canary_of_share_1_every_request(
    pg_store: PostgresEventStore, database_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    name = f"m{secrets.token_hex(3)}"
    rollout_id = f"rollout-{name}-r2"
    first, second = specs(name)
    whole = CanaryStep(replicas=1, traffic=1.0)
    second = msgspec.structs.replace(second, rollout=RolloutPolicy(steps=(whole,)))
    reports = TrafficReports(engine)
    with (
        start_simulator("--model", name) as old_engine,
        start_simulator("--model", name) as new_engine,
    ):
        old_engine.wait_healthy()
        new_engine.wait_healthy()
        await connect_node(pg_store, "gpu-1", "127.0.0.1")
        await record(pg_store, "alice", ModelDeclared(model=name, spec=first))
        old = await serve_replica(pg_store, name, 1, "gpu-1", old_engine.port)
        await record(
            pg_store,
            "alice",
            ModelDeclared(model=name, spec=second, revision=2),
            RolloutStarted(model=name, rollout_id=rollout_id, revision=2, from_revision=1),
            RolloutStepStarted(model=name, rollout_id=rollout_id, step=0, replicas=1, traffic=1.0),
        )
        new = await serve_replica(pg_store, name, 2, "gpu-1", new_engine.port, revision=2)
        key = (await Operations(pg_store).create_key(Caller(actor="alice"), "c", [name])).key
        port = free_port()
        with gateway_process(
            database_url,
            gateway_id="gw-canary",
            port=port,
            log=tmp_path / "gateway.log",
            options=FAST_SCRAPE,
        ):
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}",
                headers={"authorization": f"Bearer {key}"},
                timeout=30.0,
            ) as http:
                body = {"model": name, "prompt": "hello", "max_tokens": 4}

                async def answered() -> bool:
                    with contextlib.suppress(httpx.TransportError):
                        return (await http.post("/v1/completions", json=body)).status_code == 200
                    return False

                await wait_until(answered, within_s=20.0, what="the gateway routes")
                for _ in range(19):
                    assert (await http.post("/v1/completions", json=body)).status_code == 200

                async def counted(replica_id: str, requests: int) -> bool:
                    figures = await reports.replica_traffic(replica_id)
                    return figures is not None and figures.requests == requests

                await wait_until(lambda: counted(new, 20), within_s=10.0, what="20 on the canary")
                assert await counted(old, 0)

                # The rollout is over: no split, and the idle first replica takes requests.
                done = RolloutFinished(
                    model=name, rollout_id=rollout_id, succeeded=False, outcome="stopped"
                )
                await record(pg_store, "reconciler", done, correlation_id=rollout_id)

                async def old_answers() -> bool:
                    assert await answered()
                    figures = await reports.replica_traffic(old)
                    return figures is not None and figures.requests > 0

                await wait_until(old_answers, within_s=10.0, what="the first replica serving")
