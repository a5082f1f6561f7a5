"""`llmgw-cli keys` as an operator runs it: the installed console script, a process of its
own, against the admin API served by uvicorn on a loopback socket (real HTTP) over a fresh
PostgreSQL database per test. Two operators, alice and bob, hold tokens; what they did is
read back with `llmgw-cli history key` and from the ``api_keys`` projection."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from app.domain.keys import key_matches
from app.store.database import connection
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client, serving_admin
from tests.support.operator_cli import Result, run_cli
from tests.support.waiting import wait_until

TOKENS = {"alice": secrets.token_hex(16), "bob": secrets.token_hex(16)}
KEY = re.compile(r"^\s+(llmgw-[0-9a-f]{8}-[A-Za-z0-9_-]{43})$", re.MULTILINE)
CI_KEY = (
    *("keys", "create", "--name", "ci", "--models", "llama-3-8b, qwen-2-7b"),
    *("--rpm", "60", "--tpm", "100000"),
)


@dataclass(frozen=True)
class Operator:
    """Runs ``llmgw-cli ...`` from a scratch home as ``name``, with only the settings given."""

    home: Path
    url: str
    name: str

    async def cli(self, *args: str, token: str | None = None) -> Result:
        """As ``name`` with its own token, or with ``token`` instead ("" for none)."""
        settings = {"LLMGW_ADMIN_URL": self.url}
        if token is None:
            settings["LLMGW_ADMIN_TOKEN"] = TOKENS[self.name]
        elif token:
            settings["LLMGW_ADMIN_TOKEN"] = token
        return await run_cli(*args, home=self.home, settings=settings)


@pytest_asyncio.fixture(loop_scope="session")
async def admin_url(pg_store: PostgresEventStore) -> AsyncIterator[str]:
    tokens = {token: name for name, token in TOKENS.items()}
    async with (
        serving_admin(pg_store, tokens=tokens) as url,
        bearer_client(url, TOKENS["alice"]) as client,
    ):
        for model in ("llama-3-8b", "qwen-2-7b"):
            answer = await client.put(
                f"/admin/v1/models/{model}",
                json={"command": "vllm serve {model} --port {port}"},
            )
            assert answer.status_code == 200, answer.text
        yield url


@pytest.fixture
def alice(tmp_path: Path, admin_url: str) -> Operator:
    return Operator(home=tmp_path, url=admin_url, name="alice")


@pytest.fixture
def bob(tmp_path: Path, admin_url: str) -> Operator:
    return Operator(home=tmp_path, url=admin_url, name="bob")


async def stored_hash(store: PostgresEventStore, prefix: str) -> str:
    async with connection(store.engine) as db:
        value: str = await db.fetchval("SELECT secret_hash FROM api_keys WHERE prefix = $1", prefix)
    return value


async def create_as_json(operator: Operator, name: str, models: str) -> dict[str, Any]:
    result = await operator.cli(
        "keys", "create", "--name", name, "--models", models, "--output", "json"
    )
    created: dict[str, Any] = result.json()
    return created


def table_rows(stdout: str) -> list[list[str]]:
    """The body rows of a keys table, as cells (rows start with a prefix)."""
    rows = []
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and re.fullmatch(r"[0-9a-f]{8}", cells[0]):
            rows.append(cells)
    return rows


# -- the stories -------------------------------------------------------------------------


async def test_a_created_key_is_printed_once_with_a_warning_and_works_against_its_hash(
    alice: Operator, pg_store: PostgresEventStore
) -> None:
    created = await alice.cli(*CI_KEY)

    assert created.code == 0, created.stderr
    [key] = KEY.findall(created.stdout)
    prefix = key.split("-")[1]
    assert "Created API key ci (models llama-3-8b, qwen-2-7b; 60 requests/min, 100000 " in (
        created.stdout
    )
    assert f"prefix {prefix}, id k-{prefix}" in created.stdout
    assert "shown this once and cannot be shown again" in created.stderr
    assert key not in created.stderr
    assert key_matches(key, await stored_hash(pg_store, prefix))

    listed = await alice.cli("keys", "list")

    assert listed.code == 0, listed.stderr
    assert key not in listed.stdout
    [row] = table_rows(listed.stdout)
    assert row[:7] == [prefix, "ci", "live", "llama-3-8b, qwen-2-7b", "60", "100000", "never"]
    assert row[8:] == ["alice", "", "", f"k-{prefix}"]
    assert "1 API key (1 live)" in listed.stdout
    assert f"prefix {prefix}, id k-{prefix}, never expires" in created.stdout


async def test_json_output_is_the_apis_answer_and_reads_back(alice: Operator) -> None:
    created = await create_as_json(alice, "nb", "*")
    other = await create_as_json(alice, "bot", "qwen-2-7b")
    revoked = (await alice.cli("keys", "revoke", "bot", "--output", "json")).json()

    everything = (await alice.cli("keys", "list", "--output", "json")).json()
    live = (await alice.cli("keys", "list", "--live", "--output", "json")).json()

    assert re.fullmatch(r"llmgw-[0-9a-f]{8}-[A-Za-z0-9_-]{43}", created["key"])
    assert created["models"] == ["*"]
    assert (created["rpm"], created["tpm"], created["created_by"]) == (None, None, "alice")
    assert (created["expires_at"], created["expired"]) == (None, False)
    assert revoked["changed"] is True
    assert revoked["key"]["prefix"] == other["prefix"]
    assert [k["prefix"] for k in everything] == [created["prefix"], other["prefix"]]
    assert [k["prefix"] for k in live] == [created["prefix"]]
    assert everything[1]["revoked_by"] == "alice"
    assert all("key" not in k and not any("hash" in f for f in k) for k in everything)
    assert {k: v for k, v in created.items() if k != "key"} == everything[0]


async def test_revoking_by_name_then_by_prefix_and_the_history_names_both_operators(
    alice: Operator, bob: Operator
) -> None:
    created = await create_as_json(alice, "ci", "llama-3-8b")
    prefix, key_id = created["prefix"], created["id"]

    first = await bob.cli("keys", "revoke", "ci")
    again = await alice.cli("keys", "revoke", prefix)
    history = await alice.cli("history", "key", key_id)

    assert first.code == 0, first.stderr
    assert first.stdout.strip() == f"Revoked API key ci (prefix {prefix})."
    assert again.code == 0, again.stderr
    assert re.match(
        rf"API key ci \(prefix {prefix}\) was already revoked by bob at "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC; nothing changed\.",
        again.stdout,
    )
    assert history.code == 0, history.stderr
    events = [
        (cells[2], cells[3])
        for line in history.stdout.splitlines()
        if (cells := [c.strip() for c in line.split("│")[1:-1]]) and cells[0].isdigit()
    ]
    assert events == [("api_key_created", "alice"), ("api_key_revoked", "bob")]
    assert f"key ci ({prefix}) created for llama-3-8b" in history.stdout


async def test_by_name_the_one_key_not_yet_revoked_is_revoked_and_two_are_refused(
    alice: Operator,
) -> None:
    async def expired_key() -> str:
        """A key named ci, created to expire in a second, once the server says it has."""
        created = (await alice.cli(*CI_KEY, "--expires-in", "1s", "--output", "json")).json()

        async def expired() -> bool:
            async with bearer_client(alice.url, TOKENS["alice"]) as client:
                listed = (await client.get("/admin/v1/keys")).json()
            return any(k["prefix"] == created["prefix"] and k["expired"] for k in listed)

        await wait_until(expired, within_s=20, every_s=0.2, what="the ci key expired")
        prefix: str = created["prefix"]
        return prefix

    old, newer = await expired_key(), await expired_key()

    both = await alice.cli("keys", "revoke", "ci")
    by_prefix = await alice.cli("keys", "revoke", newer)
    by_name = await alice.cli("keys", "revoke", "ci")
    again = await alice.cli("keys", "revoke", "ci")

    assert both.code == 1, both.stdout
    first, second = sorted((old, newer))
    assert (
        f"2 API keys named 'ci' have expired and are not revoked (prefixes {first}, {second}); "
        "revoke one by its prefix"
    ) in both.stderr
    assert by_prefix.stdout.strip() == f"Revoked API key ci (prefix {newer})."
    # Before, the revoked key (it ended last) was found: "already revoked; nothing changed".
    assert by_name.code == 0, by_name.stderr
    assert by_name.stdout.strip() == f"Revoked API key ci (prefix {old})."
    assert again.code == 0, again.stderr
    assert again.stdout.startswith(f"API key ci (prefix {old}) was already revoked by alice")


async def test_refusals_say_why_and_exit_1(alice: Operator) -> None:
    unknown_model = await alice.cli("keys", "create", "--name", "ci", "--models", "lama")
    created = await alice.cli("keys", "create", "--name", "ci", "--models", "llama-3-8b")
    duplicate = await alice.cli("keys", "create", "--name", "ci", "--models", "qwen-2-7b")
    unknown_key = await alice.cli("keys", "revoke", "nobody")

    assert unknown_model.code == 1
    assert (
        "'lama' is not declared (declared models: llama-3-8b, qwen-2-7b; '*' for every model)"
        in unknown_model.stderr
    )
    assert unknown_model.stdout == ""
    assert created.code == 0, created.stderr
    assert duplicate.code == 1
    assert "a live API key is already named 'ci'" in duplicate.stderr
    assert unknown_key.code == 1
    assert "no API key (by prefix or name) 'nobody' is known" in unknown_key.stderr


async def test_without_a_token_nothing_is_created(alice: Operator) -> None:
    refused = await alice.cli("keys", "create", "--name", "ci", "--models", "*", token="")
    listed = await alice.cli("keys", "list", "--output", "json")

    assert refused.code == 1
    assert "authentication required: set LLMGW_ADMIN_TOKEN" in refused.stderr
    assert listed.json() == []


async def test_bad_usage_exits_with_2(alice: Operator) -> None:
    zero_rpm = await alice.cli("keys", "create", "--name", "ci", "--models", "*", "--rpm", "0")
    no_models = await alice.cli("keys", "create", "--name", "ci", "--models", " , ")
    missing_name = await alice.cli("keys", "create", "--models", "*")
    both = await alice.cli(
        *("keys", "create", "--name", "ci", "--models", "*", "--expires-in", "30d"),
        *("--expires-at", "2030-01-31T00:00:00Z"),
    )
    past = await alice.cli(
        "keys", "create", "--name", "ci", "--models", "*", "--expires-at", "2020-01-31T00:00Z"
    )
    listed = await alice.cli("keys", "list", "--output", "json")

    assert (zero_rpm.code, no_models.code, missing_name.code) == (2, 2, 2)
    assert "--models names no model" in no_models.stderr
    assert (both.code, past.code) == (2, 2)
    assert "give --expires-in or --expires-at, not both" in both.stderr
    assert "--expires-at 2020-01-31T00:00:00+00:00 is not in the future" in past.stderr
    assert listed.json() == []


async def test_a_key_that_expires_says_when_and_is_listed_expired_once_it_has(
    alice: Operator,
) -> None:
    created = await alice.cli(*CI_KEY, "--expires-in", "2s")
    month = await create_as_json(alice, "contractor", "qwen-2-7b")
    assert created.code == 0, created.stderr
    [key] = KEY.findall(created.stdout)
    prefix = key.split("-")[1]
    [shown] = re.findall(r", expires (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC\n", created.stdout)

    async def listed_expired() -> bool:
        keys = (await alice.cli("keys", "list", "--output", "json")).json()
        return any(k["prefix"] == prefix and k["expired"] for k in keys)

    await wait_until(listed_expired, within_s=20, every_s=0.5, what="the key listed as expired")
    listed = await alice.cli("keys", "list")
    live = await alice.cli("keys", "list", "--live")
    live_json = (await alice.cli("keys", "list", "--live", "--output", "json")).json()
    history = await alice.cli("history", "key", "ci")

    rows = {row[0]: row for row in table_rows(listed.stdout)}
    assert rows[prefix][1:3] == ["ci", "expired"]
    assert rows[prefix][6] == shown
    assert rows[month["prefix"]][1:3] == ["contractor", "live"]
    assert "expires (UTC)" in listed.stdout
    assert "2 API keys (1 live)" in listed.stdout
    assert [row[0] for row in table_rows(live.stdout)] == [month["prefix"]]
    assert [k["prefix"] for k in live_json] == [month["prefix"]]
    assert history.code == 0, history.stderr
    assert f"key ci ({prefix}) created for llama-3-8b, qwen-2-7b, expires {shown} UTC" in (
        " ".join(history.stdout.split())
    )


async def test_every_keys_command_has_help_with_an_example(alice: Operator) -> None:
    commands = ("create", "list", "revoke")

    helps = await asyncio.gather(*(alice.cli("keys", c, "--help") for c in commands))

    for command, shown in zip(commands, helps, strict=True):
        assert shown.code == 0, shown.stderr
        assert re.search(rf"^\s+llmgw-cli keys {command}\b", shown.stdout, re.MULTILINE), (
            shown.stdout
        )
