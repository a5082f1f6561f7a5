"""The replica list of a live admin API, read whole or a page at a time as a client of
``GET /admin/v1/replicas`` reads it."""

from __future__ import annotations

from typing import Any

import httpx


async def listed(admin: httpx.AsyncClient, query: str) -> list[dict[str, Any]]:
    answer = await admin.get(f"/admin/v1/replicas?{query}")
    assert answer.status_code == 200, answer.text
    replicas: list[dict[str, Any]] = answer.json()
    return replicas


def ids(replicas: list[dict[str, Any]]) -> list[str]:
    return [r["id"] for r in replicas]


async def paged(admin: httpx.AsyncClient, query: str, limit: int) -> list[dict[str, Any]]:
    """Every page of ``query``, ``limit`` at a time, each after the last one's last replica."""
    found: list[dict[str, Any]] = []
    while True:
        after = f"&after={found[-1]['id']}" if found else ""
        page = await listed(admin, f"{query}limit={limit}{after}")
        assert len(page) <= limit
        found += page
        if len(page) < limit:
            return found
