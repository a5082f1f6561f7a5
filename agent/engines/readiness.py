"""Waiting for an engine to serve: ``GET /health`` and then ``GET /v1/models`` answer 200."""

from __future__ import annotations

import asyncio

import httpx

READINESS_PATHS = ("/health", "/v1/models")


def readiness_url(port: int) -> str:
    """Engines listen on the node's addresses; the agent checks them over loopback."""
    return f"http://127.0.0.1:{port}"


async def wait_until_ready(
    base_url: str, *, interval_s: float = 0.5, request_timeout_s: float = 2.0
) -> None:
    """Return once every readiness path answers 200; poll until then (or until cancelled).

    How long an engine may take is the control plane's decision, so there is no deadline.
    """
    async with httpx.AsyncClient(
        base_url=base_url, timeout=request_timeout_s, trust_env=False
    ) as client:
        while not await _all_answer_ok(client):  # noqa: ASYNC110 (polling the engine)
            await asyncio.sleep(interval_s)


async def _all_answer_ok(client: httpx.AsyncClient) -> bool:
    for path in READINESS_PATHS:
        try:
            response = await client.get(path)
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
    return True
