"""An operator's change whose answer the network lost: ``llmgw-cli`` (a real process) talks
to the admin API (over a real PostgreSQL store) through a relay that carries the request and
drops the connection as the answer starts. The change was done; the CLI sends it once more
with the same Idempotency-Key, which the admin API carries out once: answered, the operator
sees the change's result; lost again, the CLI says it may have been carried out (not that
the URL's scheme may be wrong), with how to find out; sending it again by hand does what
docs/admin-api.md says a repeat of it does. Over https too, where a connection closed
without an answer is also how a refused client certificate shows: the CLI tells the two
apart."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest_asyncio

from app.domain.events import ModelScaled, NodeDrainRequested, model_stream, node_stream
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import Pki, seed_node, serving_admin, write_pki
from tests.support.operator_cli import OPERATOR, TOKEN, Operator, live_admin_api
from tests.support.routing import declare_model
from tests.support.tcp_relay import TcpRelay

LLAMA = {"command": "vllm serve {model} --port {port}", "replicas": 1}


@dataclass(frozen=True)
class ThroughRelay:
    """The operator through the relay, and the admin API's URL behind it."""

    operator: Operator
    relay: TcpRelay
    direct: str


@pytest_asyncio.fixture(loop_scope="session")
async def through_relay(
    pg_store: PostgresEventStore, tmp_path: Path
) -> AsyncIterator[ThroughRelay]:
    async with live_admin_api(pg_store) as url:
        port = httpx.URL(url).port
        assert port is not None
        async with TcpRelay("127.0.0.1", port) as relay:
            operator = Operator(home=tmp_path, admin_url=f"http://127.0.0.1:{relay.port}")
            yield ThroughRelay(operator=operator, relay=relay, direct=url)


async def test_a_scale_whose_answer_was_lost_was_done_and_sending_it_again_changes_nothing(
    through_relay: ThroughRelay, pg_store: PostgresEventStore
) -> None:
    async with httpx.AsyncClient(
        base_url=through_relay.direct, headers={"authorization": f"Bearer {TOKEN}"}
    ) as admin:
        assert (await admin.put("/admin/v1/models/llama", json=LLAMA)).status_code == 200
    through_relay.relay.lose_answers()

    lost = await through_relay.operator.run("scale", "llama", "3")

    assert lost.code == 1
    assert "POST /admin/v1/models/llama/scale was sent and may have been carried out" in (
        lost.stderr
    ), lost.stderr
    assert "scheme" not in lost.stderr
    scales = [
        r
        for r in await pg_store.read_stream(model_stream("llama"))
        if isinstance(r.event, ModelScaled)
    ]
    assert [r.event.replicas for r in scales if isinstance(r.event, ModelScaled)] == [3]

    through_relay.relay.mend()
    again = await through_relay.operator.run("scale", "llama", "3", "--output", "json")

    assert again.json()["changed"] is False
    assert len(await pg_store.read_stream(model_stream("llama"))) == len(scales) + 1


async def test_a_drain_whose_answer_was_lost_is_not_started_twice(
    through_relay: ThroughRelay, pg_store: PostgresEventStore
) -> None:
    await seed_node(pg_store, "gpu-1")
    through_relay.relay.lose_answers()

    lost = await through_relay.operator.run("drain", "gpu-1")

    assert lost.code == 1
    assert "POST /admin/v1/nodes/gpu-1/drain was sent and may have been carried out" in (
        lost.stderr
    ), lost.stderr
    through_relay.relay.mend()
    again = await through_relay.operator.run("drain", "gpu-1")

    [requested] = [
        r.event
        for r in await pg_store.read_stream(node_stream("gpu-1"))
        if isinstance(r.event, NodeDrainRequested)
    ]
    assert again.code == 1
    assert f"node gpu-1 is already draining (drain {requested.drain_id}" in again.stderr


async def test_a_scale_whose_answer_was_lost_once_is_sent_again_and_ends_with_its_result(
    through_relay: ThroughRelay, pg_store: PostgresEventStore
) -> None:
    model = f"llama-{secrets.token_hex(3)}"
    await declare_model(pg_store, model, replicas=1)
    through_relay.relay.lose_next_answer()

    scaled = await through_relay.operator.run("scale", model, "3", "--output", "json")

    assert scaled.json()["changed"] is True
    scales = [
        r.event.replicas
        for r in await pg_store.read_stream(model_stream(model))
        if isinstance(r.event, ModelScaled)
    ]
    assert scales == [3]


async def test_a_drain_whose_answer_was_lost_once_answers_the_drain_it_started(
    through_relay: ThroughRelay, pg_store: PostgresEventStore
) -> None:
    node = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node)
    through_relay.relay.lose_next_answer()

    drained = await through_relay.operator.run("drain", node, "--output", "json")

    [requested] = [
        r.event
        for r in await pg_store.read_stream(node_stream(node))
        if isinstance(r.event, NodeDrainRequested)
    ]
    assert drained.json()["drain_id"] == requested.drain_id


@dataclass(frozen=True)
class OverTls:
    """The operator through the relay to the admin API over https, with ``pki``'s files."""

    operator: Operator
    relay: TcpRelay
    pki: Pki

    def presenting(self, stem: str) -> dict[str, str]:
        """The CLI's settings that trust the test CA and present ``stem``'s certificate."""
        certificate, key = self.pki.pair(stem)
        return {
            "LLMGW_ADMIN_CA": str(self.pki.ca),
            "LLMGW_ADMIN_CERT": str(certificate),
            "LLMGW_ADMIN_KEY": str(key),
        }


@pytest_asyncio.fixture(loop_scope="session")
async def over_tls(pg_store: PostgresEventStore, tmp_path: Path) -> AsyncIterator[OverTls]:
    pki = write_pki(tmp_path / "pki", OPERATOR, "gpu-1")
    tls = pki.server_context()
    tls.num_tickets = 0  # its next words after the handshake are its answer, for the relay
    async with serving_admin(pg_store, tokens={TOKEN: OPERATOR}, tls=tls) as url:
        port = httpx.URL(url).port
        assert port is not None
        async with TcpRelay("127.0.0.1", port) as relay:
            operator = Operator(home=tmp_path, admin_url=f"https://127.0.0.1:{relay.port}")
            yield OverTls(operator=operator, relay=relay, pki=pki)


async def test_over_https_a_lost_answer_is_told_apart_from_a_refused_certificate(
    over_tls: OverTls, pg_store: PostgresEventStore
) -> None:
    model = f"llama-{secrets.token_hex(3)}"
    await declare_model(pg_store, model, replicas=1)
    over_tls.relay.lose_one_tls_answer()

    lost = await over_tls.operator.run("scale", model, "3", **over_tls.presenting("operator"))
    refused = await over_tls.operator.run("scale", model, "5", **over_tls.presenting("stranger"))
    over_tls.relay.lose_one_tls_answer()
    unanswered = await over_tls.operator.run("model", model, **over_tls.presenting("operator"))

    # Told apart from a refused certificate, the lost answer is sent again and answered.
    assert lost.code == 0, lost.stderr
    assert f"model {model}: scaled to 3 replicas" in lost.stdout
    assert refused.code == 1
    assert "the server closed the connection without answering" in refused.stderr
    assert "refused the client certificate" in refused.stderr
    assert unanswered.code == 1
    assert "closed the connection before its answer came" in unanswered.stderr
    assert "the client certificate are accepted: try again" in unanswered.stderr
    scales = [
        r.event.replicas
        for r in await pg_store.read_stream(model_stream(model))
        if isinstance(r.event, ModelScaled)
    ]
    assert scales == [3]


async def test_a_key_creation_whose_answer_was_lost_revokes_that_key_and_creates_another(
    through_relay: ThroughRelay,
) -> None:
    name = f"ci-{secrets.token_hex(3)}"
    through_relay.relay.lose_next_answer()

    created = await through_relay.operator.run("keys", "create", "--name", name, "--models", "*")

    assert created.code == 0, created.stderr
    async with httpx.AsyncClient(
        base_url=through_relay.direct, headers={"authorization": f"Bearer {TOKEN}"}
    ) as admin:
        listed = (await admin.get("/admin/v1/keys", params={"limit": 500})).json()
    lost, shown = [key for key in listed if key["name"] == name]
    assert lost["revoked"] is True
    assert shown["revoked"] is False
    assert f"prefix {shown['prefix']}, id {shown['id']}" in created.stdout
    assert shown["prefix"] in created.stdout.split()[-1]
    assert (
        f"key {lost['id']} was created but its secret was lost with the answer: it was "
        "revoked, and this key created in its place"
    ) in " ".join(created.stderr.split()), created.stderr


async def test_a_scale_lost_twice_with_a_key_given_is_carried_out_once_when_run_again_with_it(
    through_relay: ThroughRelay, pg_store: PostgresEventStore
) -> None:
    model = f"llama-{secrets.token_hex(3)}"
    key = f"nightly-{secrets.token_hex(4)}"
    await declare_model(pg_store, model, replicas=1)
    await through_relay.operator.run("scale", model, "2")
    through_relay.relay.lose_answers()

    lost = await through_relay.operator.run("scale", model, "3", "--idempotency-key", key)
    through_relay.relay.mend()
    await through_relay.operator.run("scale", model, "2")
    again = await through_relay.operator.run(
        "scale", model, "3", "--idempotency-key", key, "--output", "json"
    )

    assert lost.code == 1
    assert f"Running the same command again with --idempotency-key {key} is safe" in lost.stderr, (
        lost.stderr
    )
    assert again.code == 0, again.stderr
    assert again.json()["changed"] is True
    scales = [
        r.event.replicas
        for r in await pg_store.read_stream(model_stream(model))
        if isinstance(r.event, ModelScaled)
    ]
    assert scales == [2, 3, 2]
