"""The agent's two dial timeouts, on real sockets: a server whose TCP connect never
completes is left after the short connect timeout, and a server that accepts TCP but never
finishes its TLS handshake (a control plane deep in a reconnect storm) is given the long
open timeout before the agent dials again."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection

from agent.config import parse_server
from agent.connection import Backoff, DialTimeouts, stay_connected, tcp_connect
from tests.support.waiting import wait_until

CONNECT_S = 0.3
OPEN_S = 1.5


@contextlib.contextmanager
def unanswered_port() -> Iterator[int]:
    """A port whose TCP connects hang: a listener that never accepts, its queue full, so
    the kernel drops further SYNs (as a black-holed or overloaded server does)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


@contextlib.asynccontextmanager
async def silent_after_tcp() -> AsyncIterator[tuple[int, list[float]]]:
    """A server that accepts TCP and never speaks TLS; how long each peer stayed."""
    held: list[float] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted = time.monotonic()
        with contextlib.suppress(ConnectionError):
            while await reader.read(4096):
                pass
        held.append(time.monotonic() - accepted)
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], held
    finally:
        server.close()


async def never_served(_: ClientConnection) -> bool:
    raise AssertionError("no connection should open")


async def test_a_tcp_connect_that_hangs_gives_up_after_the_connect_timeout() -> None:
    with unanswered_port() as port:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=f"timed out after {CONNECT_S:g}s"):
            await tcp_connect("127.0.0.1", port, CONNECT_S)
        assert CONNECT_S <= time.monotonic() - started < OPEN_S


async def test_the_agent_skips_a_dead_server_fast_and_waits_long_for_a_slow_handshake() -> None:
    with unanswered_port() as dead_port:
        async with silent_after_tcp() as (slow_port, held):
            servers = [
                parse_server(f"wss://127.0.0.1:{dead_port}"),
                parse_server(f"wss://127.0.0.1:{slow_port}"),
            ]
            with capture_logs() as logs:
                dialling = asyncio.create_task(
                    stay_connected(
                        servers,
                        ssl.create_default_context(),
                        never_served,
                        backoff=Backoff(initial_s=0.01, cap_s=0.01),
                        timeouts=DialTimeouts(connect_s=CONNECT_S, open_s=OPEN_S),
                    )
                )
                try:
                    await wait_until(lambda: len(held) >= 2, within_s=4 * (OPEN_S + CONNECT_S))
                finally:
                    dialling.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await dialling

    assert all(OPEN_S - 0.1 <= stay < OPEN_S + 1.0 for stay in held), held
    failures = [entry for entry in logs if entry["event"] == "connect_failed"]
    dead = [f for f in failures if f["server"] == servers[0].uri]
    assert dead, failures
    assert all(f"timed out after {CONNECT_S:g}s" in f["reason"] for f in dead)
