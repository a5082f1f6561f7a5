"""``llmgw-server serve --admin-tls-cert ...`` as an operator meets it: the real server
process on a free port, the installed ``llmgw-cli`` presenting an operator certificate
from its environment, real TLS on both sides."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from app.store.database import create_engine
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import LOOPBACK, Pki, seed_node, write_pki
from tests.support.postgres import PostgresServer, unique_database_name
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

TOKEN = secrets.token_hex(16)
PROCESS_TIMEOUT_S = 60


def installed(script: str) -> str:
    beside_python = Path(sys.executable).parent / script
    found = str(beside_python) if beside_python.exists() else shutil.which(script)
    assert found, f"{script} is not installed (pip install -e .)"
    return found


def free_port() -> int:
    with closing(socket.socket()) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def clean_environment(**settings: str) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return inherited | settings


@dataclass(frozen=True)
class Server:
    url: str
    pki: Pki
    home: Path

    def settings(self, stem: str | None = "operator") -> dict[str, str]:
        """The CLI's environment: the server's URL and CA, and ``stem``'s certificate."""
        settings = {"LLMGW_ADMIN_URL": self.url, "LLMGW_ADMIN_CA": str(self.pki.ca)}
        if stem is not None:
            certificate, key = self.pki.pair(stem)
            settings |= {"LLMGW_ADMIN_CERT": str(certificate), "LLMGW_ADMIN_KEY": str(key)}
        return settings

    async def cli(self, *args: str, environment: dict[str, str]) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            installed("llmgw-cli"),
            *args,
            cwd=self.home,
            env=clean_environment(HOME=str(self.home), COLUMNS="200", **environment),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), PROCESS_TIMEOUT_S)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        return process.returncode, stdout.decode(), stderr.decode()

    def client(self, stem: str | None = "operator") -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, verify=self.pki.client_context(stem))


@contextmanager
def running_server(database_url: str, port: int, pki: Pki, log: Path) -> Iterator[None]:
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                installed("llmgw-server"),
                "serve",
                "--database-url",
                database_url,
                "--admin-port",
                str(port),
                "--admin-tokens",
                f"ci:{TOKEN}",
                "--admin-tls-cert",
                str(pki.pair("server")[0]),
                "--admin-tls-key",
                str(pki.pair("server")[1]),
                "--agent-host",
                LOOPBACK,
                "--agent-port",
                str(free_port()),
                "--no-gateway",
                "--tls-cert",
                str(pki.pair("server")[0]),
                "--tls-key",
                str(pki.pair("server")[1]),
                "--tls-ca",
                str(pki.ca),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=clean_environment(),
        )
    try:
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    served = Server(f"https://{LOOPBACK}:{port}", pki, tmp_path_factory.mktemp("home"))
    with running_server(module_database, port, pki, log):

        async def answering() -> bool:
            try:
                async with served.client(None) as probe:
                    return (await probe.get("/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await wait_until(answering, within_s=30, every_s=0.1, what=f"llmgw-server; see {log}")
        yield served


async def test_the_cli_with_an_operator_certificate_reads_the_drain_in_its_name(
    server: Server, store: PostgresEventStore
) -> None:
    node_id = f"gpu-{secrets.token_hex(3)}"
    await seed_node(store, node_id)
    async with server.client("operator") as operator:
        drained = await operator.post(f"/admin/v1/nodes/{node_id}/drain", json={})
    assert drained.status_code == 202, drained.text

    code, stdout, stderr = await server.cli(
        "history", "node", node_id, environment=server.settings("operator")
    )

    assert code == 0, stderr
    requested = [line for line in stdout.splitlines() if "node_drain_requested" in line]
    assert len(requested) == 1
    assert server.pki.operator in requested[0]


async def test_without_credentials_the_cli_is_told_both_ways_in(server: Server) -> None:
    code, _, stderr = await server.cli(
        "history", "node", "gpu-1", environment=server.settings(None)
    )

    assert code == 1
    assert "authentication required: set LLMGW_ADMIN_TOKEN" in stderr
    assert "set LLMGW_ADMIN_CERT and LLMGW_ADMIN_KEY" in stderr


async def test_a_refused_certificate_is_told_apart_from_an_unreachable_server(
    server: Server,
) -> None:
    refused = await server.cli("history", "node", "gpu-1", environment=server.settings("stranger"))
    elsewhere = server.settings("operator") | {"LLMGW_ADMIN_URL": f"https://{LOOPBACK}:1"}
    unreachable = await server.cli("history", "node", "gpu-1", environment=elsewhere)

    code, _, stderr = refused
    assert code == 1
    assert f"TLS with the admin API at {server.url} failed" in stderr
    assert "refused the client certificate" in stderr
    code, _, stderr = unreachable
    assert code == 1
    assert f"cannot reach the admin API at https://{LOOPBACK}:1: connection refused" in stderr


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

    assert started.returncode == 1
    assert "--admin-tls-cert and --admin-tls-key go together" in started.stderr
