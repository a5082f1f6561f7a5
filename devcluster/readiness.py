"""Waiting until a process is ready: a deadline, a probe, and a check that runs each round
(a child that exited, a stop that was asked for) so that a wait never outlives its reason.

The probes answer quickly and never raise for "not yet": a port that refuses, an HTTP
server that is not listening yet, or one that answers another status is simply not ready.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable

import httpx

from devcluster.errors import NotReady
from devcluster.ports import listens

__all__ = ["answers", "listens", "wait_for"]

PROBE_TIMEOUT_S = 5.0


def wait_for(
    condition: Callable[[], bool],
    *,
    within_s: float,
    what: str,
    every_s: float = 0.1,
    check: Callable[[], None] = lambda: None,
    hint: str = "",
) -> None:
    """Until ``condition()`` holds; ``NotReady`` after ``within_s``. ``check`` runs before
    each try and may raise to end the wait (a child exited, a stop was requested)."""
    deadline = time.monotonic() + within_s
    while True:
        check()
        if condition():
            return
        if time.monotonic() > deadline:
            raise NotReady(f"timed out after {within_s:.0f}s waiting for {what}{hint}")
        time.sleep(every_s)


def answers(url: str, *, verify: ssl.SSLContext | bool = True, status: int = 200) -> bool:
    """Whether ``GET url`` answers with ``status`` (``/healthz``, ``/readyz``)."""
    try:
        with httpx.Client(verify=verify, timeout=PROBE_TIMEOUT_S, trust_env=False) as client:
            return client.get(url).status_code == status
    except httpx.TransportError:
        return False
