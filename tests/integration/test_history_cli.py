"""`llmgw-cli history` as an operator runs it: the installed console script, talking to a
real `llmgw-server serve` (a subprocess on a free port) over the seeded history
(tests/support/seed.py), with real sockets and real TLS."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.domain.envelope import Meta
from app.domain.events import NodeCordoned, node_stream
from app.pki.tls import server_ssl_context
from app.store.database import create_engine
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import LOOPBACK, Pki, write_pki
from tests.support.operator_cli import CLI_TIMEOUT_S, Result, run_cli
from tests.support.ports import free_port
from tests.support.postgres import PostgresServer
from tests.support.seed import (
    TIMED_OUT_LOG_TAIL,
    SeededDatabase,
    seeded_database,
)
from tests.support.serve_process import serving_process

TOKEN = secrets.token_hex(16)
NEWEST = 2**63 - 1
"""The largest log position: history read back before it starts at the newest event."""


@dataclass(frozen=True)
class AdminApi:
    url: str
    database: SeededDatabase

    @property
    def environment(self) -> dict[str, str]:
        return {"LLMGW_ADMIN_URL": self.url, "LLMGW_ADMIN_TOKEN": TOKEN}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def seeded(
    postgres_server: PostgresServer, migrated_template: str
) -> AsyncIterator[SeededDatabase]:
    async with seeded_database(postgres_server, migrated_template) as database:
        yield database


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The llmgw CA with a server certificate for the loopback address and an operator
    certificate for alice, and a stranger CA that issued neither."""
    return write_pki(tmp_path_factory.mktemp("pki"), "alice", "gpu-1")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def admin_api(
    seeded: SeededDatabase, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[AdminApi]:
    """``llmgw-server serve`` over the seeded history; its agent hub listens on another
    free loopback port, and no agent connects in these tests."""
    log = tmp_path_factory.mktemp("llmgw-server") / "server.log"
    async with serving_process(
        seeded.url, pki, log, token_name="alice", token=TOKEN, admin_tls=False
    ) as url:
        yield AdminApi(url=url, database=seeded)


@dataclass(frozen=True)
class Operator:
    """Runs ``llmgw-cli history ...`` from a scratch home, with only the settings given."""

    home: Path

    async def history(self, *args: str, environment: dict[str, str] | None = None) -> Result:
        return await run_cli("history", *args, home=self.home, settings=environment or {})


@pytest.fixture
def operator(tmp_path: Path) -> Operator:
    return Operator(home=tmp_path)


def table_rows(stdout: str) -> list[list[str]]:
    """The body rows of a history table, as cells (continuation lines of wrapped cells
    are left out: their first cell is empty)."""
    rows = []
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0].isdigit():
            rows.append(cells)
    return rows


async def stored_replica_events(database_url: str, replica_id: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(database_url)
    try:
        rows: list[asyncpg.Record] = await connection.fetch(
            "SELECT position, recorded_at, type, actor, correlation_id, data::text AS data "
            "FROM events WHERE replica_id = $1 ORDER BY position",
            replica_id,
        )
    finally:
        await connection.close()
    return rows


# -- the stories -------------------------------------------------------------------------


async def test_a_drained_replicas_history_leads_to_the_operator_who_drained_its_node(
    admin_api: AdminApi, operator: Operator
) -> None:
    story = admin_api.database.story

    result = await operator.history(
        "replica", story.drained_replica, environment=admin_api.environment
    )

    assert result.code == 0, result.stderr
    assert f"replica {story.drained_replica}: 9 events" in result.stdout
    drain = story.drain_id
    rows = table_rows(result.stdout)
    assert [
        (time, event, actor, correlation) for _, time, event, actor, _, correlation in rows
    ] == [
        ("2026-02-23 09:06:00", "replica_placed", "reconciler", ""),
        ("2026-02-23 09:06:02", "shard_starting", "agent:gpu-08", ""),
        ("2026-02-23 09:07:40", "shard_ready", "agent:gpu-08", ""),
        ("2026-02-23 09:07:41", "replica_serving", "reconciler", ""),
        ("2026-03-05 16:00:01", "replica_drain_started", "reconciler", drain),
        ("2026-03-05 16:01:31", "replacement_serving", "reconciler", drain),
        ("2026-03-05 16:01:31", "replica_stopping", "reconciler", drain),
        ("2026-03-05 16:01:45", "shard_stopped", "agent:gpu-08", ""),
        ("2026-03-05 16:01:45", "replica_stopped", "reconciler", drain),
    ]
    summaries = [row[4] for row in rows]
    replica = f"replica {story.drained_replica}"
    assert summaries[4] == f"{replica} draining (drain {drain}): node gpu-08 drains"
    assert summaries[5] == f"{replica} replacement {story.replacement} is serving"

    # The drain id leads to the request, in the node's history, in the operator's name.
    node = await operator.history("node", story.drained_node, environment=admin_api.environment)
    assert node.code == 0, node.stderr
    requested = [r for r in table_rows(node.stdout) if r[2] == "node_drain_requested"]
    assert [(r[3], r[5]) for r in requested] == [(story.operator, drain)]


async def test_json_output_is_every_event_as_the_api_returns_it(
    admin_api: AdminApi, operator: Operator
) -> None:
    story = admin_api.database.story

    result = await operator.history(
        "replica", story.timed_out_replica, "--output", "json", environment=admin_api.environment
    )

    assert result.code == 0, result.stderr
    printed = json.loads(result.stdout)
    stored = await stored_replica_events(admin_api.database.url, story.timed_out_replica)
    assert [as_printed(event) for event in printed] == [as_stored(row) for row in stored]
    failed = next(e for e in printed if e["type"] == "shard_failed")
    assert failed["data"]["log_tail"] == list(TIMED_OUT_LOG_TAIL)


def as_printed(event: dict[str, Any]) -> tuple[object, ...]:
    recorded_at = datetime.fromisoformat(event["recorded_at"])
    position, kind, actor, correlation = (
        event["position"],
        event["type"],
        event["actor"],
        event["correlation_id"],
    )
    return (position, recorded_at, kind, actor, correlation, event["data"])


def as_stored(row: asyncpg.Record) -> tuple[object, ...]:
    data = {key: value for key, value in json.loads(row["data"]).items() if key != "type"}
    position, recorded_at, kind, actor = (
        row["position"],
        row["recorded_at"],
        row["type"],
        row["actor"],
    )
    return (position, recorded_at, kind, actor, row["correlation_id"], data)


async def test_a_long_history_is_read_page_by_page(admin_api: AdminApi, operator: Operator) -> None:
    node = f"gpu-flapping-{secrets.token_hex(3)}"
    engine = create_engine(admin_api.database.url, pool_size=1)
    try:
        store = PostgresEventStore(engine, clock=lambda: datetime(2026, 3, 11, tzinfo=UTC))
        events = [NewEvent(NodeCordoned(node_id=node, reason=f"flap {n}")) for n in range(1201)]
        recorded = await store.append(node_stream(node), None, events, Meta(actor="bob"))
    finally:
        await engine.dispose()
    positions = [r.position for r in recorded]

    everything = await operator.history(
        "node", node, "--output", "json", environment=admin_api.environment
    )
    newest = await operator.history(
        "node", node, "--output", "json", "--limit", "700", environment=admin_api.environment
    )
    newest_after = await operator.history(
        "node",
        node,
        "--output",
        "json",
        "--after",
        str(positions[1197]),
        "--limit",
        "5",
        environment=admin_api.environment,
    )

    assert everything.code == 0, everything.stderr
    assert [e["position"] for e in json.loads(everything.stdout)] == positions
    assert newest.code == 0, newest.stderr  # read back over two pages, printed oldest first
    assert [e["position"] for e in json.loads(newest.stdout)] == positions[-700:]
    assert newest_after.code == 0, newest_after.stderr  # only 3 are after --after
    assert [e["position"] for e in json.loads(newest_after.stdout)] == positions[1198:]

    async with httpx.AsyncClient(
        base_url=admin_api.url, headers={"authorization": f"Bearer {TOKEN}"}
    ) as client:
        pages: list[list[int]] = []
        before: int | None = NEWEST
        while before is not None:
            answer = await client.get(
                f"/admin/v1/history/node/{node}", params={"before": before, "limit": 500}
            )
            assert answer.status_code == 200, answer.text
            page = answer.json()
            assert page["next_after"] is None
            pages.append([e["position"] for e in page["events"]])
            before = page["next_before"]
    assert pages == [positions[-500:], positions[-1000:-500], positions[:-1000]]


async def test_an_id_without_events_says_so_and_fails(
    admin_api: AdminApi, operator: Operator
) -> None:
    result = await operator.history("replica", "llama-3-8b-99", environment=admin_api.environment)

    assert result.code == 1
    assert "no events for replica llama-3-8b-99" in result.stderr
    assert result.stdout == ""


async def test_a_certificate_revoked_by_its_serial_has_a_history_naming_who_and_why(
    admin_api: AdminApi, operator: Operator
) -> None:
    serial = secrets.token_hex(8).lstrip("0")
    async with httpx.AsyncClient(base_url=admin_api.url) as client:
        revoked = await client.post(
            "/admin/v1/certificates/revocations",
            json={"serial": serial, "reason": "laptop stolen"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    assert revoked.status_code in (200, 201), revoked.text
    environment = admin_api.environment

    shown = await operator.history("certificate", f"0x{serial.upper()}", environment=environment)
    not_one = await operator.history("certificate", "not-a-serial", environment=environment)

    assert shown.code == 0, shown.stderr
    rows = table_rows(shown.stdout)
    assert [(row[2], row[3], row[4]) for row in rows] == [
        ("certificate_revoked", "alice", f"certificate {serial} revoked: laptop stolen")
    ]
    assert not_one.code == 1
    assert "'not-a-serial' is not a serial" in not_one.stderr
    async with httpx.AsyncClient(base_url=admin_api.url) as client:
        refused = await client.get(
            "/admin/v1/history/certificate/not-a-serial",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    assert refused.status_code == 400, refused.text


async def test_without_a_token_the_operator_is_told_to_set_one(
    admin_api: AdminApi, operator: Operator
) -> None:
    result = await operator.history(
        "replica", "llama-3-8b-2", environment={"LLMGW_ADMIN_URL": admin_api.url}
    )

    assert result.code == 1
    assert "authentication required: set LLMGW_ADMIN_TOKEN" in result.stderr
    assert result.stdout == ""


async def test_a_token_the_server_does_not_know_is_refused(
    admin_api: AdminApi, operator: Operator
) -> None:
    environment = admin_api.environment | {"LLMGW_ADMIN_TOKEN": secrets.token_hex(16)}

    result = await operator.history("replica", "llama-3-8b-2", environment=environment)

    assert result.code == 1
    assert "the admin API refused the token given; set LLMGW_ADMIN_TOKEN" in result.stderr


async def test_with_the_server_down_the_operator_is_told_where_it_was_looked_for(
    operator: Operator,
) -> None:
    nobody = f"http://{LOOPBACK}:{free_port()}"

    result = await operator.history(
        "replica",
        "llama-3-8b-2",
        environment={"LLMGW_ADMIN_URL": nobody, "LLMGW_ADMIN_TOKEN": TOKEN},
    )

    assert result.code == 1
    assert (
        f"llmgw-cli history replica: cannot reach the admin API at {nobody}: connection "
        "refused — is llmgw-server running there? For another address, give --admin-url or "
        "set LLMGW_ADMIN_URL\n"
    ) == result.stderr


async def test_flags_beat_the_environment_which_beats_the_config_file(
    admin_api: AdminApi, operator: Operator
) -> None:
    config = operator.home / ".config" / "llmgw" / "cli.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'admin_url = "{admin_api.url}"\ntoken = "{TOKEN}"\n')
    stale_token = {"LLMGW_ADMIN_TOKEN": secrets.token_hex(16)}

    from_the_file = await operator.history("model", "qwen-2-7b")
    environment_first = await operator.history("model", "qwen-2-7b", environment=stale_token)
    flag_first = await operator.history(
        "model", "qwen-2-7b", "--token", TOKEN, environment=stale_token
    )

    assert from_the_file.code == 0, from_the_file.stderr
    assert environment_first.code == 1
    assert "refused the token" in environment_first.stderr
    assert flag_first.code == 0, flag_first.stderr
    assert flag_first.stdout == from_the_file.stdout


async def test_bad_usage_exits_with_2(operator: Operator) -> None:
    missing_config = str(operator.home / "nowhere.toml")

    zero_limit = await operator.history("replica", "llama-3-8b-2", "--limit", "0")
    no_config = await operator.history(
        "replica", "llama-3-8b-2", environment={"LLMGW_CONFIG": missing_config}
    )

    assert zero_limit.code == 2
    assert no_config.code == 2
    assert f"config file {missing_config} (from $LLMGW_CONFIG) does not exist" in no_config.stderr


async def test_every_history_command_has_help_with_an_example(operator: Operator) -> None:
    subjects = ("replica", "node", "model", "key", "certificate")

    helps = await asyncio.gather(*(operator.history(s, "--help") for s in subjects))

    for subject, shown in zip(subjects, helps, strict=True):
        assert shown.code == 0, shown.stderr
        example = rf"^\s+llmgw-cli history {subject} [\w-]+"
        assert re.search(example, shown.stdout, re.MULTILINE), shown.stdout


def test_the_cli_knows_the_api_and_nothing_behind_it() -> None:
    imported = subprocess.run(
        [sys.executable, "-c", "import sys, cli.main; print(*sorted(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=CLI_TIMEOUT_S,
    ).stdout.split()

    behind_the_api = [m for m in imported if m.startswith(("app.domain", "app.store"))]
    assert behind_the_api == []


# -- over TLS ----------------------------------------------------------------------------


@contextmanager
def https_front(pki: Pki, backend_port: int) -> Iterator[str]:
    """TLS in front of the admin API, requiring an operator certificate from the CA: the
    way an operator reaches the control plane from outside its host. Blocking sockets in
    threads, because they send the TLS alert that tells a client why it was refused."""
    context = server_ssl_context(*pki.pair("server"), pki.ca)
    stop = threading.Event()
    listener = socket.create_server((LOOPBACK, 0))
    listener.settimeout(0.05)

    def accept() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=relay, args=(raw,), daemon=True).start()

    def relay(raw: socket.socket) -> None:
        raw.settimeout(CLI_TIMEOUT_S)
        try:
            client = context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()
            return
        with client, socket.create_connection((LOOPBACK, backend_port)) as backend:
            answer = threading.Thread(target=pipe, args=(backend, client), daemon=True)
            answer.start()
            pipe(client, backend)
            answer.join(CLI_TIMEOUT_S)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"https://{LOOPBACK}:{listener.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join()
        listener.close()


def pipe(source: socket.socket, destination: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            destination.sendall(data)
        destination.shutdown(socket.SHUT_WR)
    except OSError:
        pass


async def test_over_https_the_operator_certificate_gets_the_operator_in(
    admin_api: AdminApi, operator: Operator, pki: Pki
) -> None:
    backend_port = int(admin_api.url.rsplit(":", 1)[1])
    with https_front(pki, backend_port) as url:
        result = await operator.history(
            "key",
            admin_api.database.story.revoked_key,
            environment={
                "LLMGW_ADMIN_URL": url,
                "LLMGW_ADMIN_TOKEN": TOKEN,
                "LLMGW_CA_CERT": str(pki.ca),
                "LLMGW_CLIENT_CERT": str(pki.pair("operator")[0]),
                "LLMGW_CLIENT_KEY": str(pki.pair("operator")[1]),
            },
        )

    assert result.code == 0, result.stderr
    assert [row[2] for row in table_rows(result.stdout)] == ["api_key_created", "api_key_revoked"]


async def test_without_an_operator_certificate_the_operator_is_told_to_configure_one(
    admin_api: AdminApi, operator: Operator, pki: Pki
) -> None:
    backend_port = int(admin_api.url.rsplit(":", 1)[1])
    with https_front(pki, backend_port) as url:
        result = await operator.history(
            "key",
            admin_api.database.story.revoked_key,
            environment={
                "LLMGW_ADMIN_URL": url,
                "LLMGW_ADMIN_TOKEN": TOKEN,
                "LLMGW_CA_CERT": str(pki.ca),
            },
        )

    assert result.code == 1
    assert f"TLS handshake with the admin API at {url} failed" in result.stderr
    assert "requires a client certificate and none was sent" in result.stderr


async def test_a_server_certificate_from_another_ca_is_explained(
    admin_api: AdminApi, operator: Operator, pki: Pki
) -> None:
    backend_port = int(admin_api.url.rsplit(":", 1)[1])
    with https_front(pki, backend_port) as url:
        result = await operator.history(
            "key",
            "k-ci-7f3a",
            environment={
                "LLMGW_ADMIN_URL": url,
                "LLMGW_ADMIN_TOKEN": TOKEN,
                "LLMGW_CA_CERT": str(pki.stranger_ca),
                "LLMGW_CLIENT_CERT": str(pki.pair("operator")[0]),
                "LLMGW_CLIENT_KEY": str(pki.pair("operator")[1]),
            },
        )

    assert result.code == 1
    assert f"TLS handshake with the admin API at {url} failed" in result.stderr
    assert "was not issued by the CA this side trusts" in result.stderr
