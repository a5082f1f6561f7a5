"""``llmgw-server serve --agent-handshakes-per-address``, as a process of its own: with the
cap at 2 and two connections from 127.0.0.1 holding their TLS handshakes open, more from
there are closed before any TLS, counted in ``llmgw_agent_handshakes_refused_total`` on the
admin listener's ``/metrics``, and logged once, not once per connection."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devcluster.ports import listens
from tests.integration.test_hub_handshakes import closed_at_once
from tests.support.admin_server import LOOPBACK, write_pki
from tests.support.ports import free_port
from tests.support.serve_process import serving_process
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

TOKEN = secrets.token_hex(16)
CAP = 2


async def refused_so_far(admin_url: str) -> float | None:
    async with httpx.AsyncClient() as client:
        page = await client.get(f"{admin_url}/metrics")
    for family in text_string_to_metric_families(page.text):
        for sample in family.samples:
            if sample.name == "llmgw_agent_handshakes_refused_total":
                return sample.value
    return None


async def test_serve_caps_an_address_s_handshakes_counts_and_logs_the_refused_once(
    database_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    agent_port = free_port()
    async with serving_process(
        database_url,
        write_pki(tmp_path / "pki", "alice", "gpu-1"),
        log,
        token_name="ci",
        token=TOKEN,
        admin_tls=False,
        agent_port=agent_port,
        flags=["--agent-handshakes-per-address", str(CAP)],
    ) as admin_url:
        await wait_until(lambda: listens(agent_port), within_s=30, what="the hub listening")
        assert await refused_so_far(admin_url) == 0
        silent = [await asyncio.open_connection(LOOPBACK, agent_port) for _ in range(CAP)]
        try:
            assert await closed_at_once(agent_port)
            assert await closed_at_once(agent_port)

            async def counted() -> bool:
                return await refused_so_far(admin_url) == 2

            await wait_until(counted, what="both refusals on /metrics")
        finally:
            for _, writer in silent:
                writer.close()

    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    over_cap = [line for line in lines if line.get("event") == "agent_handshake_over_cap"]
    assert [(line["address"], line["cap"]) for line in over_cap] == [(LOOPBACK, CAP)]
