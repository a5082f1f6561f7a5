"""Ending a watched engine: its stop signal first, SIGKILL once the grace has passed.

A stop asked for (``terminate``) reaches the engine's process group and its workers outside
it (``agent.engines.family``), and returns only once none of them runs. An engine the
supervisor ends itself (``end_refused``: its port is another process's, or it stopped
answering its health checks) gets ``REFUSED_GRACE_S``. Apart from watching because the
escalation and its waits are the same whoever asks for the stop.
"""

from __future__ import annotations

import asyncio
import signal

import structlog

from agent.engines.family import ask_each_to_stop, outside_group, signal_each, wait_until_gone
from agent.engines.processes import KILL_WAIT_S, ask_to_stop
from agent.engines.records import is_same_process
from agent.engines.watched import Watched
from wire.engines import profile_of

log = structlog.get_logger(__name__)

REFUSED_GRACE_S = 5.0
"""How long an engine whose port is another process's gets to exit after SIGTERM."""


async def terminate(watched: Watched, grace_s: float) -> int | None:
    """End the engine: its process group, and its workers in sessions or groups of their
    own (found while the leader still runs: once it is gone they are re-parented).
    Returns once none of its processes runs, or ``KILL_WAIT_S`` after SIGKILL."""
    watched.stopping = True
    if watched.monitor is not None:
        watched.monitor.cancel()
    pid = watched.record.pid
    outside = await asyncio.to_thread(outside_group, pid) if is_same_process(watched.record) else {}
    exit_code = await _signal_until_exit(watched, grace_s, outside)
    signal_each(outside, signal.SIGKILL)
    left = await wait_until_gone(pid, outside, KILL_WAIT_S)
    if left:
        log.error("engine_processes_survived_sigkill", pid=pid, left=left)
    return exit_code


async def _signal_until_exit(
    watched: Watched, grace_s: float, outside: dict[int, int]
) -> int | None:
    stop_signal = profile_of(watched.record.engine).stop_signal
    if ask_to_stop(watched.process, stop_signal):
        ask_each_to_stop(outside, stop_signal)
        try:
            return await asyncio.wait_for(asyncio.shield(watched.exit), grace_s)
        except TimeoutError:
            log.warning("engine_ignored_sigterm", pid=watched.record.pid, grace_s=grace_s)
            watched.process.signal_group(signal.SIGKILL)
            signal_each(outside, signal.SIGKILL)
    try:
        return await asyncio.wait_for(asyncio.shield(watched.exit), KILL_WAIT_S)
    except TimeoutError:
        log.error("engine_survived_sigkill", pid=watched.record.pid)
        return None


async def end_refused(watched: Watched) -> None:
    """Send the engine's group its stop signal (and SIGCONT, ``ask_to_stop``), SIGKILL it
    after ``REFUSED_GRACE_S``."""
    if not ask_to_stop(watched.process, profile_of(watched.record.engine).stop_signal):
        return
    try:
        await asyncio.wait_for(asyncio.shield(watched.exit), REFUSED_GRACE_S)
    except TimeoutError:
        watched.process.signal_group(signal.SIGKILL)
