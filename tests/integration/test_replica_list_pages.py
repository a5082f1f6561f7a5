"""`GET /admin/v1/replicas` over PostgreSQL, for a fleet whose history outgrew the fold:
the replicas that exist without the ended ones (`ended=false`), saying whether it left any
out, and every replica, the forgotten ones too, a page at a time (`after`, `limit`), each
once and in order."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest_asyncio

from app.domain.state import ENDED_KEPT_PER_MODEL
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client, problem_of, seed_node, serving_admin
from tests.support.replica_history import declared, ended, record_at_once, serving
from tests.support.replica_pages import ids, listed, paged

TOKEN = secrets.token_hex(16)
K = ENDED_KEPT_PER_MODEL
NODE = "gpu-1"
LEFT_OUT = "x-ended-replicas-left-out"


@dataclass(frozen=True)
class Fleet:
    active: list[str]
    """The replicas not ended, in listing order."""
    every: list[str]
    """Every replica, in listing order."""
    forgotten: list[str]
    """Ended replicas the fold no longer holds."""


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(pg_store, tokens={TOKEN: "alice"}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def fleet(pg_store: PostgresEventStore) -> Fleet:
    """Three models, each with replicas serving and more that ended: llama ended K + 3
    more than the fold keeps, llama3a 2 more. Byte by byte ``llama-3b`` sorts before
    ``llama3a``; by a language's collation it may not."""
    await seed_node(pg_store, NODE)
    numbers = {"llama": 2 * K + 5, "llama-3b": 3, "llama3a": K + 4}
    events = [declared(model) for model in numbers]
    for model, last in numbers.items():
        events += serving(model, 1, NODE)
        for number in range(2, last):
            events += ended(model, number, NODE)
        events += serving(model, last, NODE)
    await record_at_once(pg_store, events)
    every = [f"{model}-{n}" for model in sorted(numbers) for n in range(1, numbers[model] + 1)]
    active = [f"{model}-{n}" for model in sorted(numbers) for n in (1, numbers[model])]
    forgotten = [r for r in every if r not in pg_store.state.replicas]
    assert len(forgotten) == K + 3 + 2
    return Fleet(active=active, every=every, forgotten=forgotten)


async def test_without_ended_replicas_only_those_that_exist_are_listed(
    admin: httpx.AsyncClient, fleet: Fleet
) -> None:
    assert ids(await listed(admin, "ended=false")) == fleet.active
    assert ids(await listed(admin, "ended=false&model=llama")) == ["llama-1", f"llama-{2 * K + 5}"]
    assert ids(await listed(admin, f"ended=false&node={NODE}&phase=serving")) == fleet.active
    assert ids(await listed(admin, "ended=true")) == fleet.every
    assert ids(await listed(admin, "")) == fleet.every, "ended ones are listed unless left out"


async def left_out(admin: httpx.AsyncClient, query: str) -> str | None:
    answer = await admin.get(f"/admin/v1/replicas?{query}")
    assert answer.status_code == 200, answer.text
    return answer.headers.get(LEFT_OUT)


async def test_a_list_without_ended_replicas_says_whether_it_left_any_out(
    admin: httpx.AsyncClient, fleet: Fleet, pg_store: PostgresEventStore
) -> None:
    # qwen serves on gpu-2 and never ended a replica; old ended one on gpu-9, which the
    # fold forgot once K more of old ended on gpu-1.
    await seed_node(pg_store, "gpu-2")
    await seed_node(pg_store, "gpu-9")
    events = [declared("qwen"), *serving("qwen", 1, "gpu-2"), declared("old")]
    events += ended("old", 1, "gpu-9")
    for number in range(2, K + 2):
        events += ended("old", number, NODE)
    await record_at_once(pg_store, events)
    assert "old-1" not in pg_store.state.replicas, "forgotten by the fold"

    assert await left_out(admin, "ended=false") == "true"
    assert await left_out(admin, "ended=false&model=llama-3b") == "true"
    assert await left_out(admin, "ended=false&model=llama&after=llama-1&limit=1") == "true"
    assert await left_out(admin, "ended=false&node=gpu-9") == "true", "one the fold forgot"
    assert await left_out(admin, "ended=false&phase=stopped") == "true"
    assert await left_out(admin, "ended=false&phase=serving") == "false"
    assert await left_out(admin, "ended=false&model=qwen") == "false"
    assert await left_out(admin, "ended=false&node=gpu-2") == "false"
    assert await left_out(admin, "ended=false&model=nobody") == "false"
    assert await left_out(admin, "ended=false&model=old&phase=timed_out") == "false"
    assert await left_out(admin, "ended=true") is None, "nothing was left out"
    assert await left_out(admin, "") is None


async def test_an_ended_phase_with_ended_replicas_left_out_matches_none(
    admin: httpx.AsyncClient, fleet: Fleet
) -> None:
    assert await listed(admin, "ended=false&phase=stopped") == []
    assert await listed(admin, "ended=false&phase=failed&limit=5") == []


async def test_pages_list_every_replica_once_in_order_the_forgotten_ones_too(
    admin: httpx.AsyncClient, fleet: Fleet
) -> None:
    whole = await listed(admin, "")
    assert ids(whole) == fleet.every
    assert set(fleet.forgotten) <= set(ids(whole))

    assert await paged(admin, "", 7) == whole
    assert await paged(admin, "", 1) == whole
    assert await paged(admin, "", len(whole)) == whole
    for query in ("model=llama&", "phase=stopped&", f"node={NODE}&", "ended=false&"):
        assert await paged(admin, query, 4) == await listed(admin, query), query


async def test_a_page_starts_after_a_forgotten_replica_or_one_of_another_filter(
    admin: httpx.AsyncClient, fleet: Fleet
) -> None:
    assert "llama-2" in fleet.forgotten
    after_forgotten = await listed(admin, "after=llama-2&limit=3")
    assert ids(after_forgotten) == ["llama-3", "llama-4", "llama-5"]
    # A serving replica may start a page of ended ones, and the other way round.
    assert ids(await listed(admin, "phase=failed&after=llama-1&limit=2")) == ["llama-3", "llama-5"]
    assert ids(await listed(admin, "ended=false&after=llama-2")) == fleet.active[1:]
    last = fleet.every[-1]
    assert await listed(admin, f"after={last}&limit=10") == []


async def test_a_page_start_the_log_does_not_know_is_refused_saying_which(
    admin: httpx.AsyncClient, fleet: Fleet
) -> None:
    problem = problem_of(await admin.get("/admin/v1/replicas?after=llama-999&limit=5"), 404)

    assert problem["title"] == "unknown-replica"
    assert problem["id"] == "llama-999"
    assert problem["detail"] == "no replica (by id) to list the replicas after 'llama-999' is known"


async def test_a_page_size_or_start_of_the_wrong_shape_is_refused_saying_why(
    admin: httpx.AsyncClient, fleet: Fleet
) -> None:
    for query, said in (
        ("limit=0", "limit: Expected `int` >= 1"),
        ("limit=5001", "limit: Expected `int` <= 5000"),
        ("limit=ten", "limit: Expected `int | null`, got `str`"),
        ("after=", "after: Expected `str` of length >= 1"),
        (f"after={'x' * 129}", "after: Expected `str` of length <= 128"),
        ("ended=maybe", "ended: Expected `bool`, got `str`"),
    ):
        problem = problem_of(await admin.get(f"/admin/v1/replicas?{query}"), 400)

        assert problem["detail"] == said, query
        assert [e["key"] for e in problem["errors"]] == [said.split(":")[0]], query


async def test_the_schema_says_how_the_list_is_paged_and_filtered(
    admin: httpx.AsyncClient,
) -> None:
    schema = (await admin.get("/admin/v1/schema/openapi.json")).json()
    listing = schema["paths"]["/admin/v1/replicas"]["get"]
    parameters = {p["name"]: p for p in listing["parameters"]}

    assert {"ended", "after", "limit"} <= set(parameters)
    assert "ended phase" in parameters["ended"]["description"]
    ended = parameters["ended"]["schema"]
    assert (ended["type"], ended["default"]) == ("boolean", True)
    limit, after = parameters["limit"]["schema"], parameters["after"]["schema"]
    assert (limit["minimum"], limit["maximum"]) == (1, 5000)
    assert (after["minLength"], after["maxLength"]) == (1, 128)
    assert "unknown-replica" in listing["responses"]["404"]["description"]
    header = listing["responses"]["200"]["headers"]["X-Ended-Replicas-Left-Out"]
    assert "ended=false" in header["description"]
    assert header["schema"]["type"] == "string"
