"""A model's rollout policy and rollouts at the admin API and ``llmgw-cli``, served in this
event loop over a real PostgreSQL store, with no reconciler: what operators record (spec
files with a policy, pauses, undos), what is refused and why, and the history of rollouts
read back from the log. The rollouts that really run are in test_rollout_operations.py."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from app.domain.events import model_stream
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client
from tests.support.operator_cli import TOKEN, Operator, live_admin_api

pytestmark = pytest.mark.timeout(120)

COMMAND = "vllm serve {model} --port {port}"


def a_model() -> str:
    return f"llama-{secrets.token_hex(3)}"


def spec(command: str = COMMAND, **fields: object) -> dict[str, Any]:
    return {"command": command, "replicas": 2, **fields}


@pytest_asyncio.fixture(loop_scope="session")
async def api(pg_store: PostgresEventStore, tmp_path: Path) -> AsyncIterator[Operator]:
    async with live_admin_api(pg_store) as url:
        yield Operator(home=tmp_path, admin_url=url)


@pytest_asyncio.fixture(loop_scope="session")
async def admin(api: Operator) -> AsyncIterator[httpx.AsyncClient]:
    async with bearer_client(api.admin_url, TOKEN) as client:
        yield client


async def revise(admin: httpx.AsyncClient, model: str, *revisions: str) -> None:
    """Declare ``model``, then each command of ``revisions`` as its next revision."""
    for command in (COMMAND, *revisions):
        answer = await admin.put(f"/admin/v1/models/{model}", json=spec(command))
        assert answer.status_code == 200, answer.text


async def test_a_spec_file_carries_a_rollout_policy_and_the_model_shows_it(
    api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    path = api.home / "llama.yaml"
    path.write_text(
        f"name: {model}\n"
        f"command: {COMMAND}\n"
        "replicas: 4\n"
        "rollout:\n"
        "  max_surge: 2\n"
        "  min_requests: 50\n"
        "  steps:\n"
        "    - {replicas: 1, traffic: 0.1, hold_s: 300}\n"
        "    - {replicas: 2, hold_s: 600}\n"
        "    - {replicas: all}\n"
    )

    applied = await api.run("models", "apply", str(path))
    again = await api.run("models", "apply", str(path))
    shown = (await api.run("model", model, "--output", "json")).json()

    assert applied.code == 0, applied.stderr
    assert again.stdout == f"model {model}: unchanged, nothing recorded\n"
    policy = shown["spec"]["rollout"]
    assert policy["steps"] == [
        {"replicas": 1, "traffic": 0.1, "hold_s": 300.0},
        {"replicas": 2, "traffic": None, "hold_s": 600.0},
        {"replicas": "all", "traffic": None, "hold_s": 0.0},
    ]
    assert (policy["max_surge"], policy["min_requests"], policy["max_failures"]) == (2, 50, 2)
    assert policy["stability_window_s"] is None
    [declared] = await pg_store.read_stream(model_stream(model))
    assert declared.event.spec.rollout.steps[0].traffic == 0.1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("policy", "errors"),
    [
        (
            {"steps": [{"replicas": 1, "traffic": 2.0}]},
            [
                (
                    "rollout.steps[0].traffic",
                    "must be in (0, 1] (a share of the model's requests), or absent",
                )
            ],
        ),
        (
            {"steps": [{"replicas": 2}, {"replicas": 1}]},
            [
                (
                    "rollout.steps[1].replicas",
                    "must be more than the step before: a rollout only goes forward",
                )
            ],
        ),
        (
            {"steps": [{"replicas": "all"}, {"replicas": 3}]},
            [("rollout.steps[0].replicas", '"all" must be the last step')],
        ),
        (
            {"steps": [{"replicas": "half"}]},
            [("rollout.steps[0].replicas", 'must be a number of replicas or "all"')],
        ),
        (
            {"steps": [{"replicas": True}]},
            [("rollout.steps[0].replicas", 'must be a number of replicas or "all"')],
        ),
        ({"steps": [{"traffic": 0.5}]}, [("rollout.steps[0].replicas", "is required")]),
        (
            {"steps": [{"replicas": 1, "weight": 2}]},
            [("rollout.steps[0].weight", "is not a field of a model spec")],
        ),
        ({"max_surges": 2}, [("rollout.max_surges", "is not a field of a model spec")]),
        (
            {"max_surge": 0, "max_unavailable": 0},
            [
                (
                    "rollout.max_surge",
                    "and max_unavailable cannot both be 0: nothing could ever be replaced",
                )
            ],
        ),
        (
            {"steps": [{"replicas": 1, "hold_s": 1e9}], "max_latency_ratio": 0.5},
            [
                ("rollout.max_latency_ratio", "must be between 1 and 100"),
                ("rollout.steps[0].hold_s", "must be between 0 and 604800 (a week)"),
            ],
        ),
        ({"steps": "all"}, [("rollout.steps", "expected `array`, got `str`")]),
        (["all"], [("rollout", "expected `object`, got `array`")]),
    ],
)
async def test_a_bad_rollout_policy_is_refused_naming_the_field_and_nothing_is_recorded(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    policy: object,
    errors: list[tuple[str, str]],
) -> None:
    before = await pg_store.last_position()

    answer = await admin.put(f"/admin/v1/models/{a_model()}", json=spec(rollout=policy))

    assert answer.status_code == 422, answer.text
    assert [(e["field"], e["reason"]) for e in answer.json()["errors"]] == errors
    assert await pg_store.last_position() == before
