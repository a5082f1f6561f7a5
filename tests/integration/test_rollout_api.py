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

from app.domain.envelope import Meta
from app.domain.events import RolloutFinished, event_type, model_stream
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client
from tests.support.operator_cli import OPERATOR, TOKEN, Operator, live_admin_api

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
        "  min_latency_samples: 200\n"
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
    assert policy["min_latency_samples"] == 200
    assert policy["stability_window_s"] is None
    assert shown["rollout"] is None
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
        (
            {"max_surges": 2},
            [("rollout.max_surges", "is not a field of a model spec: did you mean max_surge?")],
        ),
        (
            {"max_failure": 2},
            [
                (
                    "rollout.max_failure",
                    "is not a field of a model spec: did you mean max_failures?",
                )
            ],
        ),
        (
            {"max_surge": 0, "max_unavailable": 0},
            [
                (
                    "rollout.max_surge",
                    "cannot be 0 while max_unavailable is 0 too: nothing could ever be replaced",
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
        (
            {"min_latency_samples": 0},
            [("rollout.min_latency_samples", "must be between 1 and 1000000")],
        ),
        (
            {"min_latency_samples": 10**7},
            [("rollout.min_latency_samples", "must be between 1 and 1000000")],
        ),
        (
            {"min_latency_samples": 2.5},
            [("rollout.min_latency_samples", "expected `int`, got `float`")],
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


async def test_a_model_without_a_rollout_is_a_409_and_an_unknown_model_a_404(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    await revise(admin, model)
    before = await pg_store.last_position()

    status = await admin.get(f"/admin/v1/models/{model}/rollout")
    steering = [await admin.post(f"/admin/v1/models/{model}/rollout/{a}") for a in STEERING]
    history = await admin.get(f"/admin/v1/models/{model}/rollouts")
    unknown = [
        await admin.get("/admin/v1/models/nope/rollout"),
        await admin.get("/admin/v1/models/nope/rollouts"),
        *[await admin.post(f"/admin/v1/models/nope/rollout/{a}") for a in STEERING],
    ]
    cli_status = await api.run("rollout", "status", model)
    cli_history = await api.run("rollout", "history", model)

    assert status.status_code == 409
    assert status.json()["detail"] == (
        f"model {model} has had no rollout: it is at revision 1, and a spec change that "
        "alters what runs starts one"
    )
    assert [a.status_code for a in steering] == [409, 409, 409]
    assert history.json() == {"model": model, "rollouts": [], "next_before": None}
    assert {(a.status_code, a.json()["title"]) for a in unknown} == {(404, "unknown-model")}
    assert cli_status.code == 1
    assert cli_status.stderr == f"llmgw-cli rollout status: {status.json()['detail']}\n"
    assert (cli_history.code, cli_history.stderr) == (
        1,
        f"llmgw-cli rollout history: model {model} has had no rollout\n",
    )
    assert await pg_store.last_position() == before


STEERING = ("pause", "resume", "undo")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reason": "x" * 501}, "reason"),
        ({"reason": 7}, "reason"),
        ({"reason": "ok", "until": "noon"}, "(body)"),
        ("just a reason", "(body)"),
    ],
)
async def test_a_bad_pause_body_is_a_400_naming_it_and_records_nothing(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, body: object, field: str
) -> None:
    model = a_model()
    await revise(admin, model, f"{COMMAND} --enforce-eager")
    before = await pg_store.last_position()

    answer = await admin.post(f"/admin/v1/models/{model}/rollout/pause", json=body)

    assert answer.status_code == 400, answer.text
    assert answer.json()["errors"][0]["key"] == field
    assert await pg_store.last_position() == before


@pytest.mark.parametrize(
    ("reason", "character"), [("freeze\x00", "U+0000"), ("freeze\r\n", "U+000D")]
)
async def test_a_pause_reason_with_a_control_character_is_a_422_and_records_nothing(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, reason: str, character: str
) -> None:
    model = a_model()
    await revise(admin, model, f"{COMMAND} --enforce-eager")
    before = await pg_store.last_position()

    answer = await admin.post(f"/admin/v1/models/{model}/rollout/pause", json={"reason": reason})

    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert error["field"] == "reason"
    assert character in error["reason"]
    assert await pg_store.last_position() == before


async def test_history_pages_newest_first_and_tells_superseded_rollouts_from_the_current_one(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    await revise(admin, model, f"{COMMAND} --a", f"{COMMAND} --b", f"{COMMAND} --c")
    paused = await admin.post(
        f"/admin/v1/models/{model}/rollout/pause", json={"reason": "night freeze"}
    )

    first = (await admin.get(f"/admin/v1/models/{model}/rollouts", params={"limit": 2})).json()
    rest = (
        await admin.get(
            f"/admin/v1/models/{model}/rollouts",
            params={"limit": 2, "before": first["next_before"]},
        )
    ).json()
    told = await api.run("rollout", "history", model)

    assert paused.json()["changed"] is True
    listed = [(r["rollout_id"], r["state"]) for r in first["rollouts"] + rest["rollouts"]]
    assert listed == [
        (f"rollout-{model}-r4", "paused"),
        (f"rollout-{model}-r3", "superseded"),
        (f"rollout-{model}-r2", "superseded"),
    ]
    assert rest["next_before"] is None
    newest = first["rollouts"][0]
    assert (newest["from_revision"], newest["revision"], newest["started_by"]) == (3, 4, OPERATOR)
    assert newest["changes_summary"] == (
        "command 'vllm serve {model} --port {port} --b' -> 'vllm serve {model} --port {port} --c'"
    )
    assert [(e["type"], e["actor"], e["correlation_id"]) for e in newest["events"]] == [
        ("rollout_started", OPERATOR, f"rollout-{model}-r4"),
        ("rollout_paused", OPERATOR, f"rollout-{model}-r4"),
    ]
    assert first["rollouts"][1]["outcome"] == "superseded by revision 4, declared while it ran"
    assert rest["rollouts"][0]["outcome"] == "superseded by a newer revision, declared while it ran"
    assert told.code == 0, told.stderr
    assert f"rollout-{model}-r4: revision 3 -> 4, paused; started" in told.stdout
    assert "paused: night freeze" in told.stdout
    assert f"rollout-{model}-r2: revision 1 -> 2, superseded" in told.stdout


async def test_undo_of_a_rollout_under_way_puts_the_old_revision_back_at_once(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    await revise(admin, model, f"{COMMAND} --enforce-eager")

    undone = await api.run("rollout", "undo", model)
    shown = (await admin.get(f"/admin/v1/models/{model}")).json()
    again = await api.run("rollout", "undo", model)
    status = (await admin.get(f"/admin/v1/models/{model}/rollout")).json()

    assert undone.code == 0, undone.stderr
    assert undone.stdout.splitlines() == [
        f"rollout-{model}-r2: rolling back to revision 1; its replicas of revision 2 are replaced",
        f"follow it: llmgw-cli rollout status {model} --wait",
    ]
    assert (shown["revision"], shown["spec"]["command"]) == (1, COMMAND)
    assert shown["rollout"]["state"] == "rolling_back"
    assert again.code == 1
    assert "is already rolling back to revision 1" in again.stderr
    assert (status["state"], status["model_revision"], status["outcome"]) == (
        "rolling_back",
        1,
        "undone by an operator",
    )
    [rolled_back] = [
        e for e in await pg_store.read_stream(model_stream(model)) if e.meta.actor == OPERATOR
    ][-1:]
    assert rolled_back.meta.correlation_id == f"rollout-{model}-r2"


async def test_a_rollout_rolling_back_is_neither_paused_nor_resumed(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    await revise(admin, model, f"{COMMAND} --enforce-eager")
    undone = await api.run("rollout", "undo", model)
    recorded = await pg_store.read_stream(model_stream(model))

    paused = await api.run("rollout", "pause", model, "--reason", "night freeze")
    resumed = await api.run("rollout", "resume", model)
    status = (await admin.get(f"/admin/v1/models/{model}/rollout")).json()

    assert undone.code == 0, undone.stderr
    assert paused.code == 1
    assert (
        f"rollout rollout-{model}-r2 cannot be paused: it is already rolling back to "
        "revision 1" in paused.stderr
    )
    assert resumed.code == 1
    assert (
        f"rollout rollout-{model}-r2 cannot be resumed: it is already rolling back to "
        "revision 1" in resumed.stderr
    )
    assert status["state"] == "rolling_back"
    assert await pg_store.read_stream(model_stream(model)) == recorded


async def test_pause_and_resume_say_what_they_recorded_and_when_they_recorded_nothing(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    await revise(admin, model, f"{COMMAND} --enforce-eager")

    resumed_running = await api.run("rollout", "resume", model)
    paused = await api.run("rollout", "pause", model, "--reason", "night freeze")
    paused_again = await api.run("rollout", "pause", model)
    resumed = await api.run("rollout", "resume", model, "--output", "json")
    events = await pg_store.read_stream(model_stream(model))

    assert resumed_running.stdout == f"rollout-{model}-r2: already running, nothing recorded\n"
    assert paused.stdout.splitlines() == [
        f"rollout-{model}-r2: paused at step 1 of 1: 2 of 2 replica(s) on revision 2 (not "
        f"started yet); moves under way finish, no new one starts (llmgw-cli rollout resume "
        f"{model} goes on)",
        f"follow it: llmgw-cli rollout status {model} --wait",
    ]
    assert paused_again.stdout == (
        f"rollout-{model}-r2: already paused (night freeze), nothing recorded\n"
    )
    assert (resumed.json()["changed"], resumed.json()["rollout"]["state"]) == (True, "running")
    assert [event_type(e.event) for e in events][-2:] == ["rollout_paused", "rollout_resumed"]
    assert events[-2].event.reason == "night freeze"  # type: ignore[union-attr]


async def test_an_undo_naming_a_rollout_that_is_not_the_models_any_more_is_refused(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    await revise(admin, model, f"{COMMAND} --a", f"{COMMAND} --b")
    before = await pg_store.last_position()

    stale = await admin.post(
        f"/admin/v1/models/{model}/rollout/undo", json={"rollout_id": f"rollout-{model}-r2"}
    )
    told = await api.run("rollout", "undo", model, "--rollout", f"rollout-{model}-r2")
    malformed = await admin.post(
        f"/admin/v1/models/{model}/rollout/undo", json={"rollout_id": "r2\n"}
    )

    assert stale.status_code == 409, stale.text
    assert stale.json()["detail"].startswith(
        f"rollout rollout-{model}-r2 cannot be undone: it is not the model's rollout any more "
        f"(undone or superseded already); the model's rollout is rollout-{model}-r3, "
        "revision 2 -> 3, running, started at "
    )
    assert told.code == 1
    assert "is not the model's rollout any more" in told.stderr
    assert malformed.status_code == 400, malformed.text
    assert await pg_store.last_position() == before

    undone = await api.run("rollout", "undo", model, "--rollout", f"rollout-{model}-r3")
    assert undone.code == 0, undone.stderr
    assert undone.stdout.startswith(f"rollout-{model}-r3: rolling back to revision 2")


async def test_undo_run_twice_after_a_rollout_that_succeeded_undoes_once(
    admin: httpx.AsyncClient, api: Operator, pg_store: PostgresEventStore
) -> None:
    model = a_model()
    await revise(admin, model, f"{COMMAND} --b")
    finished = RolloutFinished(
        model=model, rollout_id=f"rollout-{model}-r2", succeeded=True, outcome="done"
    )
    await pg_store.append(model_stream(model), None, [NewEvent(finished)], Meta(actor="reconciler"))

    undone = await api.run("rollout", "undo", model)
    before = await pg_store.last_position()
    again = await api.run("rollout", "undo", model)
    unnamed = await admin.post(f"/admin/v1/models/{model}/rollout/undo")
    status = await api.run("rollout", "status", model)
    history = await api.run("rollout", "history", model)
    shown = (await admin.get(f"/admin/v1/models/{model}")).json()

    assert undone.code == 0, undone.stderr
    assert undone.stdout.startswith(f"rollout-{model}-r3: the spec before revision 2 rolls")
    assert again.code == 1
    assert f"rollout rollout-{model}-r2 was undone already" in " ".join(again.stderr.split())
    assert f"--rollout rollout-{model}-r3" in again.stderr
    assert unnamed.status_code == 409, unnamed.text
    assert "does not undo an undo; nothing was recorded" in unnamed.json()["detail"]
    assert await pg_store.last_position() == before
    assert (shown["revision"], shown["spec"]["command"]) == (3, COMMAND)
    assert f"undoes:   rollout-{model}-r2" in status.stdout
    assert f"started: revision 2 -> 3, undoing rollout-{model}-r2" in history.stdout
