"""The query of docs/autoscaling.md, "why N replicas at 14:03", answers it: run against a
log holding a model's declaration and its autoscaler's decisions (and another model's),
each appended through the event store at its own time, it returns the decision in force
at the moment asked, with the figures that decided it.

The page's conventions are docs/audit.md's: the query is the ``sql`` block after
``<!-- query: count-at -->``, its psql variables are set in the block after
``<!-- variables -->``, and the values there are the ones this story is asked with.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Meta
from app.domain.events import ModelDeclared, ModelScaled, ScaleInputs, model_stream
from app.domain.model_spec import AutoscalePolicy, ModelSpec
from app.store.database import driver_url
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore

PAGE = Path(__file__).resolve().parents[2] / "docs" / "autoscaling.md"
QUERY = re.compile(r"<!-- query: count-at -->\n```sql\n(?P<sql>.*?)```", re.DOTALL)
VARIABLES = re.compile(r"<!-- variables -->\n```psql\n(?P<body>.*?)```", re.DOTALL)
SET_LINE = re.compile(r"^\\set (?P<name>\w+) '(?P<value>[^']*)'$")
QUOTED_VARIABLE = re.compile(r":'(?P<name>\w+)'")

MODEL = "llama-3.1-8b"
OTHER = "summarizer"
AUTOSCALER = "autoscaler"


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 3, 2, hour, minute, second, tzinfo=UTC)


def page() -> tuple[str, dict[str, str]]:
    text = PAGE.read_text()
    query, variables = QUERY.search(text), VARIABLES.search(text)
    assert query, f"no count-at query in {PAGE}"
    assert variables, f"no variables block in {PAGE}"
    values = {}
    for line in filter(None, variables["body"].splitlines()):
        match = SET_LINE.match(line)
        assert match, line
        values[match["name"]] = match["value"]
    return query["sql"], values


def bind(sql: str, values: dict[str, str]) -> str:
    """What psql sends: each ``:'name'`` as a quoted literal."""
    return QUOTED_VARIABLE.sub(lambda m: "'" + values[m["name"]].replace("'", "''") + "'", sql)


def scaled(
    model: str, previous: int, replicas: int, reason: str, figures: tuple[float, float, float]
) -> ModelScaled:
    """The autoscaler's decision, ``figures`` being the demand, the up window's mean and the
    down window's peak, at 6 requests a replica."""
    demand, mean, peak = figures
    inputs = ScaleInputs(
        demand=demand,
        per_replica=6,
        per_replica_from="target 6",
        up_window_mean=mean,
        down_window_max=peak,
        samples=41,
    )
    return ModelScaled(
        model=model, replicas=replicas, previous=previous, reason=reason, inputs=inputs
    )


async def record(
    engine: AsyncEngine, moment: datetime, actor: str, event: ModelDeclared | ModelScaled
) -> None:
    """Append ``event`` to its model's stream as ``actor`` did at ``moment``."""
    store = PostgresEventStore(engine, clock=lambda: moment, policy=None)
    await store.append(model_stream(event.model), None, [NewEvent(event)], Meta(actor=actor))


SPEC = ModelSpec(
    name=MODEL,
    command="vllm serve meta-llama/Llama-3.1-8B-Instruct --port {port}",
    replicas=2,
    autoscale=AutoscalePolicy(min_replicas=1, max_replicas=8, target=6, up_window_s=30),
)
UP_AT_1358 = "demand averaged 33.4 over 30s needs 6 replica(s) at 6 each"


async def a_morning_of_decisions(engine: AsyncEngine) -> None:
    await record(engine, at(13, 0), "bob", ModelDeclared(model=MODEL, spec=SPEC))
    await record(
        engine,
        at(13, 30, 5),
        AUTOSCALER,
        scaled(
            MODEL,
            2,
            4,
            "demand averaged 21.0 over 30s needs 4 replica(s) at 6 each",
            (22, 21.0, 22),
        ),
    )
    await record(
        engine,
        at(13, 58, 12),
        AUTOSCALER,
        scaled(
            MODEL,
            4,
            6,
            UP_AT_1358,
            (36, 33.4, 36),
        ),
    )
    other = ModelSpec(name=OTHER, command="vllm serve x --port {port}", replicas=0)
    await record(engine, at(14, 1), "bob", ModelDeclared(model=OTHER, spec=other))
    await record(
        engine,
        at(14, 2, 40),
        "alice",
        ModelScaled(model=OTHER, replicas=1, previous=0),
    )
    await record(
        engine,
        at(14, 20),
        AUTOSCALER,
        scaled(
            MODEL,
            6,
            4,
            "demand at most 20.0 over 300s needs 4 replica(s) at 6 each",
            (12, 13.0, 20.0),
        ),
    )


async def ask(database_url: str, sql: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(driver_url(database_url))
    try:
        return list(await connection.fetch(sql))
    finally:
        await connection.close()


async def test_the_count_at_a_moment_is_the_last_decision_before_it_with_its_figures(
    engine: AsyncEngine, database_url: str
) -> None:
    await a_morning_of_decisions(engine)
    sql, values = page()
    assert values["model"] == MODEL
    assert values["at"] == "2026-03-02 14:03:00+00"

    (row,) = await ask(database_url, bind(sql, values))

    assert dict(row) == {
        "decided_at": at(13, 58, 12),
        "actor": AUTOSCALER,
        "previous": 4,
        "replicas": 6,
        "reason": UP_AT_1358,
        "demand": 36.0,
        "up_window_mean": 33.4,
        "down_window_max": 36.0,
        "per_replica": 6.0,
        "per_replica_from": "target 6",
    }


async def test_before_any_decision_the_count_is_the_declared_one(
    engine: AsyncEngine, database_url: str
) -> None:
    await a_morning_of_decisions(engine)
    sql, values = page()

    (row,) = await ask(database_url, bind(sql, values | {"at": "2026-03-02 13:10:00+00"}))

    assert (row["decided_at"], row["actor"], row["replicas"]) == (at(13, 0), "bob", 2)
    assert row["previous"] is None
    assert row["demand"] is None
