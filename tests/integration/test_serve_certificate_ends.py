"""``llmgw-server serve`` says when the certificates it presents and trusts end, weeks
ahead: TLS checks their dates only at each handshake, so a server whose certificate ended
keeps its agents until its next restart or failover, when every agent refuses it at once.

The test CA here lasts two days and the server certificate one: both are within the thirty
days ``serve`` warns of at its start, and both are on ``/metrics`` by serial."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.pki.describe import serial_hex
from app.pki.files import load_certificate
from tests.support.admin_server import write_pki
from tests.support.serve_process import serving_process

pytestmark = pytest.mark.timeout(120)


async def test_serve_warns_of_certificates_ending_soon_and_publishes_their_ends(
    database_url: str, tmp_path: Path
) -> None:
    pki = write_pki(tmp_path / "pki", "alice", "gpu-1")
    server = load_certificate(pki.directory / "server.crt")
    ca = load_certificate(pki.ca)
    log = tmp_path / "server.log"
    async with (
        serving_process(
            database_url, pki, log, token_name="ci", token=secrets.token_hex(16), admin_tls=False
        ) as admin_url,
        httpx.AsyncClient() as client,
    ):
        page = await client.get(f"{admin_url}/metrics")

    ends = {
        (sample.labels["certificate"], sample.labels["serial"]): sample.value
        for family in text_string_to_metric_families(page.text)
        for sample in family.samples
        if sample.name == "llmgw_certificate_expiry_timestamp_seconds"
    }
    assert ends == {
        ("agent_hub", serial_hex(server)): server.not_valid_after_utc.timestamp(),
        ("ca", serial_hex(ca)): ca.not_valid_after_utc.timestamp(),
    }
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    warned = {
        line["certificate"]: line for line in lines if line["event"] == "certificate_expires_soon"
    }
    assert set(warned) == {"agent_hub", "ca"}
    assert warned["agent_hub"]["serial"] == serial_hex(server)
    assert warned["agent_hub"]["days_left"] == 0
    assert warned["agent_hub"]["level"] == "warning"
