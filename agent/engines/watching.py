"""Watching an engine that runs: ``ready`` once it serves, ``failed`` once it exits or is
ended.

Each watched engine has two tasks: one that waits for its exit, and a monitor that waits
for it to serve on a port of its own (``agent.engines.readiness``), then checks its health
while it runs, and on its exit reports why it ended (its exit status, the OOM killer where
the kernel's counters tell, the reason its log gives, who holds its port). Apart from the
supervisor because this is the part that runs on its own, between the starts and stops
asked for.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import TypeVar

import structlog

from agent.engines.changes import LOG_TAIL_LINES, REASON_TAIL_LINES, change_of, describe_exit
from agent.engines.errors import PortHeldElsewhere
from agent.engines.family import end_remains
from agent.engines.inventory import ShardInventory
from agent.engines.oom import OomCounts, oom_verdict
from agent.engines.oom_counts import read_oom_kills
from agent.engines.port_owner import HeldElsewhere, check_port_owner
from agent.engines.processes import EngineProcess
from agent.engines.readiness import Liveness, wait_until_serving, wait_until_unhealthy
from agent.engines.records import RecordStore, ShardRecord, ShardState
from agent.engines.reporting import ShardReporter
from agent.engines.stopping import end_refused
from agent.engines.watched import Watched
from wire.engines import failure_reason, profile_of

log = structlog.get_logger(__name__)
T = TypeVar("T")


class EngineWatcher:
    def __init__(
        self,
        inventory: ShardInventory,
        records: RecordStore,
        reporter: ShardReporter,
        *,
        readiness_interval_s: float,
        liveness: Liveness,
    ) -> None:
        self._inventory = inventory
        self._records = records
        self._reporter = reporter
        self._readiness_interval_s = readiness_interval_s
        self._liveness = liveness

    def watch(
        self, record: ShardRecord, process: EngineProcess, oom_at_start: OomCounts | None = None
    ) -> Watched:
        """List the engine as running, report it in its state, and watch it."""
        watched = Watched(
            record=record,
            process=process,
            exit=_task(process.wait_exit()),
            oom_at_start=oom_at_start,
        )
        self._inventory.running[record.key] = watched
        self._reporter.report(change_of(record))
        watched.monitor = _task(self._monitor(watched))
        return watched

    async def _monitor(self, watched: Watched) -> None:
        """Report ``ready`` once the engine serves on a port of its own, and ``failed`` as
        soon as it exits, or once it is ended because another process holds its port or,
        serving, it stopped answering its health checks."""
        record = watched.record
        # The monitor's own task: every line it logs names its shard.
        structlog.contextvars.bind_contextvars(
            replica_id=record.replica_id, shard_index=record.shard_index
        )
        # Not ``_task``: its failures are expected, and read below.
        ready = asyncio.create_task(
            wait_until_serving(
                record.port,
                record.pid,
                paths=profile_of(record.engine).readiness_paths,
                interval_s=self._readiness_interval_s,
            )
        )
        try:
            done, _ = await asyncio.wait({ready, watched.exit}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if ready in done and not watched.exit.done():
            failure = ready.exception()
            if failure is None:
                self._reporter.transition(watched, ShardState.READY)
                await self._check_liveness(watched)
            elif isinstance(failure, PortHeldElsewhere):
                log.warning("engine_port_held_elsewhere", pid=record.pid, reason=str(failure))
                watched.refusal = str(failure)
                watched.port_held_elsewhere = True
                await end_refused(watched)
            else:
                log.error("engine_readiness_failed", pid=record.pid, exc_info=failure)
        exit_code = await asyncio.shield(watched.exit)
        if watched.stopping:
            return
        # Its group is killed already; its workers outside the group are not.
        await asyncio.to_thread(end_remains, watched.record)
        searched = self._reporter.tail(watched.record.key, REASON_TAIL_LINES)
        tail = searched[-LOG_TAIL_LINES:]
        error = watched.refusal or await _exit_error(watched, exit_code, searched)
        self._reporter.transition(
            watched,
            ShardState.FAILED,
            error=error,
            exit_code=exit_code,
            log_tail=tail,
            port_held_elsewhere=watched.port_held_elsewhere,
        )
        self._inventory.running.pop(watched.record.key, None)
        self._records.remove(watched.record.key)
        self._inventory.remember_failed(watched.record, error)

    async def _check_liveness(self, watched: Watched) -> None:
        """While the engine runs, check its health (``agent.engines.readiness``); end it
        once it misses too many checks in a row."""
        record = watched.record
        path = profile_of(record.engine).liveness_path
        if path is None or not self._liveness.checked:
            return
        unhealthy = asyncio.create_task(wait_until_unhealthy(record.port, path, self._liveness))
        try:
            done, _ = await asyncio.wait(
                {unhealthy, watched.exit}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            unhealthy.cancel()
        if unhealthy not in done or watched.exit.done():
            return
        failure = unhealthy.exception()
        if failure is not None:
            log.error("engine_liveness_check_failed", pid=record.pid, exc_info=failure)
            return
        watched.refusal = unhealthy.result()
        log.warning("engine_unhealthy", pid=record.pid, reason=watched.refusal)
        await end_refused(watched)


async def _exit_error(watched: Watched, exit_code: int | None, log_tail: tuple[str, ...]) -> str:
    """How the engine exited (killed by SIGKILL: by the kernel's OOM killer, where its
    counters tell, ``agent.engines.oom``), with the reason its log gives when a line of
    it (``log_tail``: the last ``REASON_TAIL_LINES``) matches one of its profile's
    failure patterns; for one that never served, also
    who holds its port if another process does (the likeliest reason it could not
    bind)."""
    record = watched.record
    described = describe_exit(exit_code)
    if exit_code == -signal.SIGKILL and watched.oom_at_start is not None:
        at_start = watched.oom_at_start
        in_cgroup, on_machine = await asyncio.to_thread(read_oom_kills, at_start)
        verdict = oom_verdict(at_start, in_cgroup, on_machine)
        described = described if verdict is None else f"{described}: {verdict}"
    reason = failure_reason(profile_of(record.engine), log_tail)
    explained = described if reason is None else f"{described}: {reason}"
    if record.state is not ShardState.STARTING:
        return explained
    ownership = await asyncio.to_thread(check_port_owner, record.port, record.pid)
    if isinstance(ownership, HeldElsewhere):
        watched.port_held_elsewhere = True
        held = f"{described}; {ownership.reason}"
        return held if reason is None else f"{held}; {reason}"
    return explained


def _task(coroutine: Coroutine[object, object, T]) -> asyncio.Task[T]:
    task = asyncio.create_task(coroutine)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("engine_watch_failed", exc_info=task.exception())
