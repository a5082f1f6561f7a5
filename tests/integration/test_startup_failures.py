"""``llmgw-server serve`` and ``gateway`` that cannot start say so in one line on stderr,
as real processes: which listener cannot bind which address and what to do; exit code 1,
never a traceback, and nothing appended (a schema of another release:
``test_serve_schema.py``).

What an operator at a terminal, in the journal or in a container log reads first is that
line (``llmgw-server serve: cannot serve: ...``); the JSON log line with the same reason
is still written for whoever collects the logs.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import uuid
from collections.abc import Iterator

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from tests.support.admin_server import LOOPBACK, Pki, write_pki
from tests.support.databases import runtime_url
from tests.support.operator_cli import clean_environment, installed
from tests.support.ports import free_port

GIVEN_UP_WITHIN_S = 60
IN_USE = "Address already in use; stop what listens there, or choose another port"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("pki"), "alice", "gpu-1")


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.create_server((LOOPBACK, 0)) as holder:
        yield holder.getsockname()[1]


def serve(
    database_url: str,
    pki: Pki,
    *flags: str,
    admin_port: int | None = None,
    agent_port: int | None = None,
) -> subprocess.CompletedProcess[str]:
    certificate, key = pki.pair("server")
    admin_port = admin_port if admin_port is not None else free_port()
    agent_port = agent_port if agent_port is not None else free_port()
    return subprocess.run(
        [
            installed("llmgw-server"),
            *("serve", "--database-url", database_url, "--no-gateway"),
            *("--admin-port", str(admin_port), "--agent-host", LOOPBACK),
            *("--agent-port", str(agent_port)),
            *("--tls-cert", str(certificate), "--tls-key", str(key), "--tls-ca", str(pki.ca)),
            *flags,
        ],
        capture_output=True,
        text=True,
        env=clean_environment(LLMGW_LOG_FORMAT="json"),
        timeout=GIVEN_UP_WITHIN_S,
        check=False,
    )


async def events_in(database_url: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        count: int = await connection.fetchval("SELECT count(*) FROM events")
        return count
    finally:
        await connection.close()


def gateway(database_url: str, *, port: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            installed("llmgw-server"),
            *("gateway", "--database-url", database_url),
            *("--port", str(port or free_port()), "--metrics-port", str(free_port())),
        ],
        capture_output=True,
        text=True,
        env=clean_environment(LLMGW_LOG_FORMAT="json"),
        timeout=GIVEN_UP_WITHIN_S,
        check=False,
    )


def said(finished: subprocess.CompletedProcess[str], program: str) -> list[str]:
    """What ``program`` said itself on stderr: the lines that are not JSON log lines."""
    assert "Traceback" not in finished.stderr, finished.stderr
    return [line for line in finished.stderr.splitlines() if line.startswith(f"{program}:")]


async def test_serve_whose_admin_port_is_taken_says_so_and_exits_1(
    database_url: str, pki: Pki, taken_port: int
) -> None:
    refused = await asyncio.to_thread(serve, runtime_url(database_url), pki, admin_port=taken_port)

    assert said(refused, "llmgw-server serve") == [
        "llmgw-server serve: cannot serve: the admin API (--admin-host, --admin-port) cannot "
        f"listen on {LOOPBACK}:{taken_port}: {IN_USE}"
    ]
    assert refused.returncode == 1, refused.stderr
    assert await events_in(database_url) == 0


async def test_serve_whose_agent_port_is_taken_names_the_agent_hub(
    database_url: str, pki: Pki, taken_port: int
) -> None:
    refused = await asyncio.to_thread(serve, runtime_url(database_url), pki, agent_port=taken_port)

    assert said(refused, "llmgw-server serve") == [
        "llmgw-server serve: cannot serve: the agent hub (--agent-host, --agent-port) cannot "
        f"listen on {LOOPBACK}:{taken_port}: {IN_USE}"
    ]
    assert refused.returncode == 1, refused.stderr


async def test_serve_as_a_role_granted_nothing_says_how_to_grant_it(
    database_url: str, pki: Pki
) -> None:
    role = f"llmgw_ungranted_{uuid.uuid4().hex[:8]}"
    owner = await asyncpg.connect(database_url)
    try:
        await owner.execute(f"CREATE ROLE {role} LOGIN")
        url = make_url(database_url).set(username=role).render_as_string(hide_password=False)
        refused = await asyncio.to_thread(serve, url, pki)
    finally:
        await owner.execute(f"DROP ROLE {role}")
        await owner.close()

    assert said(refused, "llmgw-server serve") == [
        "llmgw-server serve: cannot serve: database error: permission denied for table "
        "alembic_version: the role lacks the runtime privileges in this database; as the "
        "schema's owner, grant them with `llmgw-server migrate --runtime-role ROLE` "
        "(docs/security.md)"
    ]
    assert refused.returncode == 1, refused.stderr


async def test_serve_on_a_database_that_never_answers_gives_up_saying_so(
    pki: Pki, taken_port: int
) -> None:
    """The port takes the connection (the kernel does) and says nothing, as a database
    behind a stalled machine or a firewall that drops the replies."""
    silent = f"postgresql://llmgw@{LOOPBACK}:{taken_port}/llmgw"

    refused = await asyncio.to_thread(serve, silent, pki)

    assert said(refused, "llmgw-server serve") == [
        "llmgw-server serve: cannot serve: database unreachable: no answer within 10 s from "
        "--database-url's host and port (LLMGW_DATABASE_URL); is PostgreSQL listening there?"
    ]
    assert refused.returncode == 1, refused.stderr


async def test_a_gateway_whose_port_is_taken_says_so_on_stderr(
    database_url: str, taken_port: int
) -> None:
    refused = await asyncio.to_thread(gateway, runtime_url(database_url), port=taken_port)

    assert said(refused, "llmgw-server gateway") == [
        f"llmgw-server gateway: cannot serve: the gateway cannot listen on "
        f"{LOOPBACK}:{taken_port}: {IN_USE}"
    ]
    assert refused.returncode == 1, refused.stderr


@pytest.mark.parametrize("program", ["serve", "gateway"])
async def test_a_database_that_does_not_exist_is_refused_at_once_not_asked_again(
    database_url: str, pki: Pki, program: str
) -> None:
    """A name, user or password PostgreSQL refuses is a mistake in the URL: a gateway took
    it for a database away, listened, served nothing and asked again every 5 s for ever;
    serve called it unreachable."""
    missing = make_url(database_url).set(database=f"llmgw_missing_{uuid.uuid4().hex[:8]}")
    url = missing.render_as_string(hide_password=False)
    if program == "serve":
        refused = await asyncio.to_thread(serve, url, pki)
    else:
        refused = await asyncio.to_thread(gateway, url)

    assert said(refused, f"llmgw-server {program}") == [
        f"llmgw-server {program}: the database refused the connection of --database-url "
        f'(LLMGW_DATABASE_URL): database "{missing.database}" does not exist; check its user, '
        "password and database name"
    ]
    assert refused.returncode == 1, refused.stderr
