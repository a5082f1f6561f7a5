"""``llmgw-server serve`` runs only on a schema at its release's newest revision, as a real
process: on a database not migrated, migrated by an older release only, or by a newer
one, it says so in one line naming the revisions, exits 1 and appends nothing. What stops
it from starting otherwise (its admin port taken) is exit code 1 too, never 3 (deposed).
A standalone gateway refuses a database not migrated (or left by an older release) the same
way, also when it started while PostgreSQL could not be reached and asks once it answers;
one a newer release migrated it serves from, as gateways are rolled last."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from app.commands.gateway import ROLE_CHECK_RETRY_S
from app.store import migrate
from app.store.database_url import parse_database_url
from tests.support.admin_server import LOOPBACK, Pki, write_pki
from tests.support.operator_cli import clean_environment, installed
from tests.support.ports import free_port
from tests.support.postgres import PostgresServer, unique_database_name
from tests.support.tcp_relay import TcpRelay
from tests.support.waiting import wait_until

REFUSED_WITHIN_S = 60
HEAD = "0020"
MIGRATE_FIRST = "run `llmgw-server migrate` of this release first, as the schema's owner"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("pki"), "alice", "gpu-1")


@pytest_asyncio.fixture
async def scratch(postgres_server: PostgresServer) -> AsyncIterator[str]:
    name = unique_database_name("llmgw_serve_schema")
    await postgres_server.create_database(name)
    try:
        yield postgres_server.url(name)
    finally:
        await postgres_server.drop_database(name)


def serve(database_url: str, pki: Pki, *flags: str) -> subprocess.CompletedProcess[str]:
    certificate, key = pki.pair("server")
    return subprocess.run(
        [
            installed("llmgw-server"),
            "serve",
            "--database-url",
            database_url,
            *(flags or ("--admin-port", str(free_port()))),
            *("--agent-host", LOOPBACK, "--agent-port", str(free_port()), "--no-gateway"),
            *("--tls-cert", str(certificate), "--tls-key", str(key), "--tls-ca", str(pki.ca)),
            # The test's role is a superuser: the schema is what this test is about.
            "--allow-privileged-role",
        ],
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=REFUSED_WITHIN_S,
        check=False,
    )


async def _execute(url: str, statement: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def _relations(url: str) -> int:
    connection = await asyncpg.connect(url)
    try:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        )
    finally:
        await connection.close()
    return count


def last_line(text: str) -> str:
    return text.rstrip("\n").rsplit("\n", 1)[-1]


def test_this_release_needs_the_revision_the_messages_name() -> None:
    assert migrate.head_revision() == HEAD


async def test_serve_refuses_a_database_not_migrated_in_one_line(scratch: str, pki: Pki) -> None:
    """It used to start and die on its first read with a traceback
    (``UndefinedTableError: relation "events" does not exist``)."""
    refused = await asyncio.to_thread(serve, scratch, pki)

    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    assert last_line(refused.stderr) == (
        "llmgw-server serve: the database is not migrated (no llmgw schema in it); "
        f"{MIGRATE_FIRST}, to bring it to revision {HEAD}"
    )
    assert await _relations(scratch) == 0


async def test_serve_refuses_a_schema_an_older_release_left(scratch: str, pki: Pki) -> None:
    await asyncio.to_thread(migrate.upgrade, scratch, "0016")

    refused = await asyncio.to_thread(serve, scratch, pki)

    assert refused.returncode == 1
    assert last_line(refused.stderr) == (
        f"llmgw-server serve: the database schema is at revision 0016, this release needs "
        f"{HEAD}; {MIGRATE_FIRST} (docs/operations.md#upgrades)"
    )


async def test_serve_refuses_a_schema_a_newer_release_migrated(scratch: str, pki: Pki) -> None:
    """It used to start, lead and reconcile on tables it was not written for; only its
    ``/readyz`` said something was wrong."""
    await asyncio.to_thread(migrate.upgrade, scratch)
    await _execute(scratch, "UPDATE alembic_version SET version_num = '0099'")

    refused = await asyncio.to_thread(serve, scratch, pki)

    assert refused.returncode == 1
    assert last_line(refused.stderr) == (
        "llmgw-server serve: the database schema is at revision 0099, which this release "
        f"does not know (its newest is {HEAD}): a newer llmgw release migrated it; run that "
        "release"
    )
    connection = await asyncpg.connect(scratch)
    try:
        assert await connection.fetchval("SELECT count(*) FROM events") == 0
        assert await connection.fetchval("SELECT count(*) FROM leadership") == 0
    finally:
        await connection.close()


async def test_serve_whose_admin_port_is_taken_fails_with_1_not_the_deposed_3(
    database_url: str, pki: Pki
) -> None:
    """uvicorn ended the process with its own exit code 3 when it could not listen: the
    code that tells an operator this server was deposed and comes back as a standby."""
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        failed = await asyncio.to_thread(serve, database_url, pki, "--admin-port", str(port))

    logged = [json.loads(line) for line in failed.stderr.splitlines() if line.startswith("{")]
    assert failed.returncode == 1
    assert [line["error"] for line in logged if line["event"] == "serve_failed"] == [
        f"the admin API (--admin-host, --admin-port) cannot listen on {LOOPBACK}:{port}: "
        "Address already in use; stop what listens there, or choose another port"
    ]


def gateway_command(database_url: str) -> list[str]:
    return [
        installed("llmgw-server"),
        "gateway",
        *("--database-url", database_url, "--allow-privileged-role"),
        *("--port", str(free_port()), "--metrics-port", str(free_port())),
    ]


def gateway(database_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gateway_command(database_url),
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=REFUSED_WITHIN_S,
        check=False,
    )


async def test_a_gateway_refuses_a_database_not_migrated_in_one_line(scratch: str) -> None:
    """It used to start, say it listened, and answer every request with an error, logging
    ``relation "gateway_reports" does not exist`` every second."""
    refused = await asyncio.to_thread(gateway, scratch)

    assert refused.returncode == 1
    assert last_line(refused.stderr) == (
        "llmgw-server gateway: the database is not migrated (no llmgw schema in it); "
        f"{MIGRATE_FIRST}, to bring it to revision {HEAD}"
    )


async def test_a_gateway_started_while_the_database_is_away_refuses_it_not_migrated_once_it_answers(
    scratch: str, tmp_path: Path
) -> None:
    """It used to check only the role once the database answered, and went on serving from
    a database it cannot serve from: one not migrated, or one an older release left (a
    gateway of a new release started while PostgreSQL restarted during the upgrade)."""
    (host, port), *_ = parse_database_url(scratch).hosts
    assert port is not None
    log = tmp_path / "gateway.log"
    async with TcpRelay(host, port) as relay:
        relay.refuse()
        with log.open("wb") as output:
            process = await asyncio.create_subprocess_exec(
                *gateway_command(relay.in_front_of(scratch)),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=output,
                env=clean_environment(),
            )
        try:
            await wait_until(
                lambda: "database_role_unchecked" in log.read_text(),
                within_s=REFUSED_WITHIN_S,
                what="the gateway started unchecked",
            )
            relay.mend()
            await wait_until(
                lambda: process.returncode is not None,
                within_s=ROLE_CHECK_RETRY_S + 10,
                what="the gateway's exit once the database answers",
            )
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()

    assert process.returncode == 1
    assert (
        "llmgw-server gateway: the database is not migrated (no llmgw schema in it); "
        f"{MIGRATE_FIRST}, to bring it to revision {HEAD}"
    ) in log.read_text().splitlines()
