"""A start-up loads the newest fold snapshot it can trust and folds only the events after it;
whatever is wrong with a snapshot, it replays instead, and never starts from a wrong state."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    NodeCordoned,
    NodeRegistered,
    model_stream,
    node_stream,
)
from app.domain.model_spec import ModelSpec, RoutingSettings
from app.domain.state import ClusterState
from app.domain.tuning import InvalidTuning, tune
from app.store.database import create_engine, driver_url
from app.store.folded import FoldedEventStore, SnapshotPolicy
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore, PostgresRecorder
from app.store.projection import all_rows
from app.store.rebuild import rebuild
from app.store.replay import replay
from app.store.snapshot_table import PostgresFoldSnapshots
from tests.support.generators import events, histories, stream_for
from tests.support.waiting import wait_until

OPERATOR = Meta(actor="alice")
LEADER = Meta(actor="reconciler", epoch=1)


@pytest_asyncio.fixture(loop_scope="session")
async def owner(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(driver_url(database_url))
    yield connection
    await connection.close()


def same_fold(a: ClusterState, b: ClusterState) -> bool:
    return (a.position, a.nodes, a.models, a.replicas, a.keys, a.revocations) == (
        b.position, b.nodes, b.models, b.replicas, b.keys, b.revocations
    )  # fmt: skip


async def register_nodes(store: PostgresEventStore, count: int, meta: Meta = OPERATOR) -> None:
    for _ in range(count):
        node = f"gpu-{uuid.uuid4().hex[:6]}"
        await store.append(
            node_stream(node), None, [NewEvent(NodeRegistered(node_id=node, address="h"))], meta
        )


async def start(engine: AsyncEngine) -> tuple[PostgresEventStore, dict[str, Any]]:
    """A store as ``serve`` starts one, and what it said about where its fold came from."""
    store = PostgresEventStore(engine, policy=None)
    with capture_logs() as logs:
        await store.catch_up()
    (loaded,) = [entry for entry in logs if entry["event"] == "fold_loaded"]
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    return store, {**loaded, "warnings": warnings}


async def test_a_restart_folds_only_the_events_after_the_newest_snapshot(
    engine: AsyncEngine,
) -> None:
    writer = PostgresEventStore(engine, policy=None)
    await register_nodes(writer, 5)
    position = await writer.save_snapshot()
    await register_nodes(writer, 3)

    restarted, loaded = await start(engine)

    assert position == 5
    assert loaded["snapshot"] == 5
    assert loaded["events_folded"] == 3
    assert loaded["warnings"] == []
    assert same_fold(restarted.state, await replay(engine))
    assert same_fold(restarted.state, writer.state)


async def test_a_fold_started_from_a_snapshot_with_nothing_after_it_appends_at_once(
    engine: AsyncEngine,
) -> None:
    """The fold's appends name the event it ends with, and the log refuses them when it
    holds another: started from a snapshot, the fold knows that event from the snapshot."""
    writer = PostgresEventStore(engine, policy=None)
    await register_nodes(writer, 3)
    await writer.save_snapshot()
    restarted, loaded = await start(engine)

    with capture_logs() as logs:
        await register_nodes(restarted, 1)

    assert (loaded["snapshot"], loaded["events_folded"]) == (3, 0)
    assert [entry["event"] for entry in logs] == [], "appended at once, not folded again"
    assert restarted.started is not None
    assert restarted.started.snapshot == 3
    assert same_fold(restarted.state, await replay(engine))


async def test_a_snapshot_of_another_fold_is_passed_over_for_a_full_replay(
    engine: AsyncEngine, owner: asyncpg.Connection
) -> None:
    writer = PostgresEventStore(engine, policy=None)
    await register_nodes(writer, 4)
    await writer.save_snapshot()
    await owner.execute("UPDATE fold_snapshots SET fingerprint = 'llmgw 0.9'")

    restarted, loaded = await start(engine)

    assert loaded["snapshot"] is None
    assert loaded["events_folded"] == 4
    assert [w["reason"] for w in loaded["warnings"] if "reason" in w] == [
        "it was written by another version of the fold"
    ]
    assert loaded["warnings"][-1]["event"] == "fold_snapshots_unusable"
    assert same_fold(restarted.state, await replay(engine))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (
            "UPDATE fold_snapshot_chunks SET data = set_byte(data, 2, (get_byte(data, 2) + 1) "
            "% 256) WHERE position = 6 AND chunk = 1",
            "its chunks are damaged or missing",
        ),
        (
            "DELETE FROM fold_snapshot_chunks WHERE position = 6 AND chunk = 1",
            "its chunks are damaged or missing",
        ),
        (
            "UPDATE fold_snapshots SET chain_hash = sha256('another log') WHERE position = 6",
            "the log's event at its position is another one",
        ),
    ],
)
async def test_a_damaged_snapshot_is_passed_over_for_the_one_before(
    engine: AsyncEngine, owner: asyncpg.Connection, damage: str, reason: str
) -> None:
    writer = PostgresEventStore(engine, policy=None)
    await register_nodes(writer, 4)
    await writer.save_snapshot()
    await register_nodes(writer, 2)
    await writer.save_snapshot()
    await register_nodes(writer, 1)
    await owner.execute(damage)

    restarted, loaded = await start(engine)

    assert [(w["position"], w["reason"]) for w in loaded["warnings"]] == [(6, reason)]
    assert loaded["snapshot"] == 4
    assert loaded["events_folded"] == 3
    assert same_fold(restarted.state, await replay(engine))


async def test_the_leader_writes_a_snapshot_once_its_appends_moved_the_fold_far_enough(
    engine: AsyncEngine, owner: asyncpg.Connection
) -> None:
    store = PostgresEventStore(engine, policy=SnapshotPolicy(every_events=5))
    await register_nodes(store, 4, LEADER)
    await register_nodes(store, 3, OPERATOR)  # not the leader's: writes none

    assert await owner.fetchval("SELECT count(*) FROM fold_snapshots") == 0

    await register_nodes(store, 1, LEADER)

    async def written() -> bool:
        return await owner.fetchval("SELECT max(position) FROM fold_snapshots") == 8

    await wait_until(written, what="a snapshot at position 8")
    restarted, loaded = await start(engine)
    assert (loaded["snapshot"], loaded["events_folded"]) == (8, 0)
    assert same_fold(restarted.state, store.state)


async def test_a_start_up_that_folded_many_events_leaves_a_snapshot_for_the_next(
    engine: AsyncEngine, owner: asyncpg.Connection
) -> None:
    await register_nodes(PostgresEventStore(engine, policy=None), 6)

    first = PostgresEventStore(engine, policy=SnapshotPolicy(every_events=5))
    await first.catch_up()

    async def written() -> bool:
        return await owner.fetchval("SELECT max(position) FROM fold_snapshots") == 6

    await wait_until(written, what="a snapshot at position 6")


async def test_only_the_two_newest_snapshots_are_kept(
    engine: AsyncEngine, owner: asyncpg.Connection
) -> None:
    writer = PostgresEventStore(engine, policy=None)
    for _ in range(3):
        await register_nodes(writer, 2)
        await writer.save_snapshot()

    assert await writer.save_snapshot() is None  # one at this position exists

    assert [r[0] for r in await owner.fetch("SELECT position FROM fold_snapshots")] == [4, 6]
    assert {r[0] for r in await owner.fetch("SELECT position FROM fold_snapshot_chunks")} == {4, 6}


async def test_projections_rebuild_verify_finds_a_snapshot_that_is_not_the_log(
    engine: AsyncEngine,
) -> None:
    writer = PostgresEventStore(engine, policy=None)
    await register_nodes(writer, 2)
    await writer.save_snapshot()
    clean = await rebuild(engine, verify=True)
    await register_nodes(writer, 1)
    node = next(iter(writer.state.nodes.values()))
    await writer.append(
        node_stream(node.id), None, [NewEvent(NodeCordoned(node_id=node.id))], OPERATOR
    )
    forged = writer.state.copy()
    forged.nodes[node.id] = replace(forged.nodes[node.id], cordoned=False)
    await PostgresFoldSnapshots(engine).save(forged, {})

    report = await rebuild(engine, verify=True)

    assert clean.differences == []
    problems = {(d.table, d.key, d.problem) for d in report.differences}
    assert ("fold_snapshots", f"4/nodes/{node.id}", "differs") in problems
    assert ("fold_snapshots", f"4/versions/node-{node.id}", "missing") in problems
    (cordoned,) = [d for d in report.differences if d.key == f"4/nodes/{node.id}"]
    assert cordoned.columns == {"cordoned": (False, True)}


@pytest.mark.parametrize(
    "number",
    [
        2**53,
        -(2**53),
        9.007199254740992e15,
        0.1,
        5e-324,
        2**64,
        -(2**63) - 1,
        1e16,
        1e23,
        1.2345678901234567e18,
    ],
)
async def test_a_bench_summary_that_tuning_takes_is_given_back_by_a_restart_and_a_snapshot(
    engine: AsyncEngine, number: float
) -> None:
    """The log's JSON reads a float of 1e16 or more back as a whole number (not always the
    same one), and a snapshot holds no integer beyond 64 bits: such a number must be refused
    before it reaches the log, or snapshots fail, and the fold differs, after a restart."""
    writer = PostgresEventStore(engine, policy=None)
    model = f"m-{uuid.uuid4().hex[:8]}"
    spec = ModelSpec(name=model, command="vllm serve {model} --port {port}")
    await writer.append(
        model_stream(model), 0, [NewEvent(ModelDeclared(model=model, spec=spec))], OPERATOR
    )
    settings = RoutingSettings(weight=1.0, target_waiting=4, kv_ceiling=0.9)
    try:
        change = tune(writer.state, model, None, settings, {"at_capacity": {"tokens": number}})
    except InvalidTuning:
        return  # refused: nothing reaches the log
    await writer.append(change.stream, None, [NewEvent(e) for e in change.events], OPERATOR)

    restarted, _ = await start(engine)
    position = await restarted.save_snapshot()
    from_snapshot, loaded = await start(engine)

    assert restarted.state.models[model] == writer.state.models[model]
    assert (loaded["snapshot"], loaded["warnings"]) == (position, [])
    assert from_snapshot.state.models[model] == writer.state.models[model]


def test_a_fold_from_a_snapshot_and_the_tail_equals_a_full_replay(database_url: str) -> None:
    """Histories in which the fold forgets ended replicas, before the snapshot, after it or
    both (``histories`` weaves a churn of one model's replicas into the generated ones)."""
    batches = st.lists(st.lists(events(), min_size=1, max_size=5), max_size=10)

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(st.lists(events(), min_size=1, max_size=5), histories(batches), st.data())
    def snapshot_then_tail(
        first: list[AnyEvent], history: list[list[AnyEvent]], data: st.DataObject
    ) -> None:
        cut = data.draw(st.integers(0, len(history)), label="snapshot after batch")
        asyncio.run(_snapshot_then_tail(database_url, [first, *history[:cut]], history[cut:]))

    snapshot_then_tail()


async def _snapshot_then_tail(
    url: str, before: list[list[AnyEvent]], after: list[list[AnyEvent]]
) -> None:
    engine = create_engine(url, pool_size=2)
    try:
        writer = PostgresEventStore(engine, policy=None)
        streams: set[str] = set()
        for batch in before:
            await _append(writer, batch, streams)
        position = await writer.save_snapshot()
        for batch in after:
            await _append(writer, batch, streams)

        restarted, loaded = await start(engine)

        replayed = await replay(engine)
        assert loaded["snapshot"] == position
        assert loaded["warnings"] == []
        assert same_fold(restarted.state, replayed)
        assert all_rows(restarted.state) == all_rows(replayed)
        # The fold has the version of every stream but those of replicas it does not hold
        # (forgotten, or never placed): the writer's, the restarted and a replaying fold alike.
        expected = {
            s: 0 if is_replica_stream_not_held(s, replayed) else await writer.stream_version(s)
            for s in streams
        }
        replaying = FoldedEventStore(PostgresRecorder(engine))
        await replaying.catch_up()
        for fold in (restarted, writer, replaying):
            assert {s: fold.known_version(s) for s in streams} == expected
    finally:
        await engine.dispose()


def is_replica_stream_not_held(stream: str, state: ClusterState) -> bool:
    return stream.startswith("replica-") and stream.removeprefix("replica-") not in state.replicas


async def _append(store: PostgresEventStore, batch: list[AnyEvent], streams: set[str]) -> None:
    requests = [AppendRequest(stream_for(e), None, [NewEvent(e)]) for e in batch]
    streams.update(r.stream for r in requests)
    await store.append_many(requests, Meta(actor="property"))
