"""The gateway's snapshot source against a real PostgreSQL: what the control plane appends
reaches the snapshot (keys within a second), and what the gateway reports in flight and
queued reaches the reconciler's reader."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec
import openai
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from app.domain.envelope import Meta
from app.domain.events import (
    ApiKeyCreated,
    ReplicaPlaced,
    ShardPlacement,
    key_stream,
    model_stream,
    replica_stream,
)
from app.domain.keys import key_matches
from app.domain.model_spec import AutoscalePolicy, RoutingSettings
from app.domain.reports import GatewaysInFlight
from app.gateway import source as source_module
from app.gateway.server import StaticSource
from app.gateway.snapshot import DatedRows, read_snapshot
from app.gateway.source import SNAPSHOT_SHARE, PostgresSnapshotSource
from app.gateway.table import GatewaySnapshot
from app.services.operations import Caller, Operations
from app.store.database import connection, driver_url
from app.store.database_url import parse_database_url
from app.store.gateway_reports import (
    FORGET_AFTER_S,
    InFlightReports,
    delete_report,
    write_report,
)
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from app.store.rebuild import rebuild
from app.store.routing_rows import EXPIRED_KEYS_KEPT
from tests.support.gateway import GatewayThread, new_key
from tests.support.reporting_gateway import reporting_gateway
from tests.support.routing import (
    connect_node,
    declare_model,
    fail_replica,
    scale_to_zero,
    serve_replica,
    start_replica,
)
from tests.support.tcp_relay import Break, TcpRelay
from tests.support.waiting import wait_until

REVOKED_WITHIN_S = 1.0
ALICE = Caller(actor="alice")


@pytest_asyncio.fixture(loop_scope="session")
async def source(database_url: str) -> AsyncIterator[PostgresSnapshotSource]:
    source = PostgresSnapshotSource(database_url, gateway_id=f"gw-{secrets.token_hex(4)}")
    await source.start()
    assert source.fresh(), source.stale_reason()
    yield source
    await source.close()


def name() -> str:
    return f"m{secrets.token_hex(3)}"


async def test_a_key_created_through_the_store_appears_and_revoked_disappears_within_a_second(
    pg_store: PostgresEventStore, source: PostgresSnapshotSource
) -> None:
    operations = Operations(pg_store)
    model = name()
    await declare_model(pg_store, model)
    created = await operations.create_key(ALICE, f"ci-{model}", [model], rpm=60)

    await wait_until(
        lambda: created.record.prefix in source.current().keys, within_s=REVOKED_WITHIN_S
    )
    record = source.current().keys[created.record.prefix]
    assert key_matches(created.key, record.secret_hash)
    assert (record.models, record.rpm, record.tpm) == (frozenset({model}), 60, None)
    assert model in source.current().declared

    await operations.revoke_key(ALICE, created.record.prefix)

    await wait_until(
        lambda: created.record.prefix not in source.current().keys,
        within_s=REVOKED_WITHIN_S,
        what="the revoked key gone from the snapshot",
    )


async def test_a_key_comes_with_its_expiry_and_stays_a_while_after_it_for_its_holder_to_be_told(
    pg_store: PostgresEventStore, source: PostgresSnapshotSource
) -> None:
    model = name()
    await declare_model(pg_store, model)
    now = datetime.now(UTC)
    expiring = await Operations(pg_store).create_key(
        ALICE, f"demo-{model}", [model], expires_at=now + timedelta(days=30)
    )
    # Keys created long ago, the log's way: one expired lately, one before EXPIRED_KEYS_KEPT.
    lately, long_ago = secrets.token_hex(4), secrets.token_hex(4)
    for prefix, expired_at in (
        (lately, now - EXPIRED_KEYS_KEPT + timedelta(hours=1)),
        (long_ago, now - EXPIRED_KEYS_KEPT - timedelta(hours=1)),
    ):
        created = ApiKeyCreated(
            key_id=f"k-{prefix}", name=f"old-{prefix}", prefix=prefix, secret_hash="h",
            expires_at=expired_at,
        )  # fmt: skip
        await pg_store.append_many(
            [AppendRequest(key_stream(created.key_id), None, [NewEvent(created)])],
            Meta(actor="alice"),
        )

    await wait_until(lambda: lately in source.current().keys, within_s=REVOKED_WITHIN_S)
    keys = source.current().keys
    assert keys[expiring.record.prefix].expires_at == (now + timedelta(days=30)).timestamp()
    assert keys[lately].expires_at == (now - EXPIRED_KEYS_KEPT + timedelta(hours=1)).timestamp()
    assert long_ago not in keys


async def test_serving_replicas_are_routed_and_a_model_scaled_to_zero_leaves_the_table(
    pg_store: PostgresEventStore, source: PostgresSnapshotSource
) -> None:
    model, other = name(), name()
    seen: list[GatewaySnapshot] = []
    source.subscribe(seen.append)
    await connect_node(pg_store, "gpu-1", "127.0.0.1")
    await connect_node(pg_store, "gpu-2", "::1")
    await declare_model(pg_store, model, replicas=2)
    await declare_model(pg_store, other)
    first = await serve_replica(pg_store, model, 1, "gpu-1", 21001)
    second = await serve_replica(pg_store, model, 2, "gpu-2", 21002)
    kept = await serve_replica(pg_store, other, 1, "gpu-1", 21003)

    await wait_until(lambda: len(source.current().routes.get(model, ())) == 2, within_s=1.0)
    routes = source.current().routes[model]
    assert [(r.replica_id, r.url, r.draining) for r in routes] == [
        (first, "http://127.0.0.1:21001", False),
        (second, "http://[::1]:21002", False),
    ]
    assert seen
    assert seen[-1] is source.current()

    await scale_to_zero(pg_store, model, [first, second])

    await wait_until(lambda: model not in source.current().routes, within_s=1.0)
    assert model in source.current().declared  # still declared: 503, not 404
    assert [r.replica_id for r in source.current().routes[other]] == [kept]


async def test_each_route_carries_the_address_its_nodes_agent_connected_from(
    pg_store: PostgresEventStore, source: PostgresSnapshotSource
) -> None:
    model = name()
    await connect_node(pg_store, "gpu-1", "127.0.0.1")
    await connect_node(pg_store, "gpu-2", "127.0.0.2", connected_from="127.0.0.9:51234")
    await declare_model(pg_store, model, replicas=2)
    await serve_replica(pg_store, model, 1, "gpu-1", 21001)
    await serve_replica(pg_store, model, 2, "gpu-2", 21002)

    await wait_until(lambda: len(source.current().routes.get(model, ())) == 2, within_s=1.0)
    assert [r.agent_address for r in source.current().routes[model]] == [
        "127.0.0.1:44300",
        "127.0.0.9:51234",
    ]


async def test_after_its_first_read_a_source_reads_only_what_changed(
    pg_store: PostgresEventStore, database_url: str
) -> None:
    """Every route is read once; from then on each read reads the routes the events since
    name, and a node that connects again from another address moves its routes with it."""
    source = PostgresSnapshotSource(
        database_url, gateway_id=f"gw-{secrets.token_hex(4)}", whole_read_interval_s=3600
    )
    await source.start()
    try:
        model = name()
        node = f"gpu-{secrets.token_hex(3)}"
        await connect_node(pg_store, node, "127.0.0.1")
        await declare_model(pg_store, model)
        await serve_replica(pg_store, model, 1, node, 21001)
        await wait_until(lambda: model in source.current().routes, within_s=1.0)

        await connect_node(pg_store, node, "127.0.0.3")

        await wait_until(
            lambda: [r.url for r in source.current().routes[model]] == ["http://127.0.0.3:21001"],
            within_s=1.0,
            what="the route at the node's new address",
        )
        assert source.whole_reads == 1
        assert source.loads > 1
    finally:
        await source.close()


async def test_a_projection_rebuild_makes_a_source_read_every_route_at_once(
    pg_store: PostgresEventStore, database_url: str
) -> None:
    """A rebuild rewrites rows without an event, so no read of changes would see them: it
    says so on the log's channel, and the source reads every route again."""
    model = name()
    node = f"gpu-{secrets.token_hex(3)}"
    await connect_node(pg_store, node, "127.0.0.1")
    await declare_model(pg_store, model)
    replica = await serve_replica(pg_store, model, 1, node, 21001)
    async with connection(pg_store.engine) as db:  # a row no event wrote
        await db.execute("UPDATE replicas SET weight = 7 WHERE id = $1", replica)
    source = PostgresSnapshotSource(
        database_url, gateway_id=f"gw-{secrets.token_hex(4)}", whole_read_interval_s=3600
    )
    await source.start()
    try:
        assert [r.weight for r in source.current().routes[model]] == [7.0]

        await rebuild(pg_store.engine, verify=False)

        await wait_until(
            lambda: [r.weight for r in source.current().routes[model]] == [1.0],
            within_s=2.0,
            what="the route as the log has it",
        )
        assert source.whole_reads == 2
    finally:
        await source.close()


async def test_a_source_reads_every_route_again_once_its_interval_is_up(
    pg_store: PostgresEventStore, database_url: str
) -> None:
    """And a read of every route that finds them as held keeps the routes held: it is taken
    in against them, so a fleet that did not change costs the gateway's loop no rebuild."""
    model = name()
    node = f"gpu-{secrets.token_hex(3)}"
    await connect_node(pg_store, node, "127.0.0.1")
    await declare_model(pg_store, model)
    await serve_replica(pg_store, model, 1, node, 21001)
    source = PostgresSnapshotSource(
        database_url,
        gateway_id=f"gw-{secrets.token_hex(4)}",
        refresh_interval_s=0.05,
        whole_read_interval_s=0.1,
    )
    await source.start()
    try:
        routes = source.current().routes[model]

        await wait_until(lambda: source.whole_reads >= 3, what="three reads of every route")

        assert source.current().routes[model] is routes
    finally:
        await source.close()


async def test_a_gateway_slow_to_take_in_snapshots_reads_them_less_often(
    pg_store: PostgresEventStore, database_url: str
) -> None:
    """Taking in a snapshot is work on the gateway's loop that grows with the fleet: after
    one that took ``t``, the next read waits ``t * (1 / SNAPSHOT_SHARE - 1)``, however
    soon the next change comes, so that work keeps to its share of the loop."""
    taken: list[tuple[float, float]] = []

    def slow(_: GatewaySnapshot) -> None:
        started = time.monotonic()
        time.sleep(0.1)  # the work of a large fleet's snapshot, on the loop
        taken.append((started, time.monotonic()))

    source = PostgresSnapshotSource(database_url, gateway_id=f"gw-{secrets.token_hex(4)}")
    source.subscribe(slow)
    await source.start()
    try:
        await wait_until(lambda: len(taken) == 1, what="the first snapshot taken in")
        await declare_model(pg_store, name())

        await wait_until(lambda: len(taken) == 2, what="the declared model's snapshot")
        (first_started, first_done), (second_started, _) = taken
        spent = first_done - first_started
        assert second_started - first_done >= spent * (1 / SNAPSHOT_SHARE - 1)
    finally:
        await source.close()


async def test_what_a_gateway_has_in_flight_reaches_the_reconciler_until_it_closes(
    engine: AsyncEngine, database_url: str
) -> None:
    counts = {"a-1": 2, "b-1": 0}
    reports = InFlightReports(engine)
    one = await reporting_gateway(
        database_url, "gw-one", lambda: dict(counts), report_interval_s=0.05
    )
    two = await reporting_gateway(
        database_url, "gw-two", lambda: {"a-1": 1}, report_interval_s=0.05
    )
    try:

        async def reported(expected: dict[str, int]) -> bool:
            return await reports.read_in_flight() == expected

        await wait_until(lambda: reported({"a-1": 3}), within_s=2.0, what="summed reports")
        counts["a-1"] = 0
        await wait_until(lambda: reported({"a-1": 1}), within_s=2.0, what="one gateway idle")
    finally:
        await two.close()
    assert await reports.read_in_flight() == {}  # a closed gateway's report is removed
    await one.close()


async def test_reports_older_than_the_age_limit_are_ignored(
    engine: AsyncEngine, database_url: str
) -> None:
    db = await asyncpg.connect(driver_url(database_url))
    try:
        await db.execute(
            "INSERT INTO gateway_reports (gateway_id, in_flight, reported_at) VALUES "
            """('gone', '{"a-1": 4}', now() - interval '6 seconds'), """
            """('live', '{"a-1": 1, "b-1": 2}', now())"""
        )
    finally:
        await db.close()

    assert await InFlightReports(engine).read_in_flight() == {"a-1": 1, "b-1": 2}


async def test_a_crashed_gateways_report_is_deleted_an_hour_after_its_last_write(
    database_url: str,
) -> None:
    """A gateway killed for good (its default id, hostname-pid, never comes back) cannot
    delete its row. Any gateway's report deletes it once no one has written it for
    ``FORGET_AFTER_S``; one that crashed minutes ago stays for an operator to read."""
    long_gone, lately = f"gw-{secrets.token_hex(4)}", f"gw-{secrets.token_hex(4)}"
    writer = f"gw-{secrets.token_hex(4)}"
    db = await asyncpg.connect(driver_url(database_url))
    try:
        await db.execute(
            "INSERT INTO gateway_reports (gateway_id, in_flight, instance, reported_at) VALUES "
            "($1, '{}', 'crashed-41-0badc0de', now() - make_interval(secs => $3)), "
            "($2, '{}', 'crashed-42-0badc0de', now() - interval '10 minutes')",
            long_gone,
            lately,
            FORGET_AFTER_S + 60,
        )
        token = f"{writer}-token"
        written = await write_report(db, writer, {}, within_s=5.0, instance=token)
        assert written.at is not None
        left = await db.fetch(
            "SELECT gateway_id FROM gateway_reports WHERE gateway_id = ANY($1::text[])",
            [long_gone, lately, writer],
        )
        assert sorted(row["gateway_id"] for row in left) == sorted([lately, writer])
        assert written.retired == (), "another gateway's row is no retired life of this one"
        await delete_report(db, writer, instance=token, within_s=5.0)
    finally:
        await db.close()


async def test_a_model_with_an_autoscaling_policy_carries_its_cold_start_timeout(
    pg_store: PostgresEventStore, source: PostgresSnapshotSource
) -> None:
    scaled, fixed = name(), name()
    policy = AutoscalePolicy(min_replicas=0, max_replicas=2, cold_start_timeout_s=42.5)
    await declare_model(pg_store, scaled, replicas=0, autoscale=policy)
    await declare_model(pg_store, fixed)

    await wait_until(lambda: {scaled, fixed} <= source.current().declared, within_s=1.0)
    assert source.current().cold_start_s == {scaled: 42.5}
    assert scaled not in source.current().routes


async def test_a_model_failing_to_start_and_one_scaled_to_zero_are_carried(
    pg_store: PostgresEventStore, source: PostgresSnapshotSource
) -> None:
    failing, retrying, parked = name(), name(), name()
    node = f"gpu-{name()}"
    await connect_node(pg_store, node, "127.0.0.1")
    for model in (failing, retrying, parked):
        await declare_model(pg_store, model, replicas=2)
    await scale_to_zero(pg_store, parked, [])
    await fail_replica(pg_store, retrying, 1, node, 21003, "engine exited with code 1")
    # Another replica of ``retrying`` is placed and may still serve: it is not failing.
    placement = ShardPlacement(index=0, node_id=node, gpus=(4,), port=21004)
    placed = ReplicaPlaced(
        replica_id=f"{retrying}-2", model=retrying, number=2, shards=(placement,), reason="test"
    )
    request = AppendRequest(replica_stream(f"{retrying}-2"), None, [NewEvent(placed)])
    await pg_store.append_many([request], Meta(actor="reconciler"))
    await fail_replica(pg_store, failing, 1, node, 21001, "engine exited\nwith code 1")
    await fail_replica(pg_store, failing, 2, node, 21002, "engine exited with code 2")

    def failed_twice() -> bool:  # the last append: the snapshot holds all of them then
        failure = source.current().start_failures.get(failing)
        return failure is not None and failure.failures == 2

    await wait_until(failed_twice, within_s=5.0, what=f"{failing} failing twice")
    snapshot = source.current()
    failure = snapshot.start_failures[failing]
    assert failure.failures == 2
    # The second failure's backoff: 20 s from when it was recorded, by the gateway's clock.
    assert 0 < failure.retry_at - snapshot.loaded_at <= 20.0
    assert retrying not in snapshot.start_failures
    assert parked in snapshot.scaled_to_zero
    assert not {failing, retrying} & snapshot.scaled_to_zero


async def test_a_model_carries_how_many_of_its_replicas_are_placed_or_starting(
    pg_store: PostgresEventStore, source: PostgresSnapshotSource
) -> None:
    """Serving and failed replicas are not counted, nor models with none placed or starting."""
    loading, serving, idle = name(), name(), name()
    node = f"gpu-{name()}"
    await connect_node(pg_store, node, "127.0.0.1")
    await declare_model(pg_store, loading, replicas=3)
    await declare_model(pg_store, serving)
    await declare_model(pg_store, idle)
    await serve_replica(pg_store, serving, 1, node, 21001)
    await fail_replica(pg_store, idle, 1, node, 21002, "engine exited with code 1")
    await start_replica(pg_store, loading, 1, node, 21003, shard_started=False)
    await start_replica(pg_store, loading, 2, node, 21004)  # the last append

    await wait_until(
        lambda: source.current().starting.get(loading) == 2, within_s=5.0, what="2 starting"
    )
    snapshot = source.current()
    assert loading not in snapshot.routes
    assert not {serving, idle} & set(snapshot.starting)


async def test_a_model_carries_the_apis_its_spec_names(
    pg_store: PostgresEventStore, source: PostgresSnapshotSource
) -> None:
    embedder, plain = name(), name()
    await declare_model(pg_store, embedder, apis=("embeddings", "rerank"))
    await declare_model(pg_store, plain)

    await wait_until(lambda: {embedder, plain} <= source.current().declared, within_s=1.0)
    snapshot = source.current()
    assert snapshot.apis_of(embedder) == frozenset({"embeddings", "rerank"})
    assert not snapshot.serves(embedder, "chat")
    assert snapshot.apis_of(plain) == frozenset({"chat", "completions"})


async def test_a_models_card_says_when_it_was_first_declared_not_when_its_spec_last_changed(
    pg_store: PostgresEventStore, database_url: str
) -> None:
    # Every card said created: 0, the first second of 1970.
    model = name()
    await declare_model(pg_store, model)
    [declared] = await pg_store.read_stream(model_stream(model))
    await declare_model(pg_store, model, replicas=2)  # a new spec, the same model
    db = await asyncpg.connect(driver_url(database_url))
    try:
        read = await read_snapshot(db, within_s=5.0)
    finally:
        await db.close()
    key, record = new_key()
    snapshot = msgspec.structs.replace(read, keys={record.prefix: record})

    with (
        GatewayThread(StaticSource(snapshot), metrics_port=0) as gateway,
        openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client,
    ):
        listed = {card.id: card.created for card in client.models.list()}
        retrieved = client.models.retrieve(model)

    assert listed[model] == int(declared.recorded_at.timestamp())
    assert retrieved.created == listed[model]


async def test_a_changed_routing_policy_or_apis_alone_reaches_the_listeners(
    pg_store: PostgresEventStore, source: PostgresSnapshotSource
) -> None:
    # Neither is a revision: the routes stay as they were, and only the spec changes.
    model = name()
    seen: list[GatewaySnapshot] = []
    source.subscribe(seen.append)
    await declare_model(pg_store, model)
    await wait_until(lambda: bool(seen) and model in seen[-1].declared, within_s=1.0)

    bounded = RoutingSettings(policy="session", max_in_flight=2)
    await declare_model(pg_store, model, routing=bounded)

    await wait_until(
        lambda: seen[-1].policy_of(model).max_in_flight == 2,
        within_s=1.0,
        what="the new routing policy handed to the router",
    )
    assert seen[-1].policy_of(model).policy == "session"

    await declare_model(pg_store, model, routing=bounded, apis=("embeddings",))

    await wait_until(
        lambda: seen[-1].apis_of(model) == frozenset({"embeddings"}),
        within_s=1.0,
        what="the new APIs handed to the gateway",
    )


async def test_what_a_gateway_holds_queued_reaches_the_reader_at_once_when_asked(
    engine: AsyncEngine, database_url: str
) -> None:
    """Reports every 5 s: only ``report_soon`` can bring a hold within the second."""
    queued: dict[str, int] = {}
    reports = InFlightReports(engine)
    one = await reporting_gateway(
        database_url, "gw-one", dict, queued=lambda: dict(queued), report_interval_s=5.0
    )
    two = await reporting_gateway(
        database_url,
        "gw-two",
        dict,
        queued=lambda: {"llama": 2, "idle": 0},
        report_interval_s=0.05,
    )
    try:

        async def reported(expected: dict[str, int]) -> bool:
            return await reports.read_queued() == expected

        await wait_until(lambda: reported({"llama": 2}), within_s=2.0, what="gw-two's queue")
        queued["qwen"] = 3
        one.reporter.report_soon()
        await wait_until(lambda: reported({"llama": 2, "qwen": 3}), within_s=1.0, what="a hold")
    finally:
        await two.close()
    assert await reports.read_queued() == {"qwen": 3}  # a closed gateway's report is removed
    await one.close()
    assert await reports.read_queued() == {}


async def test_queued_counts_are_read_from_fresh_reports_and_lies_are_skipped(
    engine: AsyncEngine, database_url: str
) -> None:
    """A gateway's row is its writer's word: a malformed entry costs only that entry, a
    malformed row only that row."""
    rows = [
        ("good", '{"llama": 2, "qwen": 1}'),
        ("lies", '{"llama": -5, "qwen": 1, "Not A Model!": 3, "big": 1000000000, "odd": "7"}'),
        ("array", "[1, 2, 3]"),
        ("number", "12"),
        ("huge", '{"llama": 1, "pad": "' + "x" * 300_000 + '"}'),
        ("none", None),
    ]
    db = await asyncpg.connect(driver_url(database_url))
    try:
        for gateway_id, queued in rows:
            await db.execute(
                "INSERT INTO gateway_reports (gateway_id, in_flight, queued) "
                "VALUES ($1, '{}'::jsonb, $2::jsonb)",
                gateway_id,
                queued,
            )
        await db.execute(
            "INSERT INTO gateway_reports (gateway_id, in_flight, queued, reported_at) "
            """VALUES ('stale', '{}', '{"llama": 100}', now() - interval '6 seconds')"""
        )
    finally:
        await db.close()

    with capture_logs() as logs:
        assert await InFlightReports(engine).read_queued() == {"llama": 2, "qwen": 2}
    said = {e["gateway_id"]: e for e in logs if e["event"] == "gateway_report_refused"}
    assert sorted(said) == ["array", "huge", "lies", "number"]
    assert said["huge"]["error"].endswith(" bytes of queued counts, over 262144")
    assert said["lies"]["skipped"] == 4
    assert said["lies"]["error"] == (
        "queued counts skipped: 'big': Expected `int` <= 1000000; 'odd': Expected `int`, got "
        "`str`; 'llama': Expected `int` >= 0; 'Not A Model!': not a model's name"
    )


async def test_the_reconciler_reads_the_routing_every_live_gateway_counted_by(
    engine: AsyncEngine, database_url: str
) -> None:
    db = await asyncpg.connect(driver_url(database_url))
    try:
        await db.execute("DELETE FROM gateway_reports")
        reports = InFlightReports(engine)
        assert await reports.read_gateways() == GatewaysInFlight(in_flight={}, routing_seen=None)

        await write_report(db, "gw-a", {"r-1": 2}, within_s=5, instance="test", routing_position=9)
        await write_report(
            db, "gw-b", {"r-1": 1, "r-2": 0}, within_s=5, instance="test", routing_position=7
        )
        assert await reports.read_gateways() == GatewaysInFlight(
            in_flight={"r-1": 3}, routing_seen=7, live=2
        )
        # A live gateway that does not say which table it routes by: nothing is known.
        await write_report(db, "gw-old", {}, within_s=5, instance="test")
        assert (await reports.read_gateways()).routing_seen is None
        assert (await reports.read_gateways()).live == 3
        # Once its report is too old it is not live, and the others' word holds again.
        await db.execute(
            "UPDATE gateway_reports SET reported_at = now() - interval '6 seconds' "
            "WHERE gateway_id = 'gw-old'"
        )
        assert (await reports.read_gateways()).routing_seen == 7
        assert (await reports.read_gateways()).live == 2
        # It left its report behind (it did not stop cleanly): silent, its requests unknown.
        assert (await reports.read_gateways()).silent == 1
        # Long silent, it is taken as gone.
        await db.execute(
            "UPDATE gateway_reports SET reported_at = now() - interval '31 seconds' "
            "WHERE gateway_id = 'gw-old'"
        )
        assert (await reports.read_gateways()).silent == 0
        await db.execute("DELETE FROM gateway_reports")

        # A gateway reports the position of the table it has applied.
        gateway = await reporting_gateway(database_url, "gw-real", dict, report_interval_s=0.05)
        try:

            async def reported() -> bool:
                seen = (await reports.read_gateways()).routing_seen
                return seen is not None and seen == gateway.source.current().position

            await wait_until(reported, within_s=2.0, what="the table's position reported")
        finally:
            await gateway.close()
        # Stopped cleanly, it took its report with it: neither live nor silent.
        assert await reports.read_gateways() == GatewaysInFlight(in_flight={}, routing_seen=None)
    finally:
        await db.close()


async def test_a_blocked_snapshot_read_does_not_hold_up_the_reports(
    engine: AsyncEngine, database_url: str
) -> None:
    """The report has a connection of its own: a read waiting on a lock (what a migration's
    ALTER TABLE takes) leaves the gateway's routing as it was, not its report late, so the
    leader does not take a busy gateway for a silent one."""
    db = await asyncpg.connect(driver_url(database_url))
    gateway = await reporting_gateway(
        database_url,
        "gw-blocked-read",
        lambda: {"a-1": 1},
        report_interval_s=0.05,
        refresh_interval_s=0.05,
    )
    reports = InFlightReports(engine)
    try:
        await wait_until(lambda: gateway.reporter.reports > 0, what="the first report")
        with capture_logs() as logs:
            async with db.transaction():
                await db.execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
                loads, written = gateway.source.loads, gateway.reporter.reports
                await wait_until(
                    lambda: gateway.reporter.reports >= written + 20,
                    what="reports going out while the read waits",
                )
                assert gateway.source.loads == loads  # the read is still waiting
                seen = await reports.read_gateways()
                assert (seen.in_flight, seen.live, seen.silent) == ({"a-1": 1}, 1, 0)
        assert "gateway_report_late" not in [line["event"] for line in logs]
        await wait_until(lambda: gateway.source.loads > loads, what="the read done")
    finally:
        await gateway.close()
        await db.close()


async def test_a_report_held_up_on_its_own_write_is_logged_as_late(database_url: str) -> None:
    db = await asyncpg.connect(driver_url(database_url))
    gateway = await reporting_gateway(
        database_url, "gw-blocked-write", dict, report_interval_s=0.05
    )
    try:
        await wait_until(lambda: gateway.reporter.reports > 0, what="the first report")
        with capture_logs() as logs:
            # The report's own table locked: its write waits, and the next is late.
            async with db.transaction():
                await db.execute("LOCK TABLE gateway_reports IN ACCESS EXCLUSIVE MODE")
                await asyncio.sleep(2.5)  # the lock held: the stall under test
            await wait_until(
                lambda: any(line["event"] == "gateway_report_late" for line in logs),
                what="the late report logged",
            )
        late = next(line for line in logs if line["event"] == "gateway_report_late")
        assert late["gateway_id"] == "gw-blocked-write"
        assert late["late_s"] > 2.0
    finally:
        await gateway.close()
        await db.close()


async def test_a_report_connection_cut_is_told_once_and_reports_resume_on_a_new_one(
    engine: AsyncEngine, database_url: str
) -> None:
    """What an operator's ``pg_terminate_backend`` or a dropped TCP connection does to the
    reporter: one warning, a new connection, the reports going on, one line when they do."""
    db = await asyncpg.connect(driver_url(database_url))
    gateway = await reporting_gateway(
        database_url, "gw-cut", lambda: {"a-1": 2}, report_interval_s=0.05
    )
    reports = InFlightReports(engine)
    try:
        await wait_until(lambda: gateway.reporter.reports > 0, what="the first report")
        with capture_logs() as logs:
            cut = await db.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'llmgw-report-gw-cut'"
            )
            assert cut == 1
            written = gateway.reporter.reports
            await wait_until(
                lambda: gateway.reporter.reports > written + 5, what="reports after the cut"
            )
        events = [line["event"] for line in logs if line["event"].startswith("gateway_report")]
        assert events == ["gateway_report_unwritten", "gateway_report_written"]
        assert (await reports.read_gateways()).in_flight == {"a-1": 2}
        # The snapshot's connection was not the one cut: it never lost the database.
        assert gateway.source.fresh()
    finally:
        await gateway.close()
        await db.close()


async def test_in_flight_counts_are_read_from_fresh_reports_and_lies_are_skipped(
    engine: AsyncEngine, database_url: str
) -> None:
    """A gateway's in-flight row is its writer's word too: a count that is not a whole
    number of requests in bounds costs only that entry, a row that is not an object only
    that row, and neither stops the reconciler's read (nor takes another gateway's
    requests away, as a negative count would)."""
    rows = [
        ("good", '{"r-1": 2, "r-2": 1}'),
        (
            "lies",
            '{"r-1": -5, "r-2": 1, "r-3": "7", "r-4": 1.5, "r-5": 1e308, "r-6": null, '
            '"r-7": {"n": 1}, "r-8": [1], "r-9": true, "r-10": 2000000000}',
        ),
        ("twin", '{"r-10": 2000000000}'),
        ("array", "[1, 2, 3]"),
        ("number", "12"),
        ("text", '"r-1"'),
    ]
    db = await asyncpg.connect(driver_url(database_url))
    try:
        await db.execute("DELETE FROM gateway_reports")
        for gateway_id, in_flight in rows:
            await db.execute(
                "INSERT INTO gateway_reports (gateway_id, in_flight) VALUES ($1, $2::jsonb)",
                gateway_id,
                in_flight,
            )
        gateways = await InFlightReports(engine).read_gateways()
    finally:
        await db.execute("DELETE FROM gateway_reports")
        await db.close()

    assert gateways.in_flight == {"r-1": 2, "r-2": 2}
    assert gateways.live == len(rows)


@pytest.mark.parametrize("how", [Break.HOLD, Break.RESET, Break.LOST])
async def test_a_listen_broken_on_its_way_is_sent_again_and_the_table_read(
    database_url: str, how: Break
) -> None:
    """A network cut off once the gateway sent LISTEN answers nothing: the gateway gives it
    up as it gives up a read, connects again and reads the routing table."""
    (host, port), *_ = parse_database_url(database_url).hosts
    assert port is not None
    async with TcpRelay(host, port) as relay:
        broken = relay.break_after_sending(b"LISTEN", how)
        source = PostgresSnapshotSource(
            relay.in_front_of(database_url), gateway_id="gw-listen-cut", query_timeout_s=0.5
        )
        await source.start(wait_s=0)
        try:
            await asyncio.wait_for(broken.wait(), 10)
            await wait_until(lambda: source.loads > 0, what="the routing table read")
            assert source.fresh(), source.stale_reason()
        finally:
            await source.close()
            relay.mend()


@pytest.mark.parametrize("error", [asyncpg.InternalClientError, asyncpg.InterfaceError])
async def test_a_connection_the_driver_finds_broken_late_is_told_in_one_line_and_read_again(
    database_url: str, monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    """Before, the driver's InternalClientError from a read was logged as a bug, with its
    traceback, as routing_table_read_failed: it is a broken connection, told as the others."""
    real_read = source_module.read_dated_rows
    failures: list[Exception] = []

    async def broken_once(
        db: asyncpg.Connection, *, within_s: float, since: int | None
    ) -> DatedRows:
        if not failures:
            failures.append(error("cannot switch to state 15; another operation is in progress"))
            raise failures[0]
        return await real_read(db, within_s=within_s, since=since)

    monkeypatch.setattr(source_module, "read_dated_rows", broken_once)
    source = PostgresSnapshotSource(database_url, gateway_id=f"gw-{secrets.token_hex(4)}")
    with capture_logs() as logs:
        await source.start(wait_s=0)
        try:
            await wait_until(lambda: source.loads > 0, what="the routing table read again")
            assert source.fresh(), source.stale_reason()
        finally:
            await source.close()

    told = [entry for entry in logs if entry["log_level"] in ("warning", "error")]
    assert [(entry["event"], entry.get("error")) for entry in told] == [
        ("database_unreachable", "cannot switch to state 15; another operation is in progress")
    ]
    assert not any("exc_info" in entry for entry in logs)
