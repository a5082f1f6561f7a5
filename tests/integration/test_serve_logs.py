"""``llmgw-server serve``'s log as an operator reads server.log: one format from its start
to its stop, its own lines and uvicorn's alike, and the traffic of an idle minute (health
checks, scrapes, a dashboard polling the admin API, clients the gateway refuses) writes no
request line at info. A real process, its output in a file, as systemd or ``dev`` keeps it.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.admin_server import LOOPBACK, write_pki
from tests.support.ports import free_port
from tests.support.serve_process import serving_process

pytestmark = pytest.mark.timeout(120)

TOKEN = secrets.token_hex(16)
POLLS = 12
"""An idle minute polled every 5 s."""
ADMIN_POLLED = ("/admin/v1/nodes", "/admin/v1/replicas", "/admin/v1/models")
QUIET = ("/healthz", "/readyz", "/metrics")
REQUEST_LINES = frozenset({"admin_request", "gateway_request"})


async def idle_minute(admin_url: str, gateway_url: str) -> None:
    """What reaches a server in a minute in which nothing changes, sent at once."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as admin:
        for _ in range(POLLS):
            for path in (*QUIET, *ADMIN_POLLED):
                assert (await admin.get(f"{admin_url}{path}")).status_code == 200, path
    async with httpx.AsyncClient() as client:
        for _ in range(POLLS):
            assert (await client.get(f"{gateway_url}/healthz")).status_code == 200
        for _ in range(3):  # a client with a key that is not one
            answer = await client.post(
                f"{gateway_url}/v1/chat/completions",
                headers={"Authorization": "Bearer llmgw-nope-nope"},
                json={"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert answer.status_code == 401


async def served_log(database_url: str, tmp_path: Path, *flags: str) -> list[dict[str, Any]]:
    """The lines of a server's log, from its start to its stop, after an idle minute; each
    line must be one JSON object."""
    pki = write_pki(tmp_path / "pki", "alice", "gpu-1")
    log = tmp_path / "server.log"
    client_port = free_port()
    async with serving_process(
        database_url,
        pki,
        log,
        token_name="ci",
        token=TOKEN,
        admin_tls=False,
        gateway_port=client_port,
        flags=flags,
    ) as admin_url:
        await idle_minute(admin_url, f"http://{LOOPBACK}:{client_port}")
    lines = log.read_text(errors="replace").splitlines()
    entries = []
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except ValueError:
            raise AssertionError(f"line {number} of {log} is not JSON: {line!r}") from None
        assert isinstance(entry, dict), line
        entries.append(entry)
    return entries


async def test_a_served_log_is_json_from_start_to_stop_and_an_idle_minute_adds_no_info(
    database_url: str, tmp_path: Path
) -> None:
    entries = await served_log(database_url, tmp_path)

    assert entries, "the server logged nothing"
    assert all(list(e)[:4] == ["timestamp", "level", "event", "logger"] for e in entries)
    loggers = {e["logger"] for e in entries}
    assert "uvicorn.error" in loggers  # uvicorn's start and stop, in the same format
    assert {"gateway_listening", "leader_elected", "agent_hub_listening"} <= {
        e["event"] for e in entries
    }
    assert [e for e in entries if e["event"] in REQUEST_LINES] == []
    assert {e["level"] for e in entries} <= {"info", "warning"}


async def test_at_debug_the_same_minute_is_one_line_per_request_with_its_id(
    database_url: str, tmp_path: Path
) -> None:
    entries = await served_log(database_url, tmp_path, "--log-level", "debug")

    requests = [e for e in entries if e["event"] in REQUEST_LINES]
    admin = [e for e in requests if e["event"] == "admin_request"]
    assert sorted({e["path"] for e in admin}) == sorted(ADMIN_POLLED)  # health checks aside
    assert len(admin) == POLLS * len(ADMIN_POLLED)
    assert all(e["level"] == "debug" and e["request_id"].startswith("req-") for e in admin)
    assert all(e["actor"] == "ci" and e["status"] == 200 for e in admin)
    gateway = [e for e in requests if e["event"] == "gateway_request"]
    assert [(e["level"], e["status"]) for e in gateway] == [("debug", 401)] * 3
    assert all(e["request_id"] for e in gateway)
