"""How often a serving engine that stopped answering is checked, over real loopback sockets.

The engine here is a listener that accepts every connection and never answers, as a
SIGSTOP'd llama.cpp or simulator does (the kernel still completes the handshake). Each check
it receives waits out its whole timeout; the next one must still start on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

from agent.engines.readiness import Liveness, wait_until_unhealthy
from tests.support.ports import free_port

INTERVAL_S = 0.4


@contextlib.asynccontextmanager
async def hung_engine(port: int, arrivals: list[float]) -> AsyncIterator[None]:
    """Listen on ``port``, note when each request arrives, and never answer one."""
    loop = asyncio.get_running_loop()
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.readline()
        arrivals.append(loop.time())

    server = await asyncio.start_server(hold, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()
        for writer in held:
            writer.close()


async def test_checks_of_a_hung_engine_start_one_interval_apart() -> None:
    """Each missed check used to wait an interval and then its own timeout, so checks came
    two intervals apart and a hung engine was ended after twice the time its reason line
    and the docs tell (60 s rather than 30 s at the default)."""
    port = free_port()
    arrivals: list[float] = []
    async with hung_engine(port, arrivals):
        started_at = asyncio.get_running_loop().time()
        reason = await asyncio.wait_for(
            wait_until_unhealthy(port, "/health", Liveness(interval_s=INTERVAL_S, failures=3)),
            timeout=10 * INTERVAL_S,
        )

    assert reason == (
        "the engine stopped answering its health checks: GET /health did not answer within "
        "0.4 s (3 checks in a row, 0.4 s apart)"
    )
    assert len(arrivals) == 3
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert all(gap < 1.5 * INTERVAL_S for gap in gaps), gaps
    assert arrivals[0] - started_at < 1.5 * INTERVAL_S
