"""docs/audit.md cannot rot: every query in it runs against the seeded history
(tests/support/seed.py) and must return exactly the rows that story implies.

The guide's conventions, which this module parses:

- each query is a fenced ``sql`` block right after a ``<!-- query: NAME -->`` line;
- inputs are psql variables written ``:'name'``, set in the ``psql`` block after the
  ``<!-- variables -->`` line. Like psql, the test substitutes each as a quoted literal,
  and the values there must be the seeded ones, so the guide's examples are true of the
  story too.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from app.domain.envelope import Meta
from app.domain.events import (
    GpuRecovered,
    ReplicaPlaced,
    ReplicaStartupTimedOut,
    ShardPlacement,
    ShardStarting,
    ShardStopped,
    node_stream,
    replica_stream,
)
from app.store.database import create_engine
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.postgres import PostgresServer
from tests.support.seed import (
    RECONCILER,
    TIMED_OUT_LOG_TAIL,
    SeededDatabase,
    SeededHistory,
    agent,
    h100,
    seeded_database,
    utc,
)

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "audit.md"

QUERY_BLOCK = re.compile(r"<!-- query: (?P<name>[\w-]+) -->\n```sql\n(?P<sql>.*?)```", re.DOTALL)
VARIABLES_BLOCK = re.compile(r"<!-- variables -->\n```psql\n(?P<body>.*?)```", re.DOTALL)
SET_LINE = re.compile(r"^\\set (?P<name>\w+) '(?P<value>[^']*)'$")
QUOTED_VARIABLE = re.compile(r":'(?P<name>\w+)'")
BARE_VARIABLE = re.compile(r"(?<![:\w]):[A-Za-z_]\w*")


@dataclass(frozen=True)
class Guide:
    variables: dict[str, str]
    queries: dict[str, str]
    sql_blocks: int


def read_guide() -> Guide:
    text = GUIDE.read_text()
    variables_block = VARIABLES_BLOCK.search(text)
    assert variables_block, f"{GUIDE} has no <!-- variables --> psql block"
    variables: dict[str, str] = {}
    for line in filter(None, variables_block["body"].splitlines()):
        set_line = SET_LINE.match(line)
        assert set_line, f"not a \\set line: {line!r}"
        variables[set_line["name"]] = set_line["value"]
    queries: dict[str, str] = {}
    for block in QUERY_BLOCK.finditer(text):
        assert block["name"] not in queries, f"two queries named {block['name']}"
        queries[block["name"]] = block["sql"]
    return Guide(variables, queries, sql_blocks=text.count("```sql"))


def bind(sql: str, variables: dict[str, str]) -> str:
    """What psql sends for ``sql``: each ``:'name'`` replaced by its value, quoted."""

    def literal(match: re.Match[str]) -> str:
        value = variables[match["name"]]
        return "'" + value.replace("'", "''") + "'"

    bound = QUOTED_VARIABLE.sub(literal, sql)
    assert not BARE_VARIABLE.search(bound), f"a psql variable this guide does not set: {bound}"
    return bound


GUIDE_AT_IMPORT = read_guide()

Row = tuple[object, ...]


@dataclass(frozen=True)
class Answer:
    """Rows a query must return. A ``position`` column is checked for order only (it is
    not part of the story), so ``rows`` leave it out."""

    columns: tuple[str, ...]
    rows: Sequence[Row]


def expected_answers(story: SeededHistory) -> dict[str, Answer]:
    drain, alice, bob = story.drain_id, story.operator, story.setup_operator
    old, new = story.drained_replica, story.replacement
    return {
        "drains-of-a-node": Answer(
            ("requested_at", "requested_by", "drain_id", "grace_s", "finished_at", "outcome"),
            [(utc(3, 5, 16, 0), alice, drain, 900.0, utc(3, 5, 16, 1, 45), "moved 1 replica")],
        ),
        "one-operation": Answer(
            ("position", "recorded_at", "actor", "type", "subject", "replaces"),
            [
                (utc(3, 5, 16, 0), alice, "node_drain_requested", "gpu-08", None),
                (utc(3, 5, 16, 0, 1), "reconciler", "replica_drain_started", old, None),
                (utc(3, 5, 16, 0, 1), "reconciler", "replica_placed", new, old),
                (utc(3, 5, 16, 1, 31), "reconciler", "replacement_serving", old, None),
                (utc(3, 5, 16, 1, 31), "reconciler", "replica_stopping", old, None),
                (utc(3, 5, 16, 1, 45), "reconciler", "replica_stopped", old, None),
                (utc(3, 5, 16, 1, 45), "reconciler", "node_drain_finished", "gpu-08", None),
            ],
        ),
        "startup-timeouts": Answer(
            (
                "timed_out_at",
                "replica_id",
                "model",
                "waited_s",
                "node_id",
                "shard",
                "error",
                "log_tail",
            ),
            [
                (
                    utc(3, 3, 14, 5, 3),
                    story.timed_out_replica,
                    "qwen-2-7b",
                    300.0,
                    "gpu-08",
                    0,
                    "killed after the startup timeout",
                    list(TIMED_OUT_LOG_TAIL),
                )
            ],
        ),
        "reconciler-decisions": Answer(
            ("position", "recorded_at", "type", "subject", "correlation_id"),
            [
                (utc(3, 3, 14, 0, 1), "replica_placed", "qwen-2-7b-2", None),
                (utc(3, 3, 14, 5, 3), "replica_startup_timed_out", "qwen-2-7b-2", None),
                (utc(3, 3, 14, 5, 6), "replica_placed", "qwen-2-7b-3", None),
                (utc(3, 3, 14, 6, 21), "replica_serving", "qwen-2-7b-3", None),
                (utc(3, 5, 16, 0, 1), "replica_drain_started", old, drain),
                (utc(3, 5, 16, 0, 1), "replica_placed", new, drain),
                (utc(3, 5, 16, 1, 30), "replica_serving", new, None),
                (utc(3, 5, 16, 1, 31), "replacement_serving", old, drain),
                (utc(3, 5, 16, 1, 31), "replica_stopping", old, drain),
                (utc(3, 5, 16, 1, 45), "replica_stopped", old, drain),
                (utc(3, 5, 16, 1, 45), "node_drain_finished", "gpu-08", drain),
            ],
        ),
        "operator-actions": Answer(
            ("position", "recorded_at", "actor", "type", "subject", "correlation_id"),
            [
                (utc(3, 3, 14, 0), bob, "model_scaled", "qwen-2-7b", None),
                (utc(3, 5, 16, 0), alice, "node_drain_requested", "gpu-08", drain),
                (utc(3, 6, 11, 0), alice, "api_key_revoked", story.revoked_key, None),
                (utc(3, 6, 11, 2), alice, "api_key_created", story.created_key, None),
            ],
        ),
        "api-key-changes": Answer(
            ("recorded_at", "actor", "type", "key_id", "name", "prefix"),
            [
                (
                    utc(2, 24, 10, 0),
                    bob,
                    "api_key_created",
                    "k-ci-7f3a",
                    "ci-pipeline",
                    "llmgw_7f3a",
                ),
                (
                    utc(3, 6, 11, 0),
                    alice,
                    "api_key_revoked",
                    "k-ci-7f3a",
                    "ci-pipeline",
                    "llmgw_7f3a",
                ),
                (
                    utc(3, 6, 11, 2),
                    alice,
                    "api_key_created",
                    "k-support-91b0",
                    "support-bot",
                    "llmgw_91b0",
                ),
            ],
        ),
        "gpu-health": Answer(
            ("marked_at", "node_id", "gpu", "reason", "xid", "recovered_at"),
            [
                (
                    utc(2, 26, 3, 12),
                    "gpu-07",
                    3,
                    "Xid 48: double-bit ECC error",
                    48,
                    utc(2, 26, 7, 40),
                ),
                (utc(3, 2, 10, 0), "gpu-08", 1, "Xid 79: GPU has fallen off the bus", 79, None),
            ],
        ),
        "unhealthy-gpus-now": Answer(
            ("node_id", "gpu", "uuid", "reason"),
            [("gpu-08", 1, "GPU-00000001-h100", "Xid 79: GPU has fallen off the bus")],
        ),
        "refused-identities": Answer(
            ("recorded_at", "claimed_node_id", "certificate_subject", "remote_address", "reason"),
            [
                (
                    utc(3, 4, 9, 30),
                    "gpu-07",
                    "O=llmgw,CN=gpu-12",
                    "127.0.3.12:50412",
                    "the certificate names gpu-12, not the node id claimed",
                )
            ],
        ),
        "replica-life": Answer(
            ("position", "recorded_at", "replica_id", "type", "actor", "node_id", "correlation_id"),
            [
                (utc(2, 23, 9, 6), old, "replica_placed", "reconciler", None, None),
                (utc(2, 23, 9, 6, 2), old, "shard_starting", "agent:gpu-08", "gpu-08", None),
                (utc(2, 23, 9, 7, 40), old, "shard_ready", "agent:gpu-08", "gpu-08", None),
                (utc(2, 23, 9, 7, 41), old, "replica_serving", "reconciler", None, None),
                (utc(3, 5, 16, 0, 1), old, "replica_drain_started", "reconciler", None, drain),
                (utc(3, 5, 16, 0, 1), new, "replica_placed", "reconciler", None, drain),
                (utc(3, 5, 16, 1, 31), old, "replacement_serving", "reconciler", None, drain),
                (utc(3, 5, 16, 1, 31), old, "replica_stopping", "reconciler", None, drain),
                (utc(3, 5, 16, 1, 45), old, "shard_stopped", "agent:gpu-08", "gpu-08", None),
                (utc(3, 5, 16, 1, 45), old, "replica_stopped", "reconciler", None, drain),
            ],
        ),
        "chain-check": Answer(
            ("position", "holds", "linked"),
            [(True, True)] * sum(len(positions) for positions in story.positions.values()),
        ),
        "routable-now": Answer(
            ("replica_id", "model", "node_id", "address", "port", "weight", "draining", "revision"),
            [
                ("llama-3-8b-1", "llama-3-8b", "gpu-07", "127.0.3.7", 20000, 1.0, False, 1),
                ("llama-3-8b-3", "llama-3-8b", "gpu-07", "127.0.3.7", 20003, 1.0, False, 1),
                ("qwen-2-7b-1", "qwen-2-7b", "gpu-07", "127.0.3.7", 20001, 1.0, False, 1),
                ("qwen-2-7b-3", "qwen-2-7b", "gpu-07", "127.0.3.7", 20002, 1.0, False, 1),
            ],
        ),
    }


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def seeded(
    postgres_server: PostgresServer, migrated_template: str
) -> AsyncIterator[SeededDatabase]:
    """One database holding the story, shared by this module's tests: they only read."""
    async with seeded_database(postgres_server, migrated_template) as database:
        yield database


@pytest_asyncio.fixture(loop_scope="session")
async def auditor(seeded: SeededDatabase) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection, as psql would have, reading jsonb as JSON values."""
    connection = await asyncpg.connect(seeded.url)
    await connection.set_type_codec(
        "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
    )
    yield connection
    await connection.close()


def test_every_sql_block_in_the_guide_is_a_named_query_with_an_expected_answer() -> None:
    assert GUIDE_AT_IMPORT.sql_blocks == len(GUIDE_AT_IMPORT.queries) >= 6
    assert set(GUIDE_AT_IMPORT.queries) == set(expected_answers(SeededHistory()))


def test_the_guides_example_values_are_the_seeded_ones(seeded: SeededDatabase) -> None:
    assert GUIDE_AT_IMPORT.variables == seeded.story.psql_variables


@pytest.mark.parametrize("name", sorted(GUIDE_AT_IMPORT.queries))
async def test_the_query_answers_what_the_story_implies(
    name: str, seeded: SeededDatabase, auditor: asyncpg.Connection
) -> None:
    expected = expected_answers(seeded.story)[name]
    sql = bind(GUIDE_AT_IMPORT.queries[name], seeded.story.psql_variables)

    records = await auditor.fetch(sql)

    assert records, f"{name} returned no rows"
    assert tuple(records[0].keys()) == expected.columns
    if "position" in expected.columns:
        positions = [record["position"] for record in records]
        assert positions == sorted(set(positions)), "rows are not in log order"
        rows = [tuple(v for k, v in record.items() if k != "position") for record in records]
    else:
        rows = [tuple(record.values()) for record in records]
    assert rows == [tuple(row) for row in expected.rows]


@pytest.mark.parametrize(
    "time",
    ["infinity", "-infinity", "294276-12-31 23:59:59+00", "12026-03-02 09:00:00+00"],
    ids=["infinity", "minus-infinity", "last-representable", "beyond-year-9999"],
)
async def test_the_chain_check_flags_a_row_whose_time_was_rewritten(
    postgres_server: PostgresServer, migrated_template: str, time: str
) -> None:
    """Even to a time no append could have hashed: the query flags that row, not fails."""
    async with seeded_database(postgres_server, migrated_template) as database:
        positions = sorted(p for stream in database.story.positions.values() for p in stream)
        edited = positions[len(positions) // 2]
        connection = await asyncpg.connect(database.url)
        try:
            async with connection.transaction():
                await connection.execute("SET LOCAL session_replication_role = replica")
                await connection.execute(
                    "UPDATE events SET recorded_at = $1::text::timestamptz WHERE position = $2",
                    time,
                    edited,
                )
            sql = bind(GUIDE_AT_IMPORT.queries["chain-check"], database.story.psql_variables)
            records = await connection.fetch(sql)
        finally:
            await connection.close()

    assert [record["position"] for record in records] == positions
    flagged = [tuple(record.values()) for record in records if record["holds"] is not True]
    assert flagged == [(edited, False, True)]


async def test_a_gpu_recovered_under_another_index_is_its_recovery_not_another_gpu_s(
    postgres_server: PostgresServer, migrated_template: str
) -> None:
    """gpu-08's GPU 1 fell off the bus. After a driver reload another GPU is listed under
    index 1 (a log written before hellos judged GPUs by UUID recorded it as recovered), and
    the GPU that fell off is back, healthy, under index 2."""
    fell_off = h100(1).uuid
    another_at_its_index = GpuRecovered(node_id="gpu-08", gpu_index=1, gpu_uuid="GPU-other")
    back_elsewhere = GpuRecovered(node_id="gpu-08", gpu_index=2, gpu_uuid=fell_off)
    async with seeded_database(postgres_server, migrated_template) as database:
        engine = create_engine(database.url, pool_size=1)
        try:
            for moment, event in (
                (utc(3, 11, 9, 0), another_at_its_index),
                (utc(3, 11, 9, 5), back_elsewhere),
            ):
                store = PostgresEventStore(engine, clock=lambda moment=moment: moment)
                request = AppendRequest(node_stream("gpu-08"), None, [NewEvent(event)])
                await store.append_many([request], Meta(actor=agent("gpu-08")))
        finally:
            await engine.dispose()
        connection = await asyncpg.connect(database.url)
        try:
            sql = bind(GUIDE_AT_IMPORT.queries["gpu-health"], database.story.psql_variables)
            records = await connection.fetch(sql)
        finally:
            await connection.close()

    fell_off_rows = [tuple(r.values()) for r in records if r["node_id"] == "gpu-08"]
    assert fell_off_rows == [
        (utc(3, 2, 10, 0), "gpu-08", 1, "Xid 79: GPU has fallen off the bus", 79, utc(3, 11, 9, 5))
    ]


async def test_a_replica_stopped_at_its_startup_timeout_shows_its_engines_last_lines(
    postgres_server: PostgresServer, migrated_template: str
) -> None:
    """An agent stops a shard that never became ready, when the control plane times it
    out, and reports its engine's last lines with the stop (no shard failed)."""
    replica = "qwen-2-7b-9"
    last_lines = ("loading weights 40%", "CUDA out of memory")
    placed = ReplicaPlaced(
        replica_id=replica,
        model="qwen-2-7b",
        number=9,
        shards=(ShardPlacement(index=0, node_id="gpu-07", gpus=(2,), port=20009),),
    )
    timed_out = ReplicaStartupTimedOut(replica_id=replica, timeout_s=300.0, waited_s=301.0)
    stopped = ShardStopped(replica_id=replica, shard_index=0, node_id="gpu-07", log_tail=last_lines)
    steps = (
        (utc(3, 6, 9, 0), RECONCILER, placed),
        (
            utc(3, 6, 9, 0, 2),
            agent("gpu-07"),
            ShardStarting(replica_id=replica, shard_index=0, node_id="gpu-07"),
        ),
        (utc(3, 6, 9, 5, 1), RECONCILER, timed_out),
        (utc(3, 6, 9, 5, 3), agent("gpu-07"), stopped),
    )
    async with seeded_database(postgres_server, migrated_template) as database:
        engine = create_engine(database.url, pool_size=1)
        try:
            for moment, actor, event in steps:
                store = PostgresEventStore(engine, clock=lambda moment=moment: moment)
                request = AppendRequest(replica_stream(replica), None, [NewEvent(event)])
                await store.append_many([request], Meta(actor=actor))
        finally:
            await engine.dispose()
        connection = await asyncpg.connect(database.url)
        try:
            sql = bind(GUIDE_AT_IMPORT.queries["startup-timeouts"], database.story.psql_variables)
            records = await connection.fetch(sql)
        finally:
            await connection.close()

    rows = [r for r in records if r["replica_id"] == replica]
    assert [(r["node_id"], r["shard"], r["error"]) for r in rows] == [("gpu-07", 0, None)]
    assert json.loads(rows[0]["log_tail"]) == list(last_lines)
