"""The admin API against inputs generated from its own OpenAPI schema (schemathesis): for
every operation, valid and invalid requests alike, the server never answers 5xx, a
request it refuses (4xx) appends nothing to the log, and every status it answers is one the
schema declares for that operation (a client generated from the schema reads no other).

The server runs in the test's event loop; schemathesis's blocking client runs in a worker
thread and reads the log's last position through that loop."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis.strategies import SearchStrategy
from schemathesis import Case, GenerationMode
from schemathesis.core.result import Err

from app.store.postgres import PostgresEventStore
from tests.support.admin_server import last_position, seed_node, seed_serving_replica, serving_admin

TOKEN = secrets.token_hex(16)
EXAMPLES_PER_STRATEGY = 12
"""About 20 operations x 2 or 3 strategies x 12 examples: well under a minute on 2 cores."""
SEEDED = {
    "name": "llama",
    "node_id": "gpu-1",
    "replica_id": "llama-1",
    "subject": "replica",
    "key": "llama-1",
    "drain_id": "drain-0",
    "prefix_or_name": "ci",
    "gpu": "0",
}
"""Path parameters that name what the test seeds."""
SPEC = {"command": "vllm serve {model} --port {port}", "replicas": 1}

pytestmark = pytest.mark.timeout(240)


def fuzz(base_url: str, position: Callable[[], int]) -> list[str]:
    """Every operation: valid requests, invalid ones, and valid ones aimed at the seeded
    things (random names would find only 404s). The problems found, one line each."""
    schema = schemathesis.openapi.from_url(f"{base_url}/admin/v1/schema/openapi.json")
    problems: list[str] = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            problems.append(f"the schema has an unusable operation: {result.err()}")
            continue
        operation = result.ok()
        aimed = {p: SEEDED[p] for p in re.findall(r"{(\w+)}", operation.path)}
        strategies = [
            operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
            operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
        ]
        if aimed:
            strategies.append(operation.as_strategy(path_parameters=aimed))
        for strategy in strategies:
            # Unsatisfiable: nothing in the operation can be made invalid (no parameters).
            with contextlib.suppress(Unsatisfiable):
                exercise(strategy, base_url, position, problems)
    return problems


def exercise(
    strategy: SearchStrategy[Case[Any]],
    base_url: str,
    position: Callable[[], int],
    problems: list[str],
) -> None:
    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES_PER_STRATEGY,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    def call(case: Case[Any]) -> None:
        if case.path == "/admin/v1/events":
            # A followed stream never ends; its pages are what can be fuzzed.
            case.query = {**(case.query or {}), "follow": "false"}
        before = position()
        response = case.call(
            base_url=base_url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=10
        )
        where = f"{case.method} {case.formatted_path} {case.query} {case.body!r:.200}"
        if response.status_code >= 500:
            problems.append(f"{where} -> {response.status_code} {response.text:.300}")
        if str(response.status_code) not in case.operation.definition.raw["responses"]:
            problems.append(f"{where} -> {response.status_code}, which the schema does not declare")
        elif 400 <= response.status_code < 500 and position() != before:
            problems.append(f"{where} -> {response.status_code} but appended events")

    call()


async def test_no_generated_request_gets_a_5xx_an_undeclared_status_or_writes_when_refused(
    pg_store: PostgresEventStore,
) -> None:
    # Something to find: a node, a model and a serving replica under plain names.
    await seed_node(pg_store, "gpu-1")
    async with serving_admin(pg_store, tokens={TOKEN: "fuzzer"}) as url:
        loop = asyncio.get_running_loop()

        def position() -> int:
            return asyncio.run_coroutine_threadsafe(last_position(pg_store), loop).result(10)

        async with httpx.AsyncClient(
            base_url=url, headers={"authorization": f"Bearer {TOKEN}"}
        ) as admin:
            assert (await admin.put("/admin/v1/models/llama", json=SPEC)).status_code == 200
        await seed_serving_replica(pg_store, "llama-1", "gpu-1")

        problems = await asyncio.to_thread(fuzz, url, position)

    assert problems == []


# -- what it found, kept as examples ------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/admin/v1/history/node/gpu-1?after=9223372036854775808", None, 400),
        ("GET", "/admin/v1/history/replica/%00", None, 200),
        ("GET", "/admin/v1/drains/%00", None, 404),
        ("PUT", "/admin/v1/models/big", {**SPEC, "routing": {"target_waiting": 2**40}}, 422),
    ],
)
async def test_inputs_the_database_cannot_take_are_answered_without_a_5xx(
    pg_store: PostgresEventStore, method: str, path: str, body: object, status: int
) -> None:
    await seed_node(pg_store, "gpu-1")
    before = await last_position(pg_store)
    async with (
        serving_admin(pg_store, tokens={TOKEN: "fuzzer"}) as url,
        httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {TOKEN}"}) as admin,
    ):
        answer = await admin.request(method, path, json=body)

    assert answer.status_code == status, answer.text
    assert await last_position(pg_store) == before
