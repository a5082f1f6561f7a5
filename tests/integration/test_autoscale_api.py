"""A model's autoscaling policy at the admin API and ``llmgw-cli``, served in this event loop
over a real PostgreSQL store, with no reconciler: what operators record (spec files with a
policy, ``PUT``/``DELETE .../autoscale``, ``llmgw-cli autoscale``), what is refused and why,
and how ``models`` and ``model`` show the policy and the autoscaler's last decision (seeded
as the autoscaler records it). The autoscaler itself is in tests/unit/test_autoscale.py."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from app.domain.decision import AUTOSCALER
from app.domain.events import (
    ModelDeclared,
    ModelScaled,
    ModelUnplaceable,
    ReplicaPlaced,
    ScaleInputs,
    ShardPlacement,
    event_type,
    model_stream,
)
from app.domain.model_spec import AutoscalePolicy
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client, record, seed_node, seed_serving_replica
from tests.support.operator_cli import OPERATOR, TOKEN, Operator, live_admin_api

pytestmark = pytest.mark.timeout(120)

COMMAND = "vllm serve {model} --port {port}"
DEFAULTS = {
    "min": 1,
    "max": 1,
    "target": 4.0,
    "capacity": None,
    "up_window_s": 10.0,
    "down_window_s": 300.0,
    "down_window_min_share": 1.0,
    "idle_to_zero_s": 900.0,
    "max_step": 4,
    "cold_start_timeout_s": 300.0,
}
"""``AutoscalePolicy()`` as the API shows it."""


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


async def declare(admin: httpx.AsyncClient, model: str, **fields: object) -> dict[str, Any]:
    answer = await admin.put(f"/admin/v1/models/{model}", json=spec(**fields))
    assert answer.status_code == 200, answer.text
    shown: dict[str, Any] = answer.json()["model"]
    return shown


async def scaled_by_autoscaler(store: PostgresEventStore, model: str, to: int, was: int) -> None:
    """The autoscaler's ``model_scaled``, as the reconciler records it."""
    inputs = ScaleInputs(
        demand=23.0,
        per_replica=4.0,
        per_replica_from="target 4",
        up_window_mean=21.5,
        down_window_max=23.0,
        samples=12,
    )
    reason = "demand averaged 21.5 over 10s needs 6 replica(s) at 4 each; held to max 5"
    scaled = ModelScaled(model=model, replicas=to, previous=was, reason=reason, inputs=inputs)
    await record(store, AUTOSCALER, scaled)


def facts(shown: str) -> dict[str, str]:
    """``llmgw-cli model``'s ``name: value`` lines."""
    return {
        name.strip(): value.strip()
        for name, value in (line.split(":", 1) for line in shown.splitlines() if ":" in line)
    }


# -- the policy in a spec ------------------------------------------------------------------


async def test_a_spec_file_carries_an_autoscale_policy_and_reapplying_it_keeps_the_count(
    api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    path = api.home / "llama.yaml"
    path.write_text(
        f"name: {model}\n"
        f"command: {COMMAND}\n"
        "replicas: 2\n"
        "autoscale:\n"
        "  min: 1\n"
        "  max: 8\n"
        "  capacity: 0.8\n"
        "  down_window_s: 600\n"
    )

    applied = await api.run("models", "apply", str(path))
    await scaled_by_autoscaler(pg_store, model, to=5, was=2)
    again = await api.run("models", "apply", str(path))
    shown = (await api.run("model", model, "--output", "json")).json()

    assert applied.code == 0, applied.stderr
    assert again.stdout == f"model {model}: unchanged, nothing recorded\n"
    assert shown["spec"]["autoscale"] == DEFAULTS | {
        "max": 8,
        "capacity": 0.8,
        "down_window_s": 600.0,
    }
    assert shown["desired"] == 5
    declared, scaled = await pg_store.read_stream(model_stream(model))
    assert isinstance(declared.event, ModelDeclared)
    assert declared.event.spec.autoscale == AutoscalePolicy(
        max_replicas=8, capacity=0.8, down_window_s=600
    )
    assert scaled.meta.actor == AUTOSCALER


async def test_a_spec_without_a_policy_or_with_null_is_not_autoscaled(
    admin: httpx.AsyncClient,
) -> None:
    left_out = await declare(admin, a_model())
    null = await declare(admin, a_model(), autoscale=None)
    empty = await declare(admin, a_model(), autoscale={})

    assert left_out["spec"]["autoscale"] is None
    assert null["spec"]["autoscale"] is None
    assert empty["spec"]["autoscale"] == DEFAULTS


HOSTILE_POLICIES = [
    ({"min": 5, "max": 2}, [("autoscale.max", "must be at least min (5)")]),
    ({"min": -1}, [("autoscale.min", "must be between 0 and 10000")]),
    ({"max": 10_001}, [("autoscale.max", "must be between 1 and 10000")]),
    (
        {"target": 0},
        [
            (
                "autoscale.target",
                "must be between 0.01 and 100000 (requests a replica carries)",
            )
        ],
    ),
    (
        {"target": 5e-324},
        [("autoscale.target", "must be between 0.01 and 100000 (requests a replica carries)")],
    ),
    (
        {"capacity": 1.5},
        [
            (
                "autoscale.capacity",
                "must be between 0.01 and 1 (a share of the capacity bench measured), or absent",
            )
        ],
    ),
    (
        {"up_window_s": -1, "idle_to_zero_s": 1e9},
        [
            ("autoscale.up_window_s", "must be between 0 and 86400 (a day)"),
            ("autoscale.idle_to_zero_s", "must be between 0 and 86400 (a day)"),
        ],
    ),
    ({"max_step": 0}, [("autoscale.max_step", "must be between 1 and 10000")]),
    (
        {"cold_start_timeout_s": 0},
        [("autoscale.cold_start_timeout_s", "must be more than 0 and at most 3600 (an hour)")],
    ),
]


@pytest.mark.parametrize(
    ("policy", "errors"),
    [
        *HOSTILE_POLICIES,
        ({"mni": 1}, [("autoscale.mni", "is not a field of a model spec")]),
        ({"min_replicas": 1}, [("autoscale.min_replicas", "is not a field of a model spec")]),
        ({"min": "1"}, [("autoscale.min", "expected `int`, got `str`")]),
        ({"target": True}, [("autoscale.target", "expected `float`, got `bool`")]),
        ("on", [("autoscale", "expected `object`, got `str`")]),
    ],
)
async def test_a_bad_autoscale_policy_in_a_spec_is_refused_naming_the_field(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    policy: object,
    errors: list[tuple[str, str]],
) -> None:
    before = await pg_store.last_position()

    answer = await admin.put(f"/admin/v1/models/{a_model()}", json=spec(autoscale=policy))

    assert answer.status_code == 422, answer.text
    assert [(e["field"], e["reason"]) for e in answer.json()["errors"]] == errors
    assert await pg_store.last_position() == before


# -- PUT and DELETE /admin/v1/models/{name}/autoscale ----------------------------------------


async def test_put_and_delete_record_a_declaration_of_the_same_revision_once_each(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    await declare(admin, model)
    await declare(admin, model, command=f"{COMMAND} --enforce-eager")  # revision 2
    before = len(await pg_store.read_stream(model_stream(model)))
    path = f"/admin/v1/models/{model}/autoscale"

    on = await admin.put(path, json={"min": 1, "max": 8, "target": 6})
    same = await admin.put(path, json={"max": 8, "target": 6.0})
    off = await admin.delete(path)
    off_again = await admin.delete(path)
    recorded = (await pg_store.read_stream(model_stream(model)))[before:]

    assert on.status_code == 200, on.text
    assert (on.json()["changed"], same.json()["changed"]) == (True, False)
    shown = on.json()["model"]
    assert shown["spec"]["autoscale"] == DEFAULTS | {"max": 8, "target": 6.0}
    assert (shown["revision"], shown["desired"], shown["spec"]["replicas"]) == (2, 2, 2)
    assert off.status_code == 200, off.text
    assert (off.json()["changed"], off_again.json()["changed"]) == (True, False)
    assert off.json()["model"]["spec"]["autoscale"] is None
    assert off.json()["model"]["desired"] == 2
    assert [event_type(r.event) for r in recorded] == ["model_declared", "model_declared"]
    turned_on, turned_off = (r.event for r in recorded)
    assert isinstance(turned_on, ModelDeclared)
    assert isinstance(turned_off, ModelDeclared)
    assert turned_on.revision == turned_off.revision == 2
    assert turned_on.changes == turned_off.changes == ()
    assert turned_on.spec.autoscale == AutoscalePolicy(max_replicas=8, target=6.0)
    assert turned_off.spec.autoscale is None
    assert turned_off.spec.command == f"{COMMAND} --enforce-eager"
    assert {r.meta.actor for r in recorded} == {OPERATOR}


@pytest.mark.parametrize(("policy", "errors"), HOSTILE_POLICIES)
async def test_a_hostile_policy_is_a_422_naming_each_field_and_records_nothing(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    policy: dict[str, object],
    errors: list[tuple[str, str]],
) -> None:
    model = a_model()
    await declare(admin, model)
    before = await pg_store.last_position()

    answer = await admin.put(f"/admin/v1/models/{model}/autoscale", json=policy)

    assert answer.status_code == 422, answer.text
    assert answer.json()["title"] == "invalid-spec"
    assert [(e["field"], e["reason"]) for e in answer.json()["errors"]] == errors
    assert await pg_store.last_position() == before


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({"min": "1"}, "min"),
        ({"capacity": "0.8"}, "capacity"),
        ({"max": 2.5}, "max"),
        ({"mni": 1}, "(body)"),
        ([1, 8], "(body)"),
    ],
)
async def test_a_body_that_is_not_a_policy_is_a_400_naming_it_and_records_nothing(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, body: object, key: str
) -> None:
    model = a_model()
    await declare(admin, model)
    before = await pg_store.last_position()

    answer = await admin.put(f"/admin/v1/models/{model}/autoscale", json=body)

    assert answer.status_code == 400, answer.text
    assert answer.json()["errors"][0]["key"] == key
    assert await pg_store.last_position() == before


async def test_an_unknown_model_is_a_404_and_a_removed_one_a_409(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    removed = a_model()
    await declare(admin, removed)
    assert (await admin.delete(f"/admin/v1/models/{removed}")).status_code == 200
    before = await pg_store.last_position()

    unknown = [
        await admin.put("/admin/v1/models/nope/autoscale", json={"max": 4}),
        await admin.delete("/admin/v1/models/nope/autoscale"),
    ]
    gone = [
        await admin.put(f"/admin/v1/models/{removed}/autoscale", json={"max": 4}),
        await admin.delete(f"/admin/v1/models/{removed}/autoscale"),
    ]

    assert {(a.status_code, a.json()["title"]) for a in unknown} == {(404, "unknown-model")}
    assert {(a.status_code, a.json()["detail"]) for a in gone} == {
        (409, f"model {removed} was removed; apply its spec to declare it again")
    }
    assert await pg_store.last_position() == before


async def test_a_manual_scale_of_an_autoscaled_model_is_a_409_that_says_what_to_do(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    await declare(admin, model, autoscale={"min": 2, "max": 6})
    before = await pg_store.last_position()

    answer = await admin.post(f"/admin/v1/models/{model}/scale", json={"replicas": 4})
    told = await api.run("scale", model, "4")

    message = (
        f"model {model} is autoscaled between 2 and 6 replicas; change the bounds "
        f"(llmgw-cli autoscale {model} --min N --max N) or turn autoscaling off (--off) first"
    )
    assert (answer.status_code, answer.json()["title"]) == (409, "invalid-operation")
    assert answer.json()["detail"] == message
    assert (told.code, told.stderr) == (1, f"llmgw-cli scale: {message}\n")
    assert await pg_store.last_position() == before


# -- llmgw-cli autoscale, models, model ------------------------------------------------------


async def test_autoscale_changes_only_the_options_given_and_off_hands_the_count_back(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    await declare(admin, model)

    on = await api.run("autoscale", model, "--max", "8", "--target", "6")
    widened = await api.run("autoscale", model, "--min", "0", "--idle-to-zero", "1800")
    same = await api.run("autoscale", model, "--max", "8")
    as_json = (await api.run("model", model, "--output", "json")).json()
    off = await api.run("autoscale", model, "--off")
    off_again = await api.run("autoscale", model, "--off")
    scaled = await api.run("scale", model, "3")

    assert on.code == 0, on.stderr
    assert on.stdout == (
        f"model {model}: autoscaled, 1..8 replicas, 6 requests per replica, up on the 10s "
        "average, down after 300s below, at most 4 a step; now 2 desired, 0 serving\n"
    )
    assert widened.stdout == (
        f"model {model}: autoscaled, 0..8 replicas, 6 requests per replica, up on the 10s "
        "average, down after 300s below, at most 4 a step, to zero after 1800s idle (a cold "
        "start holds requests up to 300s); now 2 desired, 0 serving\n"
    )
    assert same.stdout == f"model {model}: autoscaling unchanged, nothing recorded\n"
    assert as_json["spec"]["autoscale"] == DEFAULTS | {
        "min": 0,
        "max": 8,
        "target": 6.0,
        "idle_to_zero_s": 1800.0,
    }
    assert off.stdout == (
        f"model {model}: autoscaling off; it stays at 2 replicas "
        f"(llmgw-cli scale {model} N changes it)\n"
    )
    assert off_again.stdout == f"model {model}: not autoscaled, nothing recorded\n"
    assert scaled.code == 0, scaled.stderr
    types = [event_type(r.event) for r in await pg_store.read_stream(model_stream(model))]
    assert types == ["model_declared"] * 4 + ["model_scaled"]


async def test_a_target_given_alone_replaces_the_capacity_in_force_and_both_keep_it(
    admin: httpx.AsyncClient, api: Operator
) -> None:
    """With a capacity in force a new target would apply only while the model has no bench
    result: given alone, it is taken to mean the operator now sizes by target."""
    model = a_model()
    await declare(admin, model)
    await api.run("autoscale", model, "--max", "8", "--capacity", "0.8")

    both = await api.run("autoscale", model, "--target", "3", "--capacity", "0.7")
    after_both = (await api.run("model", model, "--output", "json")).json()
    alone = await api.run("autoscale", model, "--target", "5")
    after_alone = (await api.run("model", model, "--output", "json")).json()

    assert (both.code, alone.code) == (0, 0), (both.stderr, alone.stderr)
    assert (
        after_both["spec"]["autoscale"]["target"],
        after_both["spec"]["autoscale"]["capacity"],
    ) == (3.0, 0.7)
    assert (
        after_alone["spec"]["autoscale"]["target"],
        after_alone["spec"]["autoscale"]["capacity"],
    ) == (5.0, None)
    assert "5 requests per replica" in alone.stdout


async def test_autoscale_refuses_a_bad_command_line_before_and_a_bad_policy_from_the_api(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    await declare(admin, model)
    before = await pg_store.last_position()

    both = await api.run("autoscale", model, "--off", "--min", "2", "--target", "3")
    nothing = await api.run("autoscale", model)
    infinite = await api.run("autoscale", model, "--target", "inf")
    tiny = await api.run("autoscale", model, "--max", "4", "--target", "1e-320")
    negative = await api.run("autoscale", model, "--min", "-1")
    inverted = await api.run("autoscale", model, "--min", "5", "--max", "2")
    above_max = await api.run("autoscale", model, "--min", "5")  # the model's max is 1
    unknown = await api.run("autoscale", "no-such-model", "--max", "2")

    assert (both.code, both.stderr) == (
        2,
        "llmgw-cli autoscale: --off takes no other option (given: --min, --target)\n",
    )
    assert nothing.code == 2
    assert "say what to change" in nothing.stderr
    assert (infinite.code, tiny.code, negative.code) == (2, 2, 2)
    assert "--target must be a finite number, got inf" in infinite.stderr
    assert (inverted.code, inverted.stderr) == (
        2,
        "llmgw-cli autoscale: --min must be at most --max, got --min 5 and --max 2\n",
    )
    assert above_max.code == 1
    assert above_max.stderr.splitlines() == [
        f"llmgw-cli autoscale: spec of model '{model}' is invalid (autoscale.min: 5 is above "
        "the model's max (1), which this change keeps: change max with it); nothing was "
        "recorded",
        "  autoscale.min: 5 is above the model's max (1), which this change keeps: change max "
        "with it",
    ]
    assert (unknown.code, unknown.stderr) == (
        1,
        "llmgw-cli autoscale: no model 'no-such-model' is known\n",
    )
    assert await pg_store.last_position() == before


async def test_models_shows_the_bounds_and_why_it_is_short_in_one_phrase(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    auto, manual = a_model(), a_model()
    node = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node)
    await declare(admin, auto, replicas=1, autoscale={"min": 1, "max": 8})
    await declare(admin, manual, replicas=2)
    await seed_serving_replica(pg_store, f"{auto}-1", node)
    shard = ShardPlacement(index=0, node_id=node, gpus=(1,), port=20001)
    await record(
        pg_store,
        "reconciler",
        ReplicaPlaced(replica_id=f"{manual}-1", model=manual, number=1, shards=(shard,)),
    )
    await scaled_by_autoscaler(pg_store, auto, to=3, was=1)
    reason = "needs 1 node(s) with 1 healthy free GPU(s), 0 eligible of 1: 1 not enough GPUs"
    await record(
        pg_store,
        "reconciler",
        ModelUnplaceable(model=auto, reason=reason, missing_replicas=2),
    )

    table = await api.run("models", "--output", "wide")
    narrow = await api.run("models")

    rows = {line.split()[1]: line for line in table.stdout.splitlines() if "llama-" in line}
    assert table.code == 0, table.stderr
    assert "1/3 (auto 1..8)" in rows[auto]
    assert "1/3 (auto 1..8)" in narrow.stdout
    assert f"wants 3, has 1: {reason}" in rows[auto]
    assert "0/2" in rows[manual]
    assert "auto" not in rows[manual]
    # One phrase, the first reason of those the model's answer gives.
    assert "1 replica(s) not placed yet" in rows[manual]
    assert "placed or starting" not in rows[manual]


async def test_model_shows_the_policy_and_the_autoscalers_last_decision_with_its_inputs(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    model, manual = a_model(), a_model()
    await declare(admin, model, autoscale={"min": 1, "max": 5, "capacity": 0.8})
    await declare(admin, manual)
    await scaled_by_autoscaler(pg_store, model, to=4, was=2)
    await scaled_by_autoscaler(pg_store, model, to=5, was=4)
    assert (await admin.post(f"/admin/v1/models/{manual}/scale", json={"replicas": 3})).is_success

    shown = (await admin.get(f"/admin/v1/models/{model}")).json()
    listed = (await admin.get("/admin/v1/models")).json()
    told = await api.run("model", model)
    told_manual = await api.run("model", manual)
    not_autoscaled = (await admin.get(f"/admin/v1/models/{manual}")).json()

    last = shown["last_autoscale"]
    scaled = (await pg_store.read_stream(model_stream(model)))[-1]
    assert (last["previous"], last["replicas"], last["position"]) == (4, 5, scaled.position)
    assert last["reason"].startswith("demand averaged 21.5 over 10s")
    assert last["inputs"] == {
        "demand": 23.0,
        "per_replica": 4.0,
        "per_replica_from": "target 4",
        "up_window_mean": 21.5,
        "down_window_max": 23.0,
        "samples": 12,
    }
    assert {m["name"]: m["last_autoscale"] for m in listed} == {model: None, manual: None}
    assert not_autoscaled["last_autoscale"] is None  # an operator's scale is no decision
    assert told.code == 0, told.stderr
    lines = facts(told.stdout)
    assert lines["autoscale"] == (
        "1..5 replicas, 80% of the benched capacity per replica (4 requests without a bench "
        "result), up on the 10s average, down after 300s below, at most 4 a step"
    )
    assert lines["last scaled"].endswith(
        "UTC, 4 -> 5: demand averaged 21.5 over 10s needs 6 replica(s) at 4 each; held to max 5"
    )
    assert lines["it saw"] == (
        "demand 23, 4 per replica (target 4), up-window mean 21.5, down-window peak 23.0, "
        "12 samples"
    )
    assert facts(told_manual.stdout)["autoscale"] == "off"
    assert "last scaled" not in told_manual.stdout
