"""``llmgw-server serve --admin-tls-cert ...`` as an operator meets it: the real server
process on a free port, the installed ``llmgw-cli`` presenting an operator certificate
from its environment, real TLS on both sides."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from app.store.database import create_engine
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import LOOPBACK, Pki, seed_node, write_pki
from tests.support.operator_cli import Result, clean_environment, installed, run_cli
from tests.support.postgres import PostgresServer, unique_database_name
from tests.support.serve_process import serving_process
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

TOKEN = secrets.token_hex(16)
PROCESS_TIMEOUT_S = 60


@dataclass(frozen=True)
class Server:
    url: str
    pki: Pki
    home: Path
    log: Path

    def settings(self, stem: str | None = "operator") -> dict[str, str]:
        """The CLI's environment: the server's URL and CA, and ``stem``'s certificate."""
        settings = {"LLMGW_ADMIN_URL": self.url, "LLMGW_ADMIN_CA": str(self.pki.ca)}
        if stem is not None:
            certificate, key = self.pki.pair(stem)
            settings |= {"LLMGW_ADMIN_CERT": str(certificate), "LLMGW_ADMIN_KEY": str(key)}
        return settings

    async def cli(self, *args: str, environment: dict[str, str]) -> Result:
        return await run_cli(*args, home=self.home, settings=environment)

    def client(self, stem: str | None = "operator") -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, verify=self.pki.client_context(stem))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def module_database(
    postgres_server: PostgresServer, migrated_template: str
) -> AsyncIterator[str]:
    """One database for the module's one server; the tests use ids of their own."""
    name = unique_database_name("llmgw_serve_tls")
    await postgres_server.create_database(name, template=migrated_template)
    yield postgres_server.url(name)
    await postgres_server.drop_database(name)


@pytest_asyncio.fixture(loop_scope="session")
async def store(module_database: str) -> AsyncIterator[PostgresEventStore]:
    engine = create_engine(module_database, pool_size=1)
    yield PostgresEventStore(engine)
    await engine.dispose()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(
    module_database: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Server]:
    suffix = secrets.token_hex(3)
    pki = write_pki(tmp_path_factory.mktemp("pki"), f"alice-{suffix}", f"gpu-{suffix}")
    log = tmp_path_factory.mktemp("serve") / "server.log"
    async with serving_process(
        module_database, pki, log, token_name="ci", token=TOKEN, admin_tls=True
    ) as url:
        yield Server(url, pki, tmp_path_factory.mktemp("home"), log)


async def test_the_cli_with_an_operator_certificate_reads_the_drain_in_its_name(
    server: Server, store: PostgresEventStore
) -> None:
    node_id = f"gpu-{secrets.token_hex(3)}"
    await seed_node(store, node_id)
    async with server.client("operator") as operator:
        drained = await operator.post(f"/admin/v1/nodes/{node_id}/drain", json={})
    assert drained.status_code == 202, drained.text

    shown = await server.cli("history", "node", node_id, environment=server.settings("operator"))

    assert shown.code == 0, shown.stderr
    requested = [line for line in shown.stdout.splitlines() if "node_drain_requested" in line]
    assert len(requested) == 1
    assert server.pki.operator in requested[0]


async def test_without_credentials_the_cli_is_told_both_ways_in(server: Server) -> None:
    refused = await server.cli("history", "node", "gpu-1", environment=server.settings(None))

    assert refused.code == 1
    assert "authentication required: set LLMGW_ADMIN_TOKEN" in refused.stderr
    assert "set LLMGW_ADMIN_CERT and LLMGW_ADMIN_KEY" in refused.stderr


async def test_a_refused_certificate_is_told_apart_from_an_unreachable_server(
    server: Server,
) -> None:
    refused = await server.cli("history", "node", "gpu-1", environment=server.settings("stranger"))
    elsewhere = server.settings("operator") | {"LLMGW_ADMIN_URL": f"https://{LOOPBACK}:1"}
    unreachable = await server.cli("history", "node", "gpu-1", environment=elsewhere)

    assert refused.code == 1
    assert f"TLS with the admin API at {server.url} failed" in refused.stderr
    assert "refused the client certificate" in refused.stderr
    assert unreachable.code == 1
    assert (
        f"cannot reach the admin API at https://{LOOPBACK}:1: connection refused"
        in unreachable.stderr
    )


async def test_a_websocket_handshake_is_answered_as_plain_http(server: Server) -> None:
    # The admin API serves no WebSocket: the handshake reached the app, whose refusal was a
    # 403 from the WebSocket layer instead of the route's own answer.
    host, port = server.url.removeprefix("https://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(
        host, int(port), ssl=server.pki.client_context(None)
    )
    try:
        writer.write(
            b"GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n" % host.encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PROCESS_TIMEOUT_S)
    finally:
        writer.close()

    status_line, *fields = head.decode().split("\r\n")
    assert status_line == "HTTP/1.1 200 OK"
    assert not any(field.lower().startswith("upgrade:") for field in fields)
    # Nor a warning per handshake, telling the operator to install a WebSocket library.
    assert "upgrade request" not in server.log.read_text()
    assert "WebSocket library" not in server.log.read_text()


async def test_metrics_show_the_leader_and_its_agents(server: Server) -> None:
    async def scrape() -> dict[str, float]:
        async with server.client(None) as scraper:
            page = await scraper.get("/metrics")
        assert page.status_code == 200, page.text
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(page.text)
            for sample in family.samples
            if not sample.labels
        }

    async def leading() -> bool:
        return (await scrape())["llmgw_leader"] == 1

    async def reconciled() -> bool:
        return (await scrape())["llmgw_reconcile_passes_total"] > 0

    await wait_until(leading, within_s=30, every_s=0.2, what="the server leading")
    assert (await scrape())["llmgw_agents_connected"] == 0
    await wait_until(reconciled, within_s=30, every_s=0.2, what="a reconcile pass counted")


def test_an_admin_certificate_without_its_key_is_refused_at_start(tmp_path: Path) -> None:
    pki = write_pki(tmp_path, "alice", "gpu-1")
    certificate, key = pki.pair("server")
    started = subprocess.run(
        [
            installed("llmgw-server"),
            "serve",
            "--database-url",
            "postgresql://nobody@127.0.0.1:1/none",
            "--admin-tls-cert",
            str(certificate),
            "--tls-cert",
            str(certificate),
            "--tls-key",
            str(key),
            "--tls-ca",
            str(pki.ca),
        ],
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=PROCESS_TIMEOUT_S,
        check=False,
    )

    assert started.returncode == 2
    assert "--admin-tls-cert and --admin-tls-key go together" in started.stderr
