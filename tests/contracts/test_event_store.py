"""The event store's contract, told once and run against every implementation."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import asyncpg
import msgspec
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Meta
from app.domain.events import (
    CertificateRevoked,
    ModelDeclared,
    NodeCordoned,
    NodeRegistered,
    ReplicaPlaced,
    ReplicaServing,
    ShardFailed,
    ShardPlacement,
    ShardStarting,
)
from app.domain.model_spec import ModelSpec
from app.domain.state import (
    ENDED_KEPT_PER_MODEL,
    ClusterState,
    ReplicaFilter,
    ReplicaPhase,
    ShardPhase,
    revocation_key,
)
from app.store.codec import encode_event
from app.store.database import driver_url
from app.store.errors import ConcurrencyError
from app.store.folded import FoldedEventStore
from app.store.interface import NO_STREAM, AppendRequest, EventStore, NewEvent
from app.store.memory import InMemoryEventStore, StoredEvent
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import stream_of
from tests.support.replica_history import ended, serving

ALICE = Meta(actor="alice", correlation_id="op-1")
LegacyWriter = Callable[[str, int, str, int, bytes], Awaitable[None]]
FailOver = Callable[[int], Awaitable[EventStore]]


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["memory", "postgres"])
def store(request: pytest.FixtureRequest) -> EventStore:
    if request.param == "memory":
        return InMemoryEventStore()
    pg: PostgresEventStore = request.getfixturevalue("pg_store")
    return pg


@pytest.fixture
def write_legacy(store: EventStore, request: pytest.FixtureRequest) -> LegacyWriter:
    """Put a payload in the log exactly as an older llmgw wrote it."""

    async def write(stream: str, version: int, type_name: str, schema: int, data: bytes) -> None:
        if isinstance(store, InMemoryEventStore):
            store.insert_raw(
                StoredEvent(
                    position=await store.last_position() + 1,
                    stream=stream,
                    version=version,
                    event_id=uuid.uuid4(),
                    recorded_at=datetime.now(UTC),
                    meta=Meta(actor="llmgw 0.0"),
                    type=type_name,
                    schema_version=schema,
                    data=data,
                )
            )
            return
        engine: AsyncEngine = request.getfixturevalue("engine")
        async with engine.begin() as conn:
            raw = await conn.get_raw_connection()
            # Through llmgw_append, as every llmgw since 0002 appends: it chains the event.
            await raw.driver_connection.execute(
                "SELECT llmgw_append((SELECT coalesce(max(position), 0) FROM events), "
                "(SELECT event_id FROM events ORDER BY position DESC LIMIT 1), NULL, "
                "ARRAY[$1], ARRAY[$2::int], ARRAY[$3], ARRAY[$4::smallint], ARRAY[$5::jsonb], "
                "ARRAY[$6::uuid], ARRAY[NULL], ARRAY[NULL], ARRAY[NULL], "
                "'{\"actor\": \"llmgw 0.0\"}', now(), 'llmgw 0.0', NULL, '{}', '{}', '{}', "
                "'{}', '{}', 'llmgw_events')",
                stream,
                version,
                type_name,
                schema,
                data.decode(),
                uuid.uuid4(),
            )

    return write


@pytest.fixture
def fail_over(store: EventStore, request: pytest.FixtureRequest) -> FailOver:
    """Make the log a standby's that had received only its first events (asynchronous
    replication), behind the store's back: its positions after them are handed out again.
    Returns the store of another process, on the standby's log."""

    async def to_standby(received: int) -> EventStore:
        if isinstance(store, InMemoryEventStore):
            store.recorder.keep_first(received)
            return FoldedEventStore(store.recorder)
        database_url: str = request.getfixturevalue("database_url")
        owner = await asyncpg.connect(driver_url(database_url))
        try:
            async with owner.transaction():
                await owner.execute("ALTER TABLE events DISABLE TRIGGER events_no_update_delete")
                await owner.execute("DELETE FROM events WHERE position > $1", received)
                await owner.execute("ALTER TABLE events ENABLE TRIGGER events_no_update_delete")
                await owner.execute(
                    "SELECT setval('events_position_seq', $1, $2)", max(received, 1), received > 0
                )
        finally:
            await owner.close()
        return PostgresEventStore(request.getfixturevalue("engine"), policy=None)

    return to_standby


def declared(name: str) -> NewEvent:
    return NewEvent(
        ModelDeclared(model=name, spec=ModelSpec(name=name, command="sim --port {port}"))
    )


def placed(model: str, number: int, node: str = "gpu-1") -> NewEvent:
    shard = ShardPlacement(index=0, node_id=node, gpus=(0,), port=20000 + number)
    return NewEvent(
        ReplicaPlaced(replica_id=f"{model}-{number}", model=model, number=number, shards=(shard,))
    )


async def test_appended_events_are_read_back_in_order_with_their_envelope(
    store: EventStore,
) -> None:
    model = unique("m")
    recorded = await store.append(f"model-{model}", NO_STREAM, [declared(model)], ALICE)
    await store.append(f"replica-{model}-1", NO_STREAM, [placed(model, 1)], ALICE)

    stream = await store.read_stream(f"model-{model}")
    assert [r.event for r in stream] == [recorded[0].event]
    assert stream[0].version == 1
    assert stream[0].meta == ALICE
    after = await store.read_all(recorded[0].position - 1, limit=10)
    assert [r.position for r in after] == sorted(r.position for r in after)
    assert after[0].event_id == recorded[0].event_id
    assert await store.stream_version(f"model-{model}") == 1
    assert await store.stream_version(f"model-{unique('never')}") == 0


async def test_a_stale_expected_version_raises_and_writes_nothing(store: EventStore) -> None:
    model = unique("m")
    await store.append(f"model-{model}", NO_STREAM, [declared(model)], ALICE)
    before = await store.last_position()

    with pytest.raises(ConcurrencyError) as caught:
        await store.append(f"model-{model}", NO_STREAM, [declared(model)], ALICE)

    assert caught.value.actual == 1
    assert await store.last_position() == before
    assert await store.stream_version(f"model-{model}") == 1


async def test_a_multi_stream_append_is_all_or_nothing(store: EventStore) -> None:
    model = unique("m")
    await store.append(f"model-{model}", NO_STREAM, [declared(model)], ALICE)
    before = await store.last_position()

    with pytest.raises(ConcurrencyError):
        await store.append_many(
            [
                AppendRequest(f"replica-{model}-1", NO_STREAM, [placed(model, 1)]),
                AppendRequest(f"model-{model}", NO_STREAM, [declared(model)]),
            ],
            ALICE,
        )

    assert await store.last_position() == before
    assert await store.read_stream(f"replica-{model}-1") == []


async def test_the_same_event_id_is_stored_once(store: EventStore) -> None:
    model = unique("m")
    event = declared(model)
    first = await store.append(f"model-{model}", NO_STREAM, [event], ALICE)
    again = await store.append(f"model-{model}", NO_STREAM, [event], ALICE)

    assert again == first
    assert len(await store.read_stream(f"model-{model}")) == 1


async def test_events_are_read_by_their_ids_in_log_order_with_their_meta(
    store: EventStore,
) -> None:
    model = unique("m")
    keyed = Meta(actor="alice", idempotency_key="k-1", request_digest="d" * 64)
    first = await store.append(f"model-{model}", NO_STREAM, [declared(model)], keyed)
    second = await store.append(f"replica-{model}-1", NO_STREAM, [placed(model, 1)], ALICE)

    found = await store.read_events([second[0].event_id, uuid.uuid4(), first[0].event_id])

    assert found == [first[0], second[0]]
    assert found[0].meta == keyed
    assert await store.read_events([uuid.uuid4()]) == []


async def test_state_is_the_fold_of_what_was_appended(store: EventStore) -> None:
    model = unique("m")
    node = unique("gpu-")
    await store.append(f"model-{model}", NO_STREAM, [declared(model)], ALICE)
    await store.append(
        f"node-{node}", None, [NewEvent(NodeRegistered(node_id=node, address="127.0.0.7"))], ALICE
    )
    await store.append(
        f"replica-{model}-1",
        NO_STREAM,
        [
            placed(model, 1, node),
            NewEvent(ShardStarting(replica_id=f"{model}-1", shard_index=0, node_id=node, pid=42)),
            NewEvent(ReplicaServing(replica_id=f"{model}-1")),
        ],
        ALICE,
    )

    state = await store.catch_up()
    replica = state.replicas[f"{model}-1"]
    assert replica.phase is ReplicaPhase.SERVING
    assert replica.shards[0].phase is ShardPhase.STARTING
    assert replica.shards[0].pid == 42
    assert state.models[model].replicas_created == 1
    assert state.nodes[node].address == "127.0.0.7"
    assert state.position == await store.last_position()


async def test_a_v1_payload_is_upcast_on_read(
    store: EventStore, write_legacy: LegacyWriter
) -> None:
    replica = unique("m") + "-1"
    v1 = msgspec.json.encode(
        {
            "type": "shard_failed",
            "replica_id": replica,
            "shard_index": 0,
            "node_id": "gpu-1",
            "error": "exit 1",
            "log": "loading weights\nCUDA out of memory\n",
        }
    )
    await write_legacy(f"replica-{replica}", 1, "shard_failed", 1, v1)

    (recorded,) = await store.read_stream(f"replica-{replica}")

    assert recorded.event == ShardFailed(
        replica_id=replica,
        shard_index=0,
        node_id="gpu-1",
        error="exit 1",
        log_tail=("loading weights", "CUDA out of memory"),
    )


async def test_a_nul_in_the_envelope_is_recorded_as_a_replacement_character(
    store: EventStore,
) -> None:
    """PostgreSQL's text and jsonb hold no U+0000: like one in a payload, one in the actor,
    the correlation or the cause (an agent's command id) is stored as U+FFFD, and the fold
    holds the envelope as the log gives it back."""
    model = unique("m")
    meta = Meta(actor="agent:gpu\x00", correlation_id="op\x00-1", causation_id="start-\x00")

    (recorded,) = await store.append(f"model-{model}", NO_STREAM, [declared(model)], meta)

    stored = Meta(actor="agent:gpu\ufffd", correlation_id="op\ufffd-1", causation_id="start-\ufffd")
    assert recorded.meta == stored
    assert [r.meta for r in await store.read_stream(f"model-{model}")] == [stored]
    assert [r.meta for r in await store.read_correlated("op\ufffd-1")] == [stored]


async def test_an_append_the_log_refuses_leaves_no_trace_in_the_fold(
    store: EventStore, write_legacy: LegacyWriter
) -> None:
    """The fold takes the events in before the log has them (the projection rows come from
    it), and puts back what they changed when the log refuses them: revocations too."""
    node = unique("gpu-")
    registered = NewEvent(NodeRegistered(node_id=node, address="127.0.0.1"))
    await store.append(f"node-{node}", NO_STREAM, [registered], ALICE)
    # Another server cordons the node meanwhile: this store's fold has not seen it yet.
    await write_legacy(f"node-{node}", 2, *encode_event(NodeCordoned(node_id=node, reason="")))
    revoked = NewEvent(CertificateRevoked(node_id=node, reason="its key leaked"))

    with pytest.raises(ConcurrencyError):
        await store.append(f"node-{node}", 1, [revoked], ALICE)

    state = await store.catch_up()
    assert state.nodes[node].cordoned
    assert revocation_key(None, node) not in state.revocations


async def test_an_append_another_servers_change_overtook_is_refused_and_leaves_no_trace(
    store: EventStore, write_legacy: LegacyWriter
) -> None:
    """A placement decided before another server cordoned its node: the node's stream is
    not appended at a version (agents write it), so the store asks ``still_holds`` on the
    log as the batch would be appended to it, once caught up with the cordon."""
    model, node = unique("m"), unique("gpu-")
    await store.append(f"model-{model}", NO_STREAM, [declared(model)], ALICE)
    registered = NewEvent(NodeRegistered(node_id=node, address="127.0.0.1"))
    await store.append(f"node-{node}", NO_STREAM, [registered], ALICE)
    asked: list[bool] = []

    def node_still_open(state: ClusterState) -> str | None:
        asked.append(state.nodes[node].cordoned)
        return f"node-{node}" if state.nodes[node].cordoned else None

    await write_legacy(f"node-{node}", 2, *encode_event(NodeCordoned(node_id=node, reason="")))

    with pytest.raises(ConcurrencyError) as caught:
        await store.append_many(
            [AppendRequest(f"replica-{model}-1", NO_STREAM, [placed(model, 1, node)])],
            ALICE,
            still_holds=node_still_open,
        )

    assert caught.value.stream == f"node-{node}"
    assert asked[-1] is True
    assert await store.read_stream(f"replica-{model}-1") == []
    state = await store.catch_up()
    assert state.nodes[node].cordoned
    assert f"{model}-1" not in state.replicas


async def test_concurrent_appenders_to_one_stream_one_wins(store: EventStore) -> None:
    model = unique("m")

    async def attempt() -> bool:
        try:
            await store.append(f"model-{model}", NO_STREAM, [declared(model)], ALICE)
        except ConcurrencyError:
            return False
        return True

    outcomes = await asyncio.gather(*(attempt() for _ in range(8)))

    assert outcomes.count(True) == 1
    assert len(await store.read_stream(f"model-{model}")) == 1


async def test_the_steps_of_one_operation_are_read_by_its_correlation_id(store: EventStore) -> None:
    node, drain = unique("gpu-"), unique("drain-")
    mine = Meta(actor="alice", correlation_id=drain)
    other = Meta(actor="bob", correlation_id=unique("req-"))
    first = NewEvent(NodeRegistered(node_id=node, address="127.0.0.1"))
    await store.append(f"node-{node}", NO_STREAM, [first], mine)
    await store.append(
        unique("node-"),
        NO_STREAM,
        [NewEvent(NodeRegistered(node_id="x", address="127.0.0.2"))],
        other,
    )
    second = NewEvent(ReplicaServing(replica_id=unique("m-")))
    await store.append(unique("replica-"), NO_STREAM, [second], mine)

    steps = await store.read_correlated(drain)

    assert [r.event_id for r in steps] == [first.event_id, second.event_id]
    assert await store.read_correlated(drain, limit=1) == steps[:1]
    assert await store.read_correlated(drain, limit=1, newest=True) == steps[1:]
    assert await store.read_correlated(drain, limit=5, newest=True) == steps
    assert await store.read_correlated(unique("drain-")) == []


async def test_an_append_decided_on_events_the_log_lost_is_refused_and_folded_again(
    store: EventStore, fail_over: FailOver
) -> None:
    """After a failover the log went on to the fold's position with other events: the
    position alone says the fold is current, the event at it says it is not."""
    kept, lost, other = unique("m"), unique("m"), unique("m")
    await store.append(f"model-{kept}", NO_STREAM, [declared(kept)], ALICE)
    await store.append(f"model-{lost}", NO_STREAM, [declared(lost)], ALICE)
    another_server = await fail_over(1)
    await another_server.append(f"model-{other}", NO_STREAM, [declared(other)], ALICE)
    assert await store.last_position() == store.state.position == 2

    await store.append(f"replica-{kept}-1", NO_STREAM, [placed(kept, 1)], ALICE)

    assert sorted(store.state.models) == sorted([kept, other])
    assert [r.stream for r in await store.read_all()] == [
        f"model-{kept}",
        f"model-{other}",
        f"replica-{kept}-1",
    ]


async def test_whether_an_ended_replica_is_among_those_asked_for_the_forgotten_ones_too(
    store: EventStore,
) -> None:
    # One replica of the model ended on its own node, then more than the fold keeps on
    # another: the first is forgotten; the model serves one more.
    model, first_node, node = unique("m"), unique("gpu-"), unique("gpu-")
    events = [ModelDeclared(model=model, spec=ModelSpec(name=model, command="c --port {port}"))]
    for number in range(1, ENDED_KEPT_PER_MODEL + 3):
        events += ended(model, number, first_node if number == 1 else node)
    events += serving(model, ENDED_KEPT_PER_MODEL + 3, node)
    await store.append_many(
        [AppendRequest(stream_of(e), None, [NewEvent(e)]) for e in events], ALICE
    )
    assert f"{model}-1" not in store.state.replicas, "forgotten by the fold"

    async def asked(among: ReplicaFilter) -> bool:
        return await store.any_ended_replica(among)

    assert await asked(ReplicaFilter(model=model)) is True
    assert await asked(ReplicaFilter(model=model, ended=False)) is True, "whatever ended says"
    assert await asked(ReplicaFilter(node_id=first_node)) is True
    assert await asked(ReplicaFilter(model=model, phase=ReplicaPhase.FAILED)) is True
    assert await asked(ReplicaFilter(model=model, phase=ReplicaPhase.LOST)) is False
    assert await asked(ReplicaFilter(model=model, phase=ReplicaPhase.SERVING)) is False
    assert await asked(ReplicaFilter(model=unique("m"))) is False
    assert await asked(ReplicaFilter(node_id=unique("gpu-"))) is False
