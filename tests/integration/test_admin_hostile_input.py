"""Hostile bodies at the admin API: the Litestar app served by uvicorn on a loopback socket,
over real HTTP, against a fresh PostgreSQL database per test.

Each story sends what an attacker (or a broken script) would: JSON nested a thousand deep,
strings where numbers belong, bodies of many megabytes, numbers at the edge of what a float
holds. Each gets a clear 4xx naming what is wrong, and the log is left as it was.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from app.admin.bodies import MAX_BODY_BYTES, MAX_BODY_DEPTH
from app.listeners.throttle import FailureLimits
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import (
    bearer_client,
    last_position,
    problem_of,
    seed_node,
    serving_admin,
)

TOKEN = secrets.token_hex(16)
COMMAND = "vllm serve {model} --port {port}"


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(pg_store, tokens={TOKEN: "alice"}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        yield client


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


async def seeded(admin: httpx.AsyncClient, store: PostgresEventStore) -> int:
    """A node and a declared model to aim requests at; the log's position after them."""
    await seed_node(store, "gpu-1")
    declared = await admin.put("/admin/v1/models/llama", json={"command": COMMAND})
    assert declared.status_code == 200, declared.text
    return await last_position(store)


# -- JSON nested deeper than anything the API reads --------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/admin/v1/nodes/gpu-1/drain", '{"grace_s": 60, "x": %s}'),
        ("POST", "/admin/v1/nodes/gpu-1/cordon", '{"reason": "r", "x": %s}'),
        ("POST", "/admin/v1/models/llama/scale", '{"replicas": 2, "x": %s}'),
        ("PUT", "/admin/v1/models/llama", '{"command": "x", "env": %s}'),
        ("POST", "/admin/v1/placement", '{"command": "x", "env": %s}'),
        ("POST", "/admin/v1/keys", '{"name": "k", "models": ["*"], "x": %s}'),
        (
            "POST",
            "/admin/v1/models/llama/tuning",
            '{"weight": 1, "target_waiting": 2, "kv_ceiling": 0.5, "summary": {"a": %s}}',
        ),
    ],
    ids=["drain", "cordon", "scale", "apply", "placement", "key", "tuning"],
)
@pytest.mark.parametrize("depth", [MAX_BODY_DEPTH + 1, 1000, 100_000])
async def test_json_nested_too_deep_is_a_400_and_records_nothing(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    method: str,
    path: str,
    body: str,
    depth: int,
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.request(method, path, content=body % nested(depth))

    problem = problem_of(answer, 400)
    assert f"more than {MAX_BODY_DEPTH} levels deep" in problem["detail"]
    assert await last_position(pg_store) == before


async def test_json_as_deep_as_the_limit_is_read(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seeded(admin, pg_store)
    summary = "1"
    for _ in range(MAX_BODY_DEPTH - 1):
        summary = f'{{"a": {summary}}}'
    body = f'{{"weight": 2, "target_waiting": 3, "kv_ceiling": 0.5, "summary": {summary}}}'

    answer = await admin.post("/admin/v1/models/llama/tuning", content=body)

    assert answer.status_code == 200, answer.text
    assert answer.json()["changed"] is True


# -- strict types: a string is not a number ----------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/admin/v1/nodes/gpu-1/drain", {"grace_s": "10"}, "grace_s"),
        ("/admin/v1/nodes/gpu-1/drain", {"grace_s": True}, "grace_s"),
        ("/admin/v1/nodes/gpu-1/cordon", {"reason": 5}, "reason"),
        ("/admin/v1/models/llama/scale", {"replicas": "3"}, "replicas"),
        ("/admin/v1/models/llama/scale", {"replicas": 3.0}, "replicas"),
        ("/admin/v1/keys", {"name": "k", "models": ["*"], "rpm": "60"}, "rpm"),
        ("/admin/v1/keys", {"name": 7, "models": ["*"]}, "name"),
        (
            "/admin/v1/models/llama/tuning",
            {"weight": "1", "target_waiting": 2, "kv_ceiling": 0.5},
            "weight",
        ),
        (
            "/admin/v1/models/llama/tuning",
            {"weight": 1, "target_waiting": "2", "kv_ceiling": 0.5},
            "target_waiting",
        ),
    ],
    ids=[
        "drain grace as text",
        "drain grace as a boolean",
        "cordon reason as a number",
        "scale as text",
        "scale as a float",
        "key rpm as text",
        "key name as a number",
        "tuning weight as text",
        "tuning target as text",
    ],
)
async def test_a_value_of_the_wrong_type_is_a_400_naming_the_field(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    path: str,
    body: dict[str, Any],
    field: str,
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.post(path, json=body)

    problem = problem_of(answer, 400)
    assert problem["detail"].startswith(f"{field}: Expected `"), problem
    assert problem["errors"] == [
        {"key": field, "message": problem["detail"].removeprefix(f"{field}: "), "source": "body"}
    ]
    assert await last_position(pg_store) == before


async def test_a_spec_with_a_number_as_text_is_refused_naming_the_field(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.put(
        "/admin/v1/models/llama", json={"command": COMMAND, "stop_grace_s": "10"}
    )

    problem = problem_of(answer, 422)
    assert problem["errors"] == [{"field": "stop_grace_s", "reason": "expected `float`, got `str`"}]
    assert await last_position(pg_store) == before


# -- size --------------------------------------------------------------------------------


async def test_a_body_over_the_limit_is_a_413(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await seeded(admin, pg_store)
    reason = "x" * MAX_BODY_BYTES

    answer = await admin.post("/admin/v1/nodes/gpu-1/cordon", json={"reason": reason})

    problem_of(answer, 413)
    assert await last_position(pg_store) == before


# -- numbers beyond any real value --------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        ({"routing": {"weight": 1e308}}, "routing.weight", "must be between 0.001 and 1000000"),
        ({"routing": {"weight": 1e-300}}, "routing.weight", "must be between 0.001 and 1000000"),
        ({"routing": {"kv_ceiling": 1e308}}, "routing.kv_ceiling", "must be in (0, 1]"),
        (
            {"routing": {"target_waiting": 2**62}},
            "routing.target_waiting",
            "must be between 1 and 100000",
        ),
        ({"stop_grace_s": 1e308}, "stop_grace_s", "must be between 0 and 3600 (an hour)"),
        (
            {"startup_timeout_s": 1e308},
            "startup_timeout_s",
            "must be more than 0 and at most 86400 (a day)",
        ),
        ({"gpu_memory_gib": 1e308}, "gpu_memory_gib", "must be between 0 and 1024"),
        ({"max_moves": 2**62}, "max_moves", "must be between 1 and 10000"),
        ({"replicas": 2**62}, "replicas", "must be between 0 and 10000"),
        ({"gpus_per_shard": 2**62}, "gpus_per_shard", "must be between 1 and 64"),
    ],
    ids=lambda value: str(value)[:40],
)
async def test_a_spec_number_out_of_bounds_is_a_422_naming_the_field_and_the_bound(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    spec: dict[str, Any],
    field: str,
    reason: str,
) -> None:
    before = await seeded(admin, pg_store)

    answers = [
        await admin.put("/admin/v1/models/llama", json={"command": COMMAND, **spec}),
        await admin.post("/admin/v1/placement", json={"command": COMMAND, **spec}),
    ]

    for answer in answers:
        problem = problem_of(answer, 422)
        assert problem["title"] == "invalid-spec"
        assert problem["errors"] == [{"field": field, "reason": reason}]
    assert await last_position(pg_store) == before


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("'' serve --port {port}", "names an empty program: nothing could be started"),
        (
            "engine --x=" + "y" * 36 + "{peers}" * 8,
            "makes word 2 up to 131072 bytes long (placeholders filled in), over the 131071 "
            "bytes Linux allows one argument: every start would fail with 'Argument list too "
            "long'",
        ),
    ],
    ids=["empty program", "argument over the kernel's limit"],
)
async def test_a_command_no_engine_could_be_started_with_is_a_422_and_records_nothing(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, command: str, reason: str
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.put(
        "/admin/v1/models/llama", json={"command": command, "shards_per_replica": 64}
    )

    problem = problem_of(answer, 422)
    assert problem["title"] == "invalid-spec"
    assert problem["errors"] == [{"field": "command", "reason": reason}]
    assert await last_position(pg_store) == before


@pytest.mark.parametrize(
    ("path", "body", "kind", "field", "reason"),
    [
        (
            "/admin/v1/models/llama/tuning",
            {"weight": 1e308, "target_waiting": 2, "kv_ceiling": 0.5},
            "invalid-spec",
            "weight",
            "must be between 0.001 and 1000000",
        ),
        (
            "/admin/v1/models/llama/scale",
            {"replicas": 2**62},
            "invalid-spec",
            "replicas",
            "must be between 0 and 10000",
        ),
        (
            "/admin/v1/keys",
            {"name": "big", "models": ["*"], "tpm": 2**62},
            "invalid-key",
            "tpm",
            "must be between 1 and 2147483647 (or left out)",
        ),
        (
            "/admin/v1/nodes/gpu-1/drain",
            {"grace_s": 1e308},
            "invalid-drain",
            "grace_s",
            "must be more than 0 and at most 604800 (a week)",
        ),
        (
            "/admin/v1/nodes/gpu-1/drain",
            {"grace_s": 0},
            "invalid-drain",
            "grace_s",
            "must be more than 0 and at most 604800 (a week)",
        ),
    ],
    ids=["tuning weight", "scale", "key tpm", "drain grace", "no drain grace"],
)
async def test_other_numbers_out_of_bounds_are_a_422_naming_the_field_and_the_bound(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    path: str,
    body: dict[str, Any],
    kind: str,
    field: str,
    reason: str,
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.post(path, json=body)

    problem = problem_of(answer, 422)
    assert problem["title"] == kind
    assert problem["errors"] == [{"field": field, "reason": reason}]
    assert await last_position(pg_store) == before


async def test_a_number_too_large_for_a_float_is_refused_not_stored_as_infinity(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await seeded(admin, pg_store)
    body = f'{{"command": "{COMMAND}", "routing": {{"weight": 1e400}}}}'

    answer = await admin.put("/admin/v1/models/llama", content=body)

    problem = problem_of(answer, 422)
    assert problem["errors"] == [{"field": "routing.weight", "reason": "number out of range"}]
    assert await last_position(pg_store) == before


# -- specs too big to record or to start --------------------------------------------------


async def test_a_spec_whose_start_command_would_not_fit_an_agent_frame_is_a_422(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await seeded(admin, pg_store)
    spec = {"command": "engine" + " --peer {peers}" * 100, "shards_per_replica": 64}

    answers = [
        await admin.put("/admin/v1/models/llama", json=spec),
        await admin.post("/admin/v1/placement", json=spec),
    ]

    for answer in answers:
        [error] = problem_of(answer, 422)["errors"]
        assert error["field"] == "command"
        assert re.fullmatch(
            r"makes a start_shard command of at least \d+ bytes \(placeholders filled in\), "
            r"over the agent channel's limit of 1048576 bytes",
            error["reason"],
        )
    assert await last_position(pg_store) == before


async def test_a_spec_over_its_size_limit_is_a_422_with_the_size(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await seeded(admin, pg_store)
    spec = {"command": COMMAND, "env": {f"VAR_{i}": "v" * 1000 for i in range(100)}}

    answer = await admin.put("/admin/v1/models/llama", json=spec)

    [error] = problem_of(answer, 422)["errors"]
    assert error["field"] == "(spec)"
    assert re.fullmatch(r"is \d+ bytes as JSON, over the limit of 65536", error["reason"])
    assert await last_position(pg_store) == before


# -- what no engine process can be given, names and selectors -------------------------------


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        ({"command": COMMAND + " --x a\x00b"}, "command", "holds a NUL byte (character 39)"),
        ({"command": COMMAND, "env": {"HF_HOME": "/m\x00"}}, "env.HF_HOME", "holds a NUL byte"),
        ({"command": COMMAND, "env": {"A=B": "x"}}, "env", "holds a variable named 'A=B'"),
        ({"command": COMMAND, "env": {"": "x"}}, "env", "holds a variable named ''"),
        (
            {"command": COMMAND, "env": {"PORT": "8000"}},
            "env.PORT",
            "is set by the agent to the port it assigns; a spec cannot set it",
        ),
        (
            {"command": COMMAND, "node_selector": {"gpu": "h" * 300}},
            "node_selector.gpu",
            "is 300 characters: a node's label values are at most 256",
        ),
    ],
    ids=[
        "NUL in command",
        "NUL in env",
        "= in env name",
        "empty env name",
        "variable the agent sets",
        "long label",
    ],
)
async def test_what_an_engine_could_never_be_started_with_is_a_422_naming_the_field(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, spec: Any, field: str, reason: str
) -> None:
    # Accepted, a NUL was recorded as U+FFFD (jsonb cannot hold one): the engine would have
    # been given another argument than the one asked. An environment name with '=' or none
    # reached the agent, which failed every start of the replica at exec; a selector no
    # node's labels can match left the model unplaceable for ever.
    before = await seeded(admin, pg_store)

    answers = [
        await admin.put("/admin/v1/models/llama", json=spec),
        await admin.post("/admin/v1/placement", json=spec),
        await admin.post("/admin/v1/models/llama/preview", json=spec),
    ]

    for answer in answers:
        [error] = problem_of(answer, 422)["errors"]
        assert (error["field"], error["reason"][: len(reason)]) == (field, reason)
    assert await last_position(pg_store) == before


async def test_a_model_name_ending_in_a_newline_is_a_422(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    # `$` matched before a trailing newline: "llama\n" was declared, and its URLs and
    # metrics labels held the newline.
    before = await seeded(admin, pg_store)

    answer = await admin.put("/admin/v1/models/llama%0A", json={"command": COMMAND})

    [error] = problem_of(answer, 422)["errors"]
    assert error["field"] == "name"
    assert await last_position(pg_store) == before


# -- control characters in text the log keeps -------------------------------------------

TUNING = {"weight": 1, "target_waiting": 2, "kv_ceiling": 0.5}


@pytest.mark.parametrize(
    ("path", "body", "field", "character"),
    [
        ("/admin/v1/nodes/gpu-1/cordon", {"reason": "disk\x00swap"}, "reason", "U+0000"),
        ("/admin/v1/nodes/gpu-1/cordon", {"reason": "disk\nswap"}, "reason", "U+000A"),
        (
            "/admin/v1/certificates/revocations",
            {"node_id": "gpu-1", "reason": "stolen\x00"},
            "reason",
            "U+0000",
        ),
        (
            "/admin/v1/certificates/revocations",
            {"node_id": "gpu-1", "reason": "stolen \x1b[2J"},
            "reason",
            "U+001B",
        ),
        (
            "/admin/v1/models/llama/tuning",
            {**TUNING, "summary": {"engine": {"name": "vllm\x00"}}},
            "summary.engine.name",
            "U+0000",
        ),
        (
            "/admin/v1/models/llama/tuning",
            {**TUNING, "summary": {"slo\x00": "p95"}},
            "summary",
            "U+0000",
        ),
    ],
    ids=[
        "cordon NUL",
        "cordon newline",
        "revocation NUL",
        "revocation escape",
        "tuning summary NUL",
        "tuning summary key NUL",
    ],
)
async def test_a_control_character_in_recorded_text_is_a_422_naming_the_field(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    path: str,
    body: dict[str, Any],
    field: str,
    character: str,
) -> None:
    # A NUL was recorded as U+FFFD (PostgreSQL cannot hold one); an escape sequence or a
    # line break would be replayed into every terminal and log line that shows the text.
    before = await seeded(admin, pg_store)

    answer = await admin.post(path, json=body)

    [error] = problem_of(answer, 422)["errors"]
    assert error["field"] == field
    assert character in error["reason"]
    assert await last_position(pg_store) == before


async def test_a_tab_and_a_line_break_in_a_bench_summary_are_recorded(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seeded(admin, pg_store)
    summary = {"capacity": 4, "notes": "p95\tunder SLO\nat 4 in flight"}

    answer = await admin.post("/admin/v1/models/llama/tuning", json={**TUNING, "summary": summary})

    assert answer.status_code == 200, answer.text
    assert answer.json()["changed"] is True


# -- wrong tokens, one after another -------------------------------------------------------


def admin_from(url: str, address: str, token: str | None) -> httpx.AsyncClient:
    """A client of the admin API whose connections come from ``address`` (of 127.0.0.0/8)."""
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    transport = httpx.AsyncHTTPTransport(local_address=address)
    return httpx.AsyncClient(base_url=url, headers=headers, transport=transport)


async def test_an_address_sending_wrong_tokens_is_refused_429_before_any_check(
    pg_store: PostgresEventStore,
) -> None:
    wrong = secrets.token_hex(16)
    limits = FailureLimits(burst=3, per_minute=1)
    async with serving_admin(pg_store, tokens={TOKEN: "alice"}, auth_failures=limits) as url:
        async with admin_from(url, "127.0.0.1", wrong) as attacker:
            flood = [await attacker.get("/admin/v1/nodes") for _ in range(50)]
        async with admin_from(url, "127.0.0.1", TOKEN) as same_address:
            right_from_the_attackers_address = await same_address.get("/admin/v1/nodes")
        async with admin_from(url, "127.0.0.2", TOKEN) as elsewhere:
            right_from_elsewhere = await elsewhere.get("/admin/v1/nodes")
        async with admin_from(url, "127.0.0.2", wrong) as neighbour:
            wrong_from_elsewhere = await neighbour.get("/admin/v1/nodes")
        async with admin_from(url, "127.0.0.1", None) as probe:
            health = await probe.get("/healthz")

    assert [a.status_code for a in flood] == [401] * 3 + [429] * 47
    throttled = problem_of(flood[-1], 429)
    assert throttled["title"] == "too-many-requests"
    assert "too many requests with a wrong admin token from this address" in throttled["detail"]
    retry_after = int(flood[-1].headers["retry-after"])
    assert 1 <= retry_after <= 60  # one failure a minute comes back
    assert f"retry after {retry_after} s" in throttled["detail"]
    # While the address is out of failures its right token waits too: otherwise every
    # guess would still be checked. Another address is not held up.
    assert right_from_the_attackers_address.status_code == 429
    assert right_from_elsewhere.status_code == 200
    assert wrong_from_elsewhere.status_code == 401
    assert health.status_code == 200


async def test_a_request_with_two_authorization_headers_is_a_400_whichever_one_is_right(
    pg_store: PostgresEventStore,
) -> None:
    """Authorization is sent once (RFC 9110, section 11.6.2): with two, a proxy in front may
    have checked the other one. Neither is compared, so no wrong token is counted either."""
    wrong = secrets.token_hex(16)
    limits = FailureLimits(burst=1, per_minute=1)
    async with (
        serving_admin(pg_store, tokens={TOKEN: "alice"}, auth_failures=limits) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        answers = [
            await client.get(
                "/admin/v1/nodes",
                headers=[
                    ("authorization", f"Bearer {first}"),
                    ("authorization", f"Bearer {second}"),
                ],
            )
            for first, second in [(TOKEN, wrong), (wrong, TOKEN), (wrong, wrong)]
        ]
        right_after = await client.get(
            "/admin/v1/nodes", headers={"authorization": f"Bearer {TOKEN}"}
        )

    for answer in answers:
        problem = problem_of(answer, 400)
        assert problem["title"] == "duplicate-authorization"
        assert problem["detail"] == (
            "the Authorization header appears more than once: send it once"
        )
    assert right_after.status_code == 200  # no failure was spent on the three above


@pytest.mark.parametrize(
    ("apis", "reason"),
    [
        (["chat", "images"], "names unknown API(s) 'images'; known: chat, completions, "),
        ([], "must name at least one API of chat, completions, "),
        ("chat", "expected `array`, got `str`"),
    ],
    ids=["unknown", "empty", "not a list"],
)
async def test_a_spec_with_bad_apis_is_refused_naming_the_field(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, apis: Any, reason: str
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.put("/admin/v1/models/llama", json={"command": COMMAND, "apis": apis})

    [error] = problem_of(answer, 422)["errors"]
    assert error["field"] == "apis"
    assert error["reason"].startswith(reason)
    assert await last_position(pg_store) == before


async def test_the_apis_a_spec_names_are_recorded_and_shown(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seeded(admin, pg_store)
    assert (await admin.get("/admin/v1/models/llama")).json()["spec"]["apis"] == [
        "chat",
        "completions",
    ]

    answer = await admin.put(
        "/admin/v1/models/llama", json={"command": COMMAND, "apis": ["embeddings", "score"]}
    )

    assert answer.status_code == 200, answer.text
    assert answer.json()["changed"] is True
    shown = await admin.get("/admin/v1/models/llama")
    assert shown.json()["spec"]["apis"] == ["embeddings", "score"]
    assert shown.json()["revision"] == 1  # the gateway's concern: no new revision


# -- paths whose segments are not the ones sent -------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        # An empty model name: collapsed, the path names the model "autoscale" itself.
        ("DELETE", "/admin/v1/models//autoscale"),
        ("PUT", "/admin/v1/models//autoscale"),
        ("GET", "/admin/v1//models/autoscale"),
        # A name holding a '/': decoded, it is two segments.
        ("DELETE", "/admin/v1/models/%2Fautoscale"),
        ("DELETE", "/admin/v1/models/x%2fautoscale"),
        ("GET", "/admin/v1/nodes/gpu-1%2F"),
    ],
)
async def test_a_path_with_an_empty_or_split_segment_is_a_404_and_changes_nothing(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, method: str, path: str
) -> None:
    await seeded(admin, pg_store)
    named = await admin.put("/admin/v1/models/autoscale", json={"command": COMMAND})
    assert named.status_code == 200, named.text
    before = await last_position(pg_store)

    answer = await admin.request(method, path, json={"max": 2})

    problem = problem_of(answer, 404)
    assert problem["title"] == "not-found"
    assert re.search(r"empty segment|encoded '/'", problem["detail"]), problem
    assert await last_position(pg_store) == before
    assert (await admin.get("/admin/v1/models/autoscale")).status_code == 200


async def test_a_path_with_an_empty_segment_is_a_404_even_without_a_token(
    admin: httpx.AsyncClient,
) -> None:
    answer = await admin.delete(
        "/admin/v1/models//autoscale", headers={"authorization": "Bearer wrong"}
    )

    assert "empty segment" in problem_of(answer, 404)["detail"]


# -- bodies of nothing, or of whitespace ---------------------------------------------------


@pytest.mark.parametrize("body", [b"", b"  \n"], ids=["empty", "whitespace"])
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/admin/v1/models/llama/autoscale"),
        ("POST", "/admin/v1/models/llama/scale"),
        ("POST", "/admin/v1/keys"),
        ("POST", "/admin/v1/models/llama/tuning"),
        ("POST", "/admin/v1/certificates/revocations"),
    ],
    ids=["autoscale", "scale", "key", "tuning", "revocation"],
)
async def test_a_body_of_nothing_where_one_is_needed_asks_for_a_json_object(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, method: str, path: str, body: bytes
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.request(
        method, path, content=body, headers={"content-type": "application/json"}
    )

    held = "only whitespace" if body else "nothing"
    assert problem_of(answer, 400)["detail"] == (
        f"the request body must be a JSON object; it holds {held}"
    )
    assert await last_position(pg_store) == before


@pytest.mark.parametrize(
    "path",
    ["/admin/v1/nodes/gpu-1/drain", "/admin/v1/nodes/gpu-1/cordon"],
    ids=["drain", "cordon"],
)
async def test_a_body_of_whitespace_where_none_is_needed_is_still_refused(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, path: str
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.post(path, content=b" \r\n")

    assert problem_of(answer, 400)["detail"] == (
        "the request body must be a JSON object, or nothing; it holds only whitespace"
    )
    assert await last_position(pg_store) == before


@pytest.mark.parametrize("body", [b"", b" \n"], ids=["empty", "whitespace"])
async def test_a_spec_of_nothing_is_refused_as_not_a_json_object(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, body: bytes
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.put("/admin/v1/models/llama", content=body)

    [error] = problem_of(answer, 422)["errors"]
    held = "only whitespace" if body else "nothing"
    assert error == {"field": "(body)", "reason": f"must be a JSON object; it holds {held}"}
    assert await last_position(pg_store) == before


# -- a byte order mark before the JSON -----------------------------------------------------

UTF8_BOM = b"\xef\xbb\xbf"
"""What some Windows clients write before their JSON (RFC 8259 section 8.1 lets a reader
ignore it)."""


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/admin/v1/models/llama", b'{"command": "sglang {model} --port {port}"}'),
        ("POST", "/admin/v1/models/llama/scale", b'{"replicas": 3}'),
        ("POST", "/admin/v1/nodes/gpu-1/cordon", b'{"reason": "bom"}'),
        ("POST", "/admin/v1/keys", b'{"name": "k", "models": ["*"]}'),
    ],
    ids=["spec", "scale", "cordon", "key"],
)
async def test_a_body_led_by_a_byte_order_mark_is_read_as_its_json(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, method: str, path: str, body: bytes
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.request(
        method, path, content=UTF8_BOM + body, headers={"content-type": "application/json"}
    )

    assert answer.status_code in (200, 201), answer.text
    assert await last_position(pg_store) > before


async def test_a_byte_order_mark_sent_apart_from_the_json_is_skipped_too(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await seeded(admin, pg_store)

    async def pieces() -> AsyncIterator[bytes]:  # chunked: each piece may come on its own
        yield UTF8_BOM[:2]
        yield UTF8_BOM[2:]
        yield b'{"replicas": 3}'

    answer = await admin.post("/admin/v1/models/llama/scale", content=pieces())

    assert answer.status_code == 200, answer.text
    assert await last_position(pg_store) > before


@pytest.mark.parametrize(
    "body",
    [UTF8_BOM + UTF8_BOM + b'{"replicas": 3}', b" " + UTF8_BOM + b'{"replicas": 3}'],
    ids=["twice", "after-whitespace"],
)
async def test_a_byte_order_mark_is_skipped_only_once_and_only_first(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, body: bytes
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.post("/admin/v1/models/llama/scale", content=body)

    assert "not valid JSON" in problem_of(answer, 400)["detail"]
    assert await last_position(pg_store) == before


# -- numbers JSON has no word for ---------------------------------------------------------


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/admin/v1/models/llama/autoscale", '{"max": 4, "target": %s}'),
        ("PUT", "/admin/v1/models/llama", '{"command": "x", "autoscale": {"target": %s}}'),
        ("POST", "/admin/v1/nodes/gpu-1/drain", '{"grace_s": %s}'),
    ],
    ids=["autoscale", "spec", "drain"],
)
async def test_nan_and_infinity_are_not_json_and_change_nothing(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    method: str,
    path: str,
    body: str,
    number: str,
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.request(method, path, content=body % number)

    assert answer.status_code in (400, 422), answer.text
    assert "not JSON" in answer.text or "not valid JSON" in answer.text, answer.text
    assert await last_position(pg_store) == before


@pytest.mark.parametrize("node_id", ["../gpu-1", "-x", "gpu/1", "g" * 64])
async def test_a_revocation_of_a_node_id_no_certificate_can_name_is_a_422_and_records_nothing(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, node_id: str
) -> None:
    before = await last_position(pg_store)

    answer = await admin.post(
        "/admin/v1/certificates/revocations", json={"node_id": node_id, "reason": "rebuilt"}
    )

    [error] = problem_of(answer, 422)["errors"]
    assert error["field"] == "node_id"
    assert error["reason"].startswith(f"{node_id[:60]!r} is not a node id: use 1-63 letters"), error
    assert await last_position(pg_store) == before


async def test_an_unknown_id_of_3000_characters_is_echoed_back_shortened_saying_how_long(
    admin: httpx.AsyncClient,
) -> None:
    """A 404 names what was not found by its first 100 characters, not all 3000."""
    long_id = "x" * 2990 + "-the-end-"
    paths = {
        "unknown-drain": f"/admin/v1/drains/{long_id}",
        "unknown-replica": f"/admin/v1/replicas/{long_id}",
        "unknown-node": f"/admin/v1/nodes/{long_id}",
        "unknown-model": f"/admin/v1/models/{long_id}",
    }

    for title, path in paths.items():
        body = problem_of(await admin.get(path), 404)
        kind = title.removeprefix("unknown-")
        assert (body["title"], body["id"], body.get("id_length")) == (
            title,
            "x" * 100 + "…",
            len(long_id),
        )
        assert body["detail"] == (
            f"no {kind} '{'x' * 100}…' (its first 100 of {len(long_id)} characters) is known"
        )
    short = problem_of(await admin.get("/admin/v1/drains/drain-0a1b2c3d"), 404)
    assert (short["id"], "id_length" in short) == ("drain-0a1b2c3d", False)


# -- a path that names no model a spec could have ----------------------------------------


@pytest.mark.parametrize(
    "body",
    [{"command": COMMAND, "name": "good"}, {"command": COMMAND}, {"command": 5}, {}],
    ids=["another valid name", "no name", "a bad field", "nothing declared"],
)
@pytest.mark.parametrize("action", ["", "/preview"], ids=["declare", "preview"])
async def test_a_path_naming_an_invalid_model_name_is_refused_for_that_whatever_the_body(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, body: dict[str, Any], action: str
) -> None:
    # With a valid name in the body it was refused for the two names differing, as if the
    # body were what to change, and with a bad field for that field.
    before = await seeded(admin, pg_store)
    method = "POST" if action else "PUT"

    answer = await admin.request(method, f"/admin/v1/models/Bad%20Name{action}", json=body)
    same_in_a_body = await admin.post(
        "/admin/v1/placement", json={"command": COMMAND, "name": "Bad Name"}
    )

    problem = problem_of(answer, 422)
    assert problem["title"] == "invalid-spec"
    assert problem["detail"].startswith("spec of model 'Bad Name' is invalid")
    assert problem["errors"] == problem_of(same_in_a_body, 422)["errors"]
    assert problem["errors"] == [
        {
            "field": "name",
            "reason": "must be 1-63 lower-case letters, digits, '.', '_' or '-', starting and "
            "ending with a letter or digit",
        }
    ]
    assert await last_position(pg_store) == before
