"""Waiting for an engine to serve: every readiness path of its profile (``wire.engines``;
``/health`` and ``/v1/models`` for vLLM, SGLang and llama.cpp) answers 200, and every socket
listening on its port is the engine's own (``agent.engines.port_owner``). Anything else,
a refused connection or llama.cpp's 503 while it loads, means "not yet".

Then, while it serves, its liveness path (``/health``) is asked every ``Liveness.interval_s``:
``Liveness.failures`` misses in a row (an answer other than 200, or none within the
interval; checks start one interval apart however long the last one took) mean the engine
is dead behind its HTTP server, as a vLLM whose engine core died is, answering 503 to its
health checks and 500 to every request for as long as it is left.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from agent.engines.errors import PortHeldElsewhere
from agent.engines.port_owner import HeldElsewhere, Owned, check_port_owner
from wire.engines import DEFAULT_ENGINE, PROFILES

DEFAULT_READINESS_PATHS = PROFILES[DEFAULT_ENGINE].readiness_paths
READINESS_INTERVAL_S = 0.1
"""How often a starting engine is asked whether it serves. Every tick of waiting is a tick a
replica that could serve is not routed (an autoscaler's new replica while a burst queues,
a drain's replacement while the original holds its GPU): half a second cost a start a
quarter of a second on average. A check of an engine still loading is a refused connection
on loopback (0.8 ms of the agent's CPU) or one small answer (llama.cpp's 503): asking ten
times a second costs under 1 % of a core per engine starting."""


@dataclass(frozen=True)
class Liveness:
    """How a serving engine's health is checked; an ``interval_s`` of 0 checks nothing."""

    interval_s: float = 10.0
    """Between the starts of two checks, and the most one may take."""
    failures: int = 3
    """Misses in a row that end the engine: at the default, the third check after its last
    healthy answer, 30 s later, or 40 s when that check waits out its timeout."""

    @property
    def checked(self) -> bool:
        return self.interval_s > 0


DEFAULT_LIVENESS = Liveness()


def readiness_url(port: int) -> str:
    """Engines listen on the node's addresses; the agent checks them over loopback."""
    return f"http://127.0.0.1:{port}"


async def wait_until_serving(
    port: int,
    engine_pid: int,
    *,
    paths: tuple[str, ...] = DEFAULT_READINESS_PATHS,
    interval_s: float = READINESS_INTERVAL_S,
    request_timeout_s: float = 2.0,
) -> None:
    """Return once every readiness path answers 200 on ``port`` and the engine led by
    ``engine_pid`` holds every socket listening there; poll until then (or until
    cancelled). Raises ``PortHeldElsewhere`` when the answer may have come from another
    process: that engine can never serve on its port.

    How long an engine may take is the control plane's decision, so there is no deadline.
    """
    async with httpx.AsyncClient(
        base_url=readiness_url(port), timeout=request_timeout_s, trust_env=False
    ) as client:
        while True:
            if await _all_answer_ok(client, paths, request_timeout_s):
                ownership = await asyncio.to_thread(check_port_owner, port, engine_pid)
                if isinstance(ownership, Owned):
                    return
                if isinstance(ownership, HeldElsewhere):
                    raise PortHeldElsewhere(ownership.reason)
                # Nothing listens any more: the answer came from a listener now closed.
            await asyncio.sleep(interval_s)


async def _all_answer_ok(
    client: httpx.AsyncClient, paths: tuple[str, ...], timeout_s: float
) -> bool:
    """Whether every path answers 200 (``_health_miss``: its status alone, in time)."""
    for path in paths:
        if await _health_miss(client, path, timeout_s) is not None:
            return False
    return True


async def wait_until_unhealthy(port: int, path: str, liveness: Liveness) -> str:
    """Check ``path`` on ``port`` every ``liveness.interval_s`` until ``liveness.failures``
    checks in a row miss; return why, for the engine's failure (or run until cancelled).

    Checks start on a fixed cadence, one interval apart: a check that waits out its
    timeout (an interval) ends as the next one is due, and does not push it back. Sleeping
    an interval after each check put a hung engine's checks two intervals apart, and
    ended it after twice the time the reason line and ``Liveness.failures`` tell. The
    first check is due one interval after the call."""
    interval_s = liveness.interval_s
    loop = asyncio.get_running_loop()
    # The cadence starts with the watch: the client's set-up is part of the first
    # interval, not added to it.
    next_check_at = loop.time() + interval_s
    async with httpx.AsyncClient(
        base_url=readiness_url(port), timeout=interval_s, trust_env=False
    ) as client:
        missed = 0
        while True:
            await asyncio.sleep(max(0.0, next_check_at - loop.time()))
            # Checks more than an interval late (a suspended machine) are not made up for.
            next_check_at = max(next_check_at + interval_s, loop.time())
            miss = await _health_miss(client, path, interval_s)
            missed = 0 if miss is None else missed + 1
            if missed >= liveness.failures:
                return (
                    f"the engine stopped answering its health checks: GET {path} {miss} "
                    f"({missed} checks in a row, {interval_s:g} s apart)"
                )


async def _health_miss(client: httpx.AsyncClient, path: str, timeout_s: float) -> str | None:
    """None when ``path`` answers 200 within ``timeout_s``; else what it did instead. Only
    the status is read, within ``timeout_s`` in all: an engine's answer is not the agent's
    to hold, and one that sends its body slowly or without end (a byte a second, say)
    would otherwise hold the check, and the agent's memory grow, for as long as it went on."""
    try:
        async with asyncio.timeout(timeout_s), client.stream("GET", path) as response:
            if response.status_code == 200:
                return None
            return f"answered {response.status_code}"
    except (TimeoutError, httpx.TimeoutException):
        return f"did not answer within {timeout_s:g} s"
    except httpx.ConnectError:
        return "was refused (nothing listens on the port)"
    except httpx.HTTPError as exc:
        return f"failed: {type(exc).__name__}"
