"""``llmgw-server serve`` with its gateway, as a process of its own: the gateway's figures
(every model and replica it routes to) are read on the admin listener, where operators
reach it, and its client listener answers 404 for ``/metrics``."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from tests.support.admin_server import LOOPBACK, write_pki
from tests.support.ports import free_port
from tests.support.serve_process import serving_process
from tests.unit.test_metric_rules import offences, published

pytestmark = pytest.mark.timeout(120)

TOKEN = secrets.token_hex(16)


@pytest_asyncio.fixture(loop_scope="session")
async def serving(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """The admin API's URL and the gateway's."""
    pki = write_pki(tmp_path / "pki", "alice", "gpu-1")
    client_port = free_port()
    async with serving_process(
        database_url,
        pki,
        tmp_path / "server.log",
        token_name="ci",
        token=TOKEN,
        admin_tls=False,
        gateway_port=client_port,
    ) as admin_url:
        yield admin_url, f"http://{LOOPBACK}:{client_port}"


async def test_the_gateways_metrics_are_on_the_admin_listener_not_the_client_one(
    serving: tuple[str, str],
) -> None:
    admin_url, gateway_url = serving
    async with httpx.AsyncClient() as client:
        ready = await client.get(f"{gateway_url}/healthz")
        on_the_client_listener = await client.get(f"{gateway_url}/metrics")
        on_the_admin_listener = await client.get(f"{admin_url}/metrics")

    assert ready.status_code == 200
    assert on_the_client_listener.status_code == 404
    assert on_the_client_listener.json()["error"]["code"] == "not_found"
    assert on_the_admin_listener.status_code == 200
    families = {f.name for f in text_string_to_metric_families(on_the_admin_listener.text)}
    assert {"llmgw_leader", "llmgw_replicas"} <= families  # the cluster's, as before
    assert {
        "llmgw_gateway_requests",
        "llmgw_gateway_stale_replicas",
        "llmgw_gateway_replica_in_flight",
        "llmgw_gateway_routing_reads",
    } <= families
    whole_reads = [
        s.value
        for f in text_string_to_metric_families(on_the_admin_listener.text)
        for s in f.samples
        if s.name == "llmgw_gateway_routing_reads_total" and s.labels == {"read": "whole"}
    ]
    assert len(whole_reads) == 1
    assert whole_reads[0] >= 1  # its first read read every route


async def test_the_page_serve_publishes_follows_the_metric_rules(
    serving: tuple[str, str],
) -> None:
    """The page of a real ``serve``, its gateway's families after the cluster's, is held to
    the rules the unit test holds each collector to, and has no family the collectors
    there do not (one registered elsewhere would escape them)."""
    admin_url, _ = serving
    async with httpx.AsyncClient() as client:
        page = (await client.get(f"{admin_url}/metrics")).text

    assert offences(page) == []
    names = {
        f"{f.name}_total" if f.type == "counter" else f.name
        for f in text_string_to_metric_families(page)
        if not (f.type == "gauge" and f.name.endswith("_created"))
    }
    assert names <= published().keys()
