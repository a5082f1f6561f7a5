"""Replicas that ended long ago, forgotten by an operator at the admin API over PostgreSQL:
their rows leave ``replicas`` and ``shards`` (those the fold forgot long ago as well as
those it kept), the replicas not ended and those that ended since stay, their history stays
in the log, a request sent again answers as the first did, a cutoff too recent is refused,
and a rebuild of the projection from the log, a replay and a start-up from a snapshot all
give the same tables."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import httpx
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from app.clock import utc_now
from app.domain.events import (
    AnyEvent,
    EndedReplicasForgotten,
    ModelDeclared,
    ReplicaPlaced,
    ReplicaStopped,
    ShardPlacement,
    ShardStarting,
)
from app.domain.model_spec import ModelSpec
from app.domain.state import ENDED_KEPT_PER_MODEL
from app.store.postgres import PostgresEventStore
from app.store.projection import all_rows
from app.store.rebuild import rebuild
from app.store.replay import replay
from tests.integration.test_forgotten_replicas import lived_and_ended
from tests.support.admin_server import bearer_client, problem_of, record, seed_node, serving_admin
from tests.support.operator_cli import Operator

pytestmark = pytest.mark.timeout(120)

TOKEN = secrets.token_hex(16)
K = ENDED_KEPT_PER_MODEL
DAY_S = 86400.0


class Clock:
    """The store's clock: days back while the history is recorded (as the database's owner,
    whose appends the function does not hold to its clock), then now."""

    def __init__(self) -> None:
        self.back = timedelta(0)

    def __call__(self) -> datetime:
        return utc_now() - self.back


@pytest_asyncio.fixture(loop_scope="session")
async def clock() -> Clock:
    return Clock()


@pytest_asyncio.fixture(loop_scope="session")
async def store(engine: AsyncEngine, clock: Clock) -> PostgresEventStore:
    return PostgresEventStore(engine, clock=clock)


@pytest_asyncio.fixture(loop_scope="session")
async def admin(store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(store, tokens={TOKEN: "alice"}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        yield client


async def given_a_long_history(store: PostgresEventStore, clock: Clock) -> None:
    """llama: K + 3 replicas ended 40 days ago (the fold forgot three), two ended 10 days
    ago, one running; qwen: one ended 40 days ago."""
    clock.back = timedelta(days=40)
    await seed_node(store, "gpu-1")
    for model in ("llama", "qwen"):
        spec = ModelSpec(name=model, command="sim --port {port}", replicas=0)
        await record(store, "alice", ModelDeclared(model=model, spec=spec))
    for number in range(1, K + 4):
        await record(store, "reconciler", *lived_and_ended(number))
    await record(store, "reconciler", *qwen_lived_and_ended())
    clock.back = timedelta(days=10)
    for number in (K + 4, K + 5):
        await record(store, "reconciler", *lived_and_ended(number))
    clock.back = timedelta(0)
    shard = ShardPlacement(index=0, node_id="gpu-1", gpus=(1,), port=21000)
    await record(
        store,
        "reconciler",
        ReplicaPlaced(replica_id=f"llama-{K + 6}", model="llama", number=K + 6, shards=(shard,)),
    )


def qwen_lived_and_ended() -> list[AnyEvent]:
    """qwen-1, placed, up, and stopped."""
    shard = ShardPlacement(index=0, node_id="gpu-1", gpus=(1,), port=22000)
    return [
        ReplicaPlaced(replica_id="qwen-1", model="qwen", number=1, shards=(shard,)),
        ShardStarting(replica_id="qwen-1", shard_index=0, node_id="gpu-1", pid=1),
        ReplicaStopped(replica_id="qwen-1"),
    ]


async def table_ids(store: PostgresEventStore, table: str, column: str) -> set[str]:
    async with store.engine.connect() as conn:
        rows = await conn.exec_driver_sql(f"SELECT DISTINCT {column} FROM {table}")
        return {row[0] for row in rows}


async def test_replicas_ended_before_the_cutoff_leave_the_tables_and_their_history_stays(
    admin: httpx.AsyncClient, store: PostgresEventStore, clock: Clock, engine: AsyncEngine
) -> None:
    await given_a_long_history(store, clock)
    assert "llama-1" not in store.state.replicas  # the fold forgot it; its row stays
    history_before = (await admin.get("/admin/v1/history/replica/llama-1")).json()
    key = secrets.token_hex(8)

    answer = await admin.post(
        "/admin/v1/replicas/forget-ended",
        json={"older_than_s": 30 * DAY_S},
        headers={"idempotency-key": key},
    )

    assert answer.status_code == 200, answer.text
    done = answer.json()
    assert (done["forgotten"], done["models"], done["changed"]) == (
        K + 4,
        {"llama": K + 3, "qwen": 1},
        True,
    )
    kept = {f"llama-{K + 4}", f"llama-{K + 5}", f"llama-{K + 6}"}
    assert await table_ids(store, "replicas", "id") == kept
    assert await table_ids(store, "shards", "replica_id") == kept
    listed = (await admin.get("/admin/v1/replicas")).json()
    assert [r["id"] for r in listed] == sorted(kept)
    # The log keeps every event about a forgotten replica, and a page may start after one.
    history = await admin.get("/admin/v1/history/replica/llama-1")
    assert history.status_code == 200, history.text
    assert history.json() == history_before
    page = await admin.get("/admin/v1/replicas?after=llama-2&limit=1")
    assert [r["id"] for r in page.json()] == [f"llama-{K + 4}"]
    # Numbers stay taken: the model still counts every replica it created.
    model = (await admin.get("/admin/v1/models/llama")).json()
    assert model["phases"] == {"failed": (K + 5 + 1) // 2, "stopped": (K + 5) // 2, "placed": 1}
    assert store.state.models["llama"].replicas_created == K + 6
    request = (await store.read_stream("model-llama"))[-1].meta.correlation_id
    recorded = await store.read_correlated(request or "")
    assert [(type(r.event), r.stream, r.meta.actor) for r in recorded] == [
        (EndedReplicasForgotten, "model-llama", "alice"),
        (EndedReplicasForgotten, "model-qwen", "alice"),
    ]

    # Sent again with its key: the first answer, and nothing more recorded.
    position = await store.last_position()
    again = await admin.post(
        "/admin/v1/replicas/forget-ended",
        json={"older_than_s": 30 * DAY_S},
        headers={"idempotency-key": key},
    )
    assert again.json() == done
    assert await store.last_position() == position
    # Asked anew: nothing left to forget, nothing recorded.
    anew = await admin.post("/admin/v1/replicas/forget-ended", json={"older_than_s": 30 * DAY_S})
    assert (anew.json()["forgotten"], anew.json()["changed"]) == (0, False)
    assert await store.last_position() == position

    # A rebuild from the log, a replay and a fold from a snapshot give the same tables.
    report = await rebuild(engine, verify=True)
    assert report.differences == []
    assert all_rows(store.state) == all_rows(await replay(engine))
    assert await store.save_snapshot() is not None
    restarted = PostgresEventStore(engine)
    await restarted.catch_up()
    assert restarted.started is not None
    assert restarted.started.snapshot is not None  # started from it, not a replay
    assert all_rows(restarted.state) == all_rows(store.state)
    rewritten = await rebuild(engine, verify=False)
    assert rewritten.rows["replicas"] == len(kept)
    assert await table_ids(store, "replicas", "id") == kept


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        ({"older_than_s": 1800}, "is less than 1 hour ago"),
        ({"before": "2999-01-01T00:00:00Z"}, "is in the future"),
        ({"before": "2026-01-01T00:00:00"}, "has no UTC offset"),
        ({}, "one of them"),
        ({"before": "2026-01-01T00:00:00Z", "older_than_s": 7200}, "one of them"),
    ],
)
async def test_a_cutoff_too_recent_or_in_the_future_is_refused_and_nothing_recorded(
    admin: httpx.AsyncClient, store: PostgresEventStore, body: dict[str, object], refusal: str
) -> None:
    position = await store.last_position()

    answer = await admin.post("/admin/v1/replicas/forget-ended", json=body)

    problem = problem_of(answer, 400)
    assert problem["title"] == "invalid-cutoff"
    assert refusal in problem["detail"]
    assert "nothing was forgotten" in problem["detail"]
    assert await store.last_position() == position


async def test_an_id_placed_again_for_another_model_leaves_with_the_row_that_holds_it(
    pg_store: PostgresEventStore, engine: AsyncEngine
) -> None:
    """A log that places a replica id the fold has forgotten again, for another model (one
    only a fault could write: an id is its model's name and number). Its row holds the later
    replica, so forgetting the later one's model deletes the row; a rebuild must not bring
    back the earlier replica of that id, whose model was not forgotten."""
    await seed_node(pg_store, "gpu-1")
    for model in ("llama", "qwen"):
        spec = ModelSpec(name=model, command="sim --port {port}", replicas=0)
        await record(pg_store, "alice", ModelDeclared(model=model, spec=spec))
    for number in range(1, K + 2):  # llama-1 is forgotten by the fold
        await record(pg_store, "reconciler", *lived_and_ended(number))
    shard = ShardPlacement(index=0, node_id="gpu-1", gpus=(1,), port=22000)
    await record(
        pg_store,
        "reconciler",
        ReplicaPlaced(replica_id="llama-1", model="qwen", number=1, shards=(shard,)),
        ReplicaStopped(replica_id="llama-1"),
    )
    later = utc_now() + timedelta(days=1)

    await record(
        pg_store,
        "alice",
        EndedReplicasForgotten(model="qwen", before=later, replicas=1),
    )

    assert "llama-1" not in await table_ids(pg_store, "replicas", "id")
    assert (await rebuild(engine, verify=True)).differences == []


# -- llmgw-cli forget-ended ------------------------------------------------------------------


async def test_an_operator_forgets_ended_replicas_with_the_cli_and_reads_their_history(
    operator: Operator, pg_store: PostgresEventStore, engine: AsyncEngine, clock: Clock
) -> None:
    backdated = PostgresEventStore(engine, clock=clock)
    await given_a_long_history(backdated, clock)

    too_recent = await operator.run("forget-ended", "--before", "30m")
    forgotten = await operator.run("forget-ended", "--before", "30d")
    nothing_left = await operator.run("forget-ended", "--before", "30d", "--output", "json")

    assert too_recent.code == 1
    assert "is less than 1 hour ago" in too_recent.stderr
    assert "nothing was forgotten" in too_recent.stderr
    assert forgotten.code == 0, forgotten.stderr
    assert forgotten.stdout.startswith(f"forgot {K + 4} replica(s) that ended by ")
    assert forgotten.stdout.endswith(
        f"UTC ({K + 3} of llama, 1 of qwen); their history stays in the log\n"
    )
    assert nothing_left.code == 0, nothing_left.stderr
    assert (nothing_left.json()["forgotten"], nothing_left.json()["changed"]) == (0, False)
    listed = await operator.run("replicas", "--all", "--output", "json")
    assert [r["id"] for r in listed.json()] == [f"llama-{n}" for n in (K + 4, K + 5, K + 6)]
    history = await operator.run("history", "replica", "llama-1")
    assert history.code == 0, history.stderr
    assert "replica llama-1 failed" in history.stdout
    events = await operator.run("history", "model", "qwen")
    assert "model qwen forgot its 1 replica(s) that ended at or before" in events.stdout
    assert (await rebuild(engine, verify=True)).differences == []
