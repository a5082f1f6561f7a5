"""Operators managing API keys at the admin API: the Litestar app served by uvicorn on a
loopback socket in this process, over real HTTP, against a fresh PostgreSQL database per
test. Models are declared through the API; keys are created, listed and revoked through it,
and what was recorded is read back from the log and the ``api_keys`` projection."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx

from app.domain.events import ApiKeyCreated, ApiKeyRevoked, key_stream
from app.domain.keys import hash_key, key_matches, prefix_of
from app.services.operations import Caller, Operations
from app.store.database import connection
from app.store.postgres import PostgresEventStore
from tests.support.waiting import wait_until

KEYS = "/admin/v1/keys"


async def declare(client: httpx.AsyncClient, *names: str) -> None:
    for name in names:
        answer = await client.put(
            f"/admin/v1/models/{name}", json={"command": "vllm serve {model} --port {port}"}
        )
        assert answer.status_code == 200, answer.text


async def create_key(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    answer = await client.post(KEYS, json=body)
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


async def stored_key_row(store: PostgresEventStore, key_id: str) -> dict[str, Any]:
    async with connection(store.engine) as db:
        row = await db.fetchrow("SELECT * FROM api_keys WHERE id = $1", key_id)
    assert row is not None
    return dict(row)


async def log_text(store: PostgresEventStore) -> str:
    """Everything the log holds, as text: events, their metadata, and the projections."""
    async with connection(store.engine) as db:
        events = await db.fetchval("SELECT string_agg(data::text || meta::text, ' ') FROM events")
        keys = await db.fetchval("SELECT string_agg(api_keys::text, ' ') FROM api_keys")
    return f"{events} {keys}"


def problem_of(answer: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = answer.json()
    assert body["title"] == kind
    return body


# -- the stories -------------------------------------------------------------------------


async def test_a_created_key_is_shown_once_and_only_its_hash_is_recorded(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await declare(alice, "llama", "qwen")

    answer = await alice.post(
        KEYS, json={"name": "ci", "models": ["qwen", "llama"], "rpm": 60, "tpm": 100_000}
    )

    assert answer.status_code == 201, answer.text
    assert answer.headers["cache-control"] == "no-store"
    created = answer.json()
    key = created["key"]
    assert re.fullmatch(r"llmgw-[0-9a-f]{8}-[A-Za-z0-9_-]{43}", key)
    assert prefix_of(key) == created["prefix"]
    assert created["id"] == f"k-{created['prefix']}"
    assert {k: v for k, v in created.items() if k not in ("key", "id", "prefix", "created_at")} == {
        "name": "ci",
        "models": ["llama", "qwen"],
        "rpm": 60,
        "tpm": 100_000,
        "created_by": "alice",
        "revoked": False,
        "revoked_at": None,
        "revoked_by": None,
        "expires_at": None,
        "expired": False,
    }
    [recorded] = await pg_store.read_stream(key_stream(created["id"]))
    assert isinstance(recorded.event, ApiKeyCreated)
    assert recorded.meta.actor == "alice"
    assert key_matches(key, recorded.event.secret_hash)
    row = await stored_key_row(pg_store, created["id"])
    assert row["secret_hash"] == hash_key(key)
    assert row["models"] == ["llama", "qwen"]
    # The secret is base64url, so it may hold "-" itself: split after the prefix, not at the
    # last "-" (whose tail may be a letter or two that any log holds).
    secret = key.split("-", 2)[2]
    assert len(secret) == 43
    assert secret not in await log_text(pg_store)


async def test_the_list_shows_every_key_and_who_revoked_it_but_never_a_secret_or_hash(
    alice: httpx.AsyncClient, bob: httpx.AsyncClient
) -> None:
    await declare(alice, "llama")
    ci = await create_key(alice, name="ci", models=["llama"], rpm=10)
    everything = await create_key(alice, name="everything", models=["*"])
    revoked = await bob.delete(f"{KEYS}/ci")
    assert revoked.status_code == 200, revoked.text

    answer = await bob.get(KEYS)

    assert answer.status_code == 200, answer.text
    listed = answer.json()
    assert [(k["prefix"], k["name"]) for k in listed] == [
        (ci["prefix"], "ci"),
        (everything["prefix"], "everything"),
    ]
    assert listed[0]["revoked"] is True
    assert listed[0]["revoked_by"] == "bob"
    assert listed[0]["revoked_at"] is not None
    assert (listed[0]["rpm"], listed[0]["tpm"]) == (10, None)
    assert listed[1]["models"] == ["*"]
    assert listed[1]["revoked"] is False
    assert ci["key"] not in answer.text
    assert everything["key"] not in answer.text
    assert not any("hash" in field for key in listed for field in key)


async def test_the_list_is_read_page_by_page_after_the_last_key_of_the_page_before(
    alice: httpx.AsyncClient,
) -> None:
    await declare(alice, "llama")
    created = [(await create_key(alice, name=f"k{n}", models=["llama"]))["id"] for n in range(5)]

    pages = [(await alice.get(KEYS, params={"limit": 2})).json()]
    while len(pages[-1]) == 2:
        answer = await alice.get(KEYS, params={"limit": 2, "after": pages[-1][-1]["id"]})
        assert answer.status_code == 200, answer.text
        pages.append(answer.json())

    assert [[key["id"] for key in page] for page in pages] == [
        created[0:2],
        created[2:4],
        created[4:5],
    ]
    assert [key["id"] for key in (await alice.get(KEYS)).json()] == created  # no limit: all


async def test_a_page_after_a_key_that_never_was_or_of_no_size_is_refused(
    alice: httpx.AsyncClient,
) -> None:
    after_nothing = await alice.get(KEYS, params={"limit": 2, "after": "k-99999999"})
    zero = await alice.get(KEYS, params={"limit": 0})
    huge = await alice.get(KEYS, params={"limit": 5001})
    long_id = await alice.get(KEYS, params={"after": "k" * 65})

    body = problem_of(after_nothing, 404, "unknown-key")
    assert body["detail"] == "no API key (by id) to list the keys after 'k-99999999' is known"
    assert [answer.status_code for answer in (zero, huge, long_id)] == [400, 400, 400]


async def test_a_key_is_revoked_by_name_or_prefix_once_and_the_history_says_who(
    alice: httpx.AsyncClient, bob: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await declare(alice, "llama")
    ci = await create_key(alice, name="ci", models=["llama"])
    bot = await create_key(alice, name="bot", models=["llama"])

    by_name = await bob.delete(f"{KEYS}/ci")
    by_prefix = await bob.delete(f"{KEYS}/{bot['prefix']}")
    again = await alice.delete(f"{KEYS}/{ci['prefix']}")

    assert [a.status_code for a in (by_name, by_prefix, again)] == [200, 200, 200]
    assert (by_name.json()["changed"], by_prefix.json()["changed"]) == (True, True)
    assert again.json()["changed"] is False
    assert again.json()["key"]["revoked_by"] == "bob"
    stream = await pg_store.read_stream(key_stream(ci["id"]))
    assert [(type(r.event), r.meta.actor) for r in stream] == [
        (ApiKeyCreated, "alice"),
        (ApiKeyRevoked, "bob"),
    ]
    row = await stored_key_row(pg_store, ci["id"])
    assert (row["revoked_by"], row["revoked_at"] is not None) == ("bob", True)
    history = await alice.get(f"/admin/v1/history/key/{ci['id']}")
    assert [(e["type"], e["actor"]) for e in history.json()["events"]] == [
        ("api_key_created", "alice"),
        ("api_key_revoked", "bob"),
    ]


async def test_a_key_s_history_is_found_by_id_prefix_or_name_as_revoke_finds_it(
    alice: httpx.AsyncClient,
) -> None:
    await declare(alice, "llama")
    old = await create_key(alice, name="tour", models=["llama"])
    await alice.delete(f"{KEYS}/tour")
    live = await create_key(alice, name="tour", models=["llama"])

    answers = {
        given: await alice.get(f"/admin/v1/history/key/{given}")
        for given in (live["id"], live["prefix"], "tour", old["prefix"])
    }
    unknown = await alice.get("/admin/v1/history/key/no-such-key")

    ids = {given: answer.json()["id"] for given, answer in answers.items()}
    assert ids == {live["id"]: live["id"], live["prefix"]: live["id"], "tour": live["id"]} | {
        old["prefix"]: old["id"]
    }
    assert [e["type"] for e in answers["tour"].json()["events"]] == ["api_key_created"]
    assert [e["type"] for e in answers[old["prefix"]].json()["events"]] == [
        "api_key_created",
        "api_key_revoked",
    ]
    assert unknown.status_code == 404
    assert "no-such-key" in unknown.text


async def test_a_revoked_name_can_be_given_to_a_new_key(alice: httpx.AsyncClient) -> None:
    await declare(alice, "llama")
    first = await create_key(alice, name="ci", models=["llama"])
    await alice.delete(f"{KEYS}/ci")

    second = await create_key(alice, name="ci", models=["llama"])

    assert second["prefix"] != first["prefix"]
    assert second["key"] != first["key"]


async def test_a_live_keys_name_is_refused_to_another_key(
    alice: httpx.AsyncClient, bob: httpx.AsyncClient
) -> None:
    await declare(alice, "llama")
    first = await create_key(alice, name="ci", models=["llama"])

    answer = await bob.post(KEYS, json={"name": "ci", "models": ["*"]})

    body = problem_of(answer, 409, "invalid-operation")
    assert body["detail"] == (
        f"a live API key is already named 'ci' (prefix {first['prefix']}); revoke it first "
        "or choose another name"
    )
    assert [k["name"] for k in (await alice.get(KEYS)).json()] == ["ci"]


async def test_bad_requests_are_refused_with_every_reason_and_record_nothing(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await declare(alice, "llama")
    position = (await pg_store.catch_up()).position

    unknown = await alice.post(KEYS, json={"name": "ci", "models": ["lama"], "rpm": 0})
    not_a_number = await alice.post(KEYS, json={"name": "ci", "models": ["llama"], "rpm": "x"})
    no_models = await alice.post(KEYS, json={"name": "ci"})
    unknown_field = await alice.post(KEYS, json={"name": "ci", "models": ["*"], "owner": "me"})

    body = problem_of(unknown, 422, "invalid-key")
    assert body["errors"] == [
        {
            "field": "models",
            "reason": "'lama' is not declared (declared models: llama; '*' for every model)",
        },
        {"field": "rpm", "reason": "must be between 1 and 2147483647 (or left out)"},
    ]
    for answer in (not_a_number, no_models, unknown_field):
        assert answer.status_code == 400, answer.text
    assert "rpm" in not_a_number.text
    assert "models" in no_models.text
    assert "owner" in unknown_field.text
    assert (await pg_store.catch_up()).position == position


async def test_a_key_that_expires_is_recorded_in_utc_and_listed_as_expired_once_it_has(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await declare(alice, "llama")
    soon = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    in_tokyo = soon.astimezone(timezone(timedelta(hours=9)))

    created = await create_key(
        alice, name="demo", models=["llama"], expires_at=in_tokyo.isoformat()
    )
    forever = await create_key(alice, name="ci", models=["llama"])

    assert created["expires_at"] == soon.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert created["expired"] is False
    assert (forever["expires_at"], forever["expired"]) == (None, False)
    [recorded] = await pg_store.read_stream(key_stream(created["id"]))
    assert isinstance(recorded.event, ApiKeyCreated)
    assert recorded.event.expires_at == soon
    assert (await stored_key_row(pg_store, created["id"]))["expires_at"] == soon
    assert (await stored_key_row(pg_store, forever["id"]))["expires_at"] is None
    history = (await alice.get(f"/admin/v1/history/key/{created['id']}")).json()
    assert history["events"][0]["summary"] == (
        f"key demo ({created['prefix']}) created for llama, expires {soon:%Y-%m-%d %H:%M:%S} UTC"
    )
    assert history["events"][0]["data"]["expires_at"] == soon.strftime("%Y-%m-%dT%H:%M:%SZ")

    async def expired() -> bool:
        listed = {k["name"]: k for k in (await alice.get(KEYS)).json()}
        return bool(listed["demo"]["expired"])

    await wait_until(expired, within_s=15, every_s=0.2, what="the key listed as expired")
    listed = {k["name"]: k for k in (await alice.get(KEYS)).json()}
    assert (listed["demo"]["revoked"], listed["ci"]["expired"]) == (False, False)
    assert datetime.now(UTC) >= soon


async def test_an_expired_keys_name_may_be_taken_and_by_name_the_live_key_is_found(
    alice: httpx.AsyncClient,
) -> None:
    await declare(alice, "llama")
    soon = datetime.now(UTC) + timedelta(seconds=2)
    old = await create_key(alice, name="demo", models=["llama"], expires_at=soon.isoformat())
    taken = await alice.post(KEYS, json={"name": "demo", "models": ["llama"]})
    assert taken.status_code == 409, taken.text

    async def name_free() -> bool:
        answer = await alice.post(KEYS, json={"name": "demo", "models": ["llama"]})
        assert answer.status_code in (201, 409), answer.text
        return answer.status_code == 201

    await wait_until(name_free, within_s=15, every_s=0.2, what="the expired key's name free")
    history = (await alice.get("/admin/v1/history/key/demo")).json()
    revoked = await alice.delete(f"{KEYS}/demo")

    assert history["id"] != old["id"]
    assert revoked.json()["key"]["id"] == history["id"]
    assert revoked.json()["key"]["expired"] is False


async def test_an_expiry_past_too_far_or_without_a_timezone_is_refused_naming_the_field(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await declare(alice, "llama")
    position = (await pg_store.catch_up()).position
    now = datetime.now(UTC)

    answers = {
        reason: await alice.post(
            KEYS, json={"name": "demo", "models": ["llama"], "expires_at": value}
        )
        for reason, value in (
            ("must be in the future", (now - timedelta(minutes=1)).isoformat()),
            ("must be at most 10 years ahead", (now + timedelta(days=3660)).isoformat()),
            ("must say its timezone", "2027-01-31T00:00:00"),
        )
    }
    not_a_time = await alice.post(
        KEYS, json={"name": "demo", "models": ["llama"], "expires_at": "next tuesday"}
    )

    for reason, answer in answers.items():
        body = problem_of(answer, 422, "invalid-key")
        [error] = body["errors"]
        assert error["field"] == "expires_at"
        assert error["reason"].startswith(reason), error
    assert not_a_time.status_code == 400, not_a_time.text
    assert "expires_at" in not_a_time.text
    assert (await pg_store.catch_up()).position == position


async def test_a_lifetime_is_counted_by_the_server_s_clock_and_a_bad_one_is_refused(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await declare(alice, "llama")
    before = datetime.now(UTC)
    created = await create_key(alice, name="hour", models=["llama"], expires_in_s=3600)
    after = datetime.now(UTC)
    expires_at = datetime.fromisoformat(created["expires_at"])
    assert before + timedelta(hours=1) - timedelta(seconds=1) <= expires_at
    assert expires_at <= after + timedelta(hours=1)
    position = (await pg_store.catch_up()).position

    answers = {
        reason: await alice.post(KEYS, json={"name": "demo", "models": ["llama"], **fields})
        for reason, fields in (
            ("must be more than 0", {"expires_in_s": 0}),
            ("must be more than 0", {"expires_in_s": -5}),
            ("must be more than 0", {"expires_in_s": 1e300}),
            (
                "give expires_in_s or expires_at, not both",
                {"expires_in_s": 60, "expires_at": (after + timedelta(days=1)).isoformat()},
            ),
        )
    }
    not_a_number = await alice.post(
        KEYS, json={"name": "demo", "models": ["llama"], "expires_in_s": "an hour"}
    )

    for reason, answer in answers.items():
        body = problem_of(answer, 422, "invalid-key")
        [error] = body["errors"]
        assert error["field"] == "expires_in_s"
        assert error["reason"].startswith(reason), error
    assert not_a_number.status_code == 400, not_a_number.text
    assert "expires_in_s" in not_a_number.text
    assert (await pg_store.catch_up()).position == position


async def test_revoking_what_does_not_exist_is_404(alice: httpx.AsyncClient) -> None:
    answer = await alice.delete(f"{KEYS}/nobody")

    body = problem_of(answer, 404, "unknown-key")
    assert body["detail"] == "no API key (by prefix or name) 'nobody' is known"
    assert body["id"] == "nobody"


async def test_without_a_token_nothing_about_keys_is_shown_or_changed(admin_url: str) -> None:
    async with httpx.AsyncClient(base_url=admin_url) as stranger:
        answers = [
            await stranger.get(KEYS),
            await stranger.post(KEYS, json={"name": "ci", "models": ["*"]}),
            await stranger.delete(f"{KEYS}/ci"),
        ]

    assert [a.status_code for a in answers] == [401, 401, 401]


async def test_creations_of_one_name_at_once_in_one_process_make_one_key(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await declare(alice, "llama")
    operations = Operations(pg_store)

    outcomes = await asyncio.gather(
        *(operations.create_key(Caller(actor="alice"), "ci", ["llama"]) for _ in range(3)),
        return_exceptions=True,
    )

    assert sorted(type(o).__name__ for o in outcomes) == [
        "DuplicateKeyName",
        "DuplicateKeyName",
        "NewKey",
    ]
    assert [k.name for k in await operations.list_keys()] == ["ci"]


async def test_a_model_listed_twice_is_refused_naming_where_and_records_nothing(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    # It was created with the model once, silently: the second was most likely meant to be
    # another model, which the key then could not use.
    await declare(alice, "llama")
    position = (await pg_store.catch_up()).position

    answer = await alice.post(KEYS, json={"name": "ci", "models": ["llama", "llama"]})

    body = problem_of(answer, 422, "invalid-key")
    assert body["errors"] == [
        {
            "field": "models",
            "reason": "'llama' is listed twice (models[0] and models[1]): list each model once",
        }
    ]
    assert (await pg_store.catch_up()).position == position
    assert (await alice.get(KEYS)).json() == []
