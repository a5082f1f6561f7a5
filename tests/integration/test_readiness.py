"""Readiness checks against a real listening socket of this test: an engine's answer is
judged by its status alone, however its body comes."""

from __future__ import annotations

import asyncio
import os

import pytest

from agent.engines.readiness import wait_until_serving

pytestmark = pytest.mark.timeout(30)


async def endless_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """200 to any request, with a chunked body that never ends."""
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def test_an_engine_whose_health_answer_never_ends_is_judged_by_its_status() -> None:
    server = await asyncio.start_server(endless_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await asyncio.wait_for(
            wait_until_serving(port, os.getpid(), paths=("/health", "/v1/models")), 10
        )
    finally:
        server.close()
