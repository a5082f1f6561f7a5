"""``llmgw-server serve`` and ``gateway`` refuse to run as a database role that could
rewrite the event log, as real processes: one line that names the role and what to do,
exit 1, and nothing appended. ``--allow-privileged-role`` starts anyway, with a warning.

The roles a managed PostgreSQL has (an owner that is no superuser, a member of it) are
made here, each test its own, and dropped afterwards.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

from app.store.privileges import privileged_role
from devcluster.errors import DevDatabaseError
from devcluster.postgres import LocalPostgres, find_bindir
from tests.support.admin_server import LOOPBACK, Pki, write_pki
from tests.support.databases import migrate_for_tests, runtime_url
from tests.support.operator_cli import clean_environment, installed
from tests.support.ports import free_port
from tests.support.postgres import LocalServer, PostgresServer, quote_identifier
from tests.support.serve_process import serving_process
from tests.support.waiting import wait_until

REFUSED_WITHIN_S = 60
ADVICE = (
    "so it could rewrite the event log; connect as the runtime role instead "
    "(`llmgw-server migrate --runtime-role llmgw_runtime` sets it up, docs/security.md), or "
    "pass --allow-privileged-role (LLMGW_ALLOW_PRIVILEGED_ROLE=1) to serve anyway\n"
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("pki"), "alice", "gpu-1")


def url_as(database_url: str, role: str) -> str:
    return make_url(database_url).set(username=role).render_as_string(hide_password=False)


def serve(database_url: str, pki: Pki, *flags: str) -> subprocess.CompletedProcess[str]:
    certificate, key = pki.pair("server")
    return subprocess.run(
        [
            installed("llmgw-server"),
            "serve",
            *("--database-url", database_url, "--admin-port", str(free_port())),
            *("--agent-host", LOOPBACK, "--agent-port", str(free_port()), "--no-gateway"),
            *("--tls-cert", str(certificate), "--tls-key", str(key), "--tls-ca", str(pki.ca)),
            *flags,
        ],
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=REFUSED_WITHIN_S,
        check=False,
    )


def gateway(database_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [installed("llmgw-server"), "gateway", "--database-url", database_url],
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=REFUSED_WITHIN_S,
        check=False,
    )


async def events_in(database_url: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        count: int = await connection.fetchval("SELECT count(*) FROM events")
        return count
    finally:
        await connection.close()


async def test_serve_refuses_a_superuser_in_one_line(database_url: str, pki: Pki) -> None:
    refused = await asyncio.to_thread(serve, database_url, pki)

    assert refused.returncode == 1
    assert refused.stdout == ""
    assert (
        refused.stderr
        == f'llmgw-server serve: the database role "postgres" is a superuser, {ADVICE}'
    )
    assert await events_in(database_url) == 0


async def test_a_standalone_gateway_refuses_a_superuser_too(database_url: str) -> None:
    refused = await asyncio.to_thread(gateway, database_url)

    assert refused.returncode == 1
    assert (
        refused.stderr
        == f'llmgw-server gateway: the database role "postgres" is a superuser, {ADVICE}'
    )


async def test_serve_with_allow_privileged_role_starts_and_warns(
    database_url: str, pki: Pki, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    async with serving_process(
        database_url,
        pki,
        log,
        token_name="alice",
        token="privileged-0123456789",
        admin_tls=False,
        as_owner=True,
        flags=["--allow-privileged-role"],
    ):
        pass

    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    warnings = [line for line in lines if line.get("level") == "warning"]
    assert {
        "event": "database_role_privileged",
        "detail": "serving with a privileged database role: it could rewrite the event log",
        "role": "postgres",
        "reason": "is a superuser",
    }.items() <= warnings[0].items()


@pytest_asyncio.fixture(loop_scope="session")
async def owner_and_member(
    postgres_server: PostgresServer, database_url: str
) -> AsyncIterator[tuple[str, str]]:
    """An owner of the log's tables that is no superuser (as on a managed PostgreSQL), and
    a role that is a member of it."""
    owner, member = (f"llmgw_{kind}_{uuid.uuid4().hex[:8]}" for kind in ("owner", "member"))
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f"CREATE ROLE {owner} LOGIN")
        await admin.execute(f"CREATE ROLE {member} LOGIN IN ROLE {owner}")
        for table in ("events", "models"):
            await admin.execute(f"ALTER TABLE {table} OWNER TO {owner}")
        yield owner, member
    finally:
        await admin.close()
    await postgres_server.drop_database(make_url(database_url).database or "")
    cleanup = await asyncpg.connect(postgres_server.admin_url)
    try:
        for role in (member, owner):
            await cleanup.execute(f"DROP ROLE {quote_identifier(role)}")
    finally:
        await cleanup.close()


async def test_the_owner_of_the_log_and_its_members_are_refused(
    database_url: str, pki: Pki, owner_and_member: tuple[str, str]
) -> None:
    owner, member = owner_and_member

    refused = await asyncio.to_thread(serve, url_as(database_url, owner), pki)

    assert refused.returncode == 1
    assert (
        refused.stderr
        == f'llmgw-server serve: the database role "{owner}" owns table events, {ADVICE}'
    )
    assert await privileged_role(url_as(database_url, member)) == (
        member,
        f'is a member of "{owner}", which owns table events',
    )
    assert await privileged_role(runtime_url(database_url)) == ("llmgw_runtime_test", None)


async def test_a_role_granted_writes_on_the_log_by_hand_is_refused(database_url: str) -> None:
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute("GRANT UPDATE (actor) ON events TO llmgw_runtime_test")
        column = await privileged_role(runtime_url(database_url))
        await admin.execute("REVOKE UPDATE (actor) ON events FROM llmgw_runtime_test")
        await admin.execute("GRANT TRUNCATE ON replicas TO llmgw_runtime_test")
        table = await privileged_role(runtime_url(database_url))
    finally:
        await admin.close()

    assert column == ("llmgw_runtime_test", "may UPDATE events directly")
    assert table == ("llmgw_runtime_test", "may TRUNCATE replicas directly")


def start_gateway(database_url: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen(
            [
                *(installed("llmgw-server"), "gateway", "--database-url", database_url),
                *("--port", str(free_port()), "--metrics-port", "0"),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=clean_environment(),
        )


async def test_a_gateway_started_while_the_database_is_away_refuses_once_it_answers(
    tmp_path: Path,
) -> None:
    try:
        find_bindir()
    except DevDatabaseError as exc:
        pytest.skip(str(exc))
    log = tmp_path / "gateway.log"
    with LocalPostgres(durable=False) as cluster:
        server = LocalServer(cluster)
        await server.create_database("llmgw")
        await asyncio.to_thread(migrate_for_tests, server.url("llmgw"))
        await server.stop()
        gateway = start_gateway(server.url("llmgw"), log)
        try:
            await wait_until(
                lambda: "cannot check the database role yet" in log.read_text(),
                what="the gateway serving without its database",
            )
            assert gateway.poll() is None
            await server.start()
            code = await asyncio.to_thread(gateway.wait, REFUSED_WITHIN_S)
        finally:
            if gateway.poll() is None:
                gateway.kill()
                gateway.wait()

    assert code == 1
    assert (
        f'llmgw-server gateway: the database role "postgres" is a superuser, {ADVICE}'
        in log.read_text()
    )


async def test_a_role_that_may_create_in_the_schema_is_refused(database_url: str) -> None:
    """``llmgw_append`` runs as the owner and looks up what it calls in llmgw's schema: a
    function the runtime role created there (a closer match for one of those calls) would
    run as the owner, and could rewrite the log."""
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute("GRANT CREATE ON SCHEMA public TO llmgw_runtime_test")
        refused = await privileged_role(runtime_url(database_url))
    finally:
        await admin.close()

    assert refused == (
        "llmgw_runtime_test",
        "may create objects in schema public, where llmgw's functions find what they call "
        "as the owner",
    )


async def test_a_gateway_run_as_the_runtime_role_warns_that_it_could_append(
    database_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "gateway.log"
    gateway = start_gateway(runtime_url(database_url), log)
    try:
        await wait_until(
            lambda: "gateway_role_may_append" in log.read_text(),
            within_s=REFUSED_WITHIN_S,
            what="the gateway's warning about its role",
        )
        assert gateway.poll() is None
    finally:
        gateway.terminate()
        gateway.wait()

    assert "--gateway-role llmgw_gateway" in log.read_text()
