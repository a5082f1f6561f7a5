"""Operators identified by their certificates: the admin API over HTTPS with the llmgw CA,
real TLS handshakes on a loopback socket, against a fresh PostgreSQL database per test."""

from __future__ import annotations

import asyncio
import secrets
import socket
import ssl
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import pytest_asyncio

from app.admin.tls import tls_extension
from app.pki.builders import issue_operator
from app.pki.files import load_ca, write_issued
from app.pki.keys import generate_key
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import (
    Pki,
    last_position,
    seed_node,
    serving_admin,
    write_pki,
)
from tests.support.waiting import wait_until

TOKEN = secrets.token_hex(16)
AUTOMATION = "ci"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    suffix = secrets.token_hex(3)
    return write_pki(tmp_path_factory.mktemp("pki"), f"alice-{suffix}", f"gpu-{suffix}")


@pytest_asyncio.fixture(loop_scope="session")
async def https_url(pg_store: PostgresEventStore, pki: Pki) -> AsyncIterator[str]:
    async with serving_admin(pg_store, tokens={TOKEN: AUTOMATION}, tls=pki.server_context()) as url:
        yield url


def client(url: str, pki: Pki, stem: str | None, token: str | None = None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=url, verify=pki.client_context(stem), headers=headers)


async def node_history_actors(url: str, pki: Pki, node_id: str) -> list[tuple[str, str]]:
    async with client(url, pki, "operator") as operator:
        answer = await operator.get(f"/admin/v1/history/node/{node_id}")
    assert answer.status_code == 200, answer.text
    return [(e["type"], e["actor"]) for e in answer.json()["events"]]


async def test_a_drain_made_with_an_operator_certificate_is_recorded_in_its_name(
    https_url: str, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node_id)

    async with client(https_url, pki, "operator") as operator:
        answer = await operator.post(f"/admin/v1/nodes/{node_id}/drain", json={"grace_s": 60})

    assert answer.status_code == 202, answer.text
    assert await node_history_actors(https_url, pki, node_id) == [
        ("node_registered", f"agent:{node_id}"),
        ("node_connected", f"agent:{node_id}"),
        ("node_drain_requested", pki.operator),
    ]


async def test_the_certificate_names_the_actor_even_beside_a_token(
    https_url: str, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node_id)

    async with client(https_url, pki, "operator", token=TOKEN) as operator:
        answer = await operator.post(f"/admin/v1/nodes/{node_id}/cordon", json={"reason": "x"})

    assert answer.status_code == 200, answer.text
    assert (await node_history_actors(https_url, pki, node_id))[-1] == (
        "node_cordoned",
        pki.operator,
    )


async def test_over_https_a_token_alone_still_works_and_names_its_owner(
    https_url: str, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node_id)

    async with client(https_url, pki, None, token=TOKEN) as automation:
        answer = await automation.post(f"/admin/v1/nodes/{node_id}/cordon", json={})

    assert answer.status_code == 200, answer.text
    assert (await node_history_actors(https_url, pki, node_id))[-1] == (
        "node_cordoned",
        AUTOMATION,
    )


async def test_a_request_without_credentials_is_refused_and_writes_nothing(
    https_url: str, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node_id)
    before = await last_position(pg_store)

    async with client(https_url, pki, None) as anonymous:
        drain = await anonymous.post(f"/admin/v1/nodes/{node_id}/drain", json={})
        listing = await anonymous.get("/admin/v1/nodes")
        wrong_token = await anonymous.get(
            "/admin/v1/nodes", headers={"authorization": f"Bearer {secrets.token_hex(16)}"}
        )

    assert (drain.status_code, listing.status_code, wrong_token.status_code) == (401, 401, 401)
    assert "operator certificate" in drain.json()["detail"]
    assert await last_position(pg_store) == before


async def test_a_node_certificate_does_not_pass_for_an_operator(
    https_url: str, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node_id)
    before = await last_position(pg_store)

    async with client(https_url, pki, "node", token=TOKEN) as agent:
        drain = await agent.post(f"/admin/v1/nodes/{node_id}/drain", json={})
        listing = await agent.get("/admin/v1/nodes")

    assert (drain.status_code, listing.status_code) == (403, 403)
    assert "is a node certificate" in drain.json()["detail"]
    assert await last_position(pg_store) == before


async def test_a_certificate_from_another_ca_gets_no_answer(https_url: str, pki: Pki) -> None:
    async with client(https_url, pki, "stranger") as stranger:
        # The handshake fails on the server; asyncio drops the connection without sending
        # the TLS alert, so the client sees it cut off (llmgw-cli explains that case).
        with pytest.raises(httpx.TransportError):
            await stranger.get("/admin/v1/nodes")


async def test_probes_and_scrapers_need_no_credentials(https_url: str, pki: Pki) -> None:
    async with client(https_url, pki, None) as probe:
        answers = [await probe.get(path) for path in ("/healthz", "/readyz", "/metrics")]

    assert [a.status_code for a in answers] == [200, 200, 200]


def test_the_tls_extension_carries_the_verified_client_certificate(pki: Pki) -> None:
    """One real handshake over a socket pair, read the way the admin protocol reads it."""
    server_side, client_side = socket.socketpair()
    client_context = pki.client_context("operator")
    client_context.check_hostname = False
    accepted: list[ssl.SSLSocket] = []

    def accept() -> None:
        accepted.append(pki.server_context().wrap_socket(server_side, server_side=True))

    with server_side, client_side:
        handshake = threading.Thread(target=accept)
        handshake.start()
        with client_context.wrap_socket(client_side):
            handshake.join(10)
            [tls] = accepted
            with tls:
                extension = tls_extension(tls)

    name = str(extension["client_cert_name"])
    assert f"CN={pki.operator}" in name
    assert "OU=operator" in name
    chain = extension["client_cert_chain"]
    assert isinstance(chain, list)
    assert len(chain) == 1
    assert chain[0].startswith("-----BEGIN CERTIFICATE-----")
    assert extension["client_cert_error"] is None
    assert extension["tls_version"] in (0x0303, 0x0304)


async def test_a_kept_alive_connection_is_refused_once_its_certificate_expires(
    https_url: str, pki: Pki
) -> None:
    """The handshake checks the operator certificate's dates once, and a kept-alive
    connection carries request after request. Before, one opened just before the
    certificate's end went on acting as its operator for as long as it was kept busy:
    the only end an operator certificate has (it cannot be revoked) did not end it."""
    ca = load_ca(pki.directory)
    key = generate_key()
    # Issued a day ago for a day: it ends a few seconds from now (whole seconds).
    issued = datetime.now(UTC) - timedelta(days=1) + timedelta(seconds=3)
    certificate = issue_operator(ca, key, pki.operator, issued, 1)
    write_issued(pki.directory, "expiring", certificate, key, force=True)

    async with client(https_url, pki, "expiring") as operator:
        assert (await operator.get("/admin/v1/nodes")).status_code == 200

        async def refused() -> bool:
            # Only the open connection can answer: a new handshake with the expired
            # certificate fails (a TransportError, not an answer).
            return (await operator.get("/admin/v1/nodes")).status_code == 403

        await wait_until(refused, within_s=15, what="a request after the certificate's end")
        answer = await operator.get("/admin/v1/nodes")
    assert "expired" in answer.json()["detail"]


async def test_an_event_stream_ends_when_its_operator_certificate_does(
    https_url: str, pki: Pki
) -> None:
    """A followed stream is one request kept open: before, one opened with an operator
    certificate went on past the certificate's end, forever. It now ends then, its last
    message saying why."""
    ca = load_ca(pki.directory)
    key = generate_key()
    issued = datetime.now(UTC) - timedelta(days=1) + timedelta(seconds=2)
    certificate = issue_operator(ca, key, pki.operator, issued, 1)
    write_issued(pki.directory, "streaming", certificate, key, force=True)

    lines: list[str] = []
    async with (
        client(https_url, pki, "streaming") as operator,
        operator.stream("GET", "/admin/v1/events", headers={"accept": "text/event-stream"}) as sse,
    ):
        assert sse.status_code == 200
        # Without an end, the stream would send a keepalive every 15 s, forever.
        async with asyncio.timeout(15):
            async for line in sse.aiter_lines():
                lines.append(line)
    messages = [line for line in lines if line and not line.startswith(":")]
    assert messages[-2:] == [
        "event: refused",
        f"data: the operator certificate of {pki.operator!r} expired on "
        f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC; issue one with "
        "`llmgw-cli cert operator <name>`",
    ], lines
