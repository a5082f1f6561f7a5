"""The engine supervisor: starts, watches, stops and re-attaches engine processes.

Engines outlive the agent on purpose. Each one is recorded on disk before ``start``
returns; an agent that starts again calls ``reattach`` to pick up the engines that are
still alive (by pid and start time), and stopping the agent (``shutdown``) leaves its
engines running unless asked otherwise.

Every state change (``starting``, ``ready``, ``failed``, ``stopped``) goes to the
``on_change`` callback. A shard that failed stays in the inventory as ``failed`` until it
is stopped or started again (or ``FAILED_KEPT`` newer failures push it out), so a failure
that happened while the control plane could not hear it still reaches it with the next
``hello``.

This is the façade the agent runtime uses: it takes one start or stop of a shard at a time
and hands the work to the modules beside it, each one concern: ``launching`` (spawning
and recording an engine), ``watching`` (``ready``, ``failed``), ``stopping`` (the stop
signal, then SIGKILL), ``adoption`` (the engines found at start), ``inventory`` (the
shards it knows of) and ``reporting`` (each change, and the files behind it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import msgspec
import structlog

from agent.engines.adoption import EngineAdoption
from agent.engines.changes import LOG_TAIL_LINES, ShardChange, change_of
from agent.engines.errors import EngineError
from agent.engines.identity import AWAY_ERROR as AWAY_ERROR
from agent.engines.inventory import FAILED_KEPT, ShardInventory
from agent.engines.launching import EngineLauncher, check_runs_as_asked
from agent.engines.logfiles import KEPT_ENDED_SHARDS, forget_ended_logs
from agent.engines.logtail import read_log_tail
from agent.engines.readiness import DEFAULT_LIVENESS, READINESS_INTERVAL_S, Liveness
from agent.engines.records import RecordStore, ShardKey, ShardRecord, ShardState, shard_file_stem
from agent.engines.reporting import ShardReporter
from agent.engines.spec import ShardSpec
from agent.engines.stopping import terminate
from agent.engines.watching import EngineWatcher
from wire.turns import Turns

log = structlog.get_logger(__name__)


class EngineSupervisor:
    def __init__(
        self,
        state_dir: Path,
        on_change: Callable[[ShardChange], None],
        *,
        poll_interval_s: float = 0.5,
        readiness_interval_s: float = READINESS_INTERVAL_S,
        failed_kept: int = FAILED_KEPT,
        liveness: Liveness = DEFAULT_LIVENESS,
        records: RecordStore | None = None,
        ended_logs_kept: int = KEPT_ENDED_SHARDS,
    ) -> None:
        """``records``: where the engines are recorded, ``state_dir``'s shard records unless
        a test hands in a store over a failing disk. ``ended_logs_kept``: the shards not
        running whose logs are kept (``agent.engines.logfiles.forget_ended_logs``)."""
        self._records = RecordStore(state_dir) if records is None else records
        self._reporter = ShardReporter(on_change, self._records, state_dir / "logs")
        self._inventory = ShardInventory(failed_kept)
        self._launcher = EngineLauncher(
            self._records, self._reporter, poll_interval_s=poll_interval_s
        )
        self._watcher = EngineWatcher(
            self._inventory,
            self._records,
            self._reporter,
            readiness_interval_s=readiness_interval_s,
            liveness=liveness,
        )
        self._adoption = EngineAdoption(
            self._inventory,
            self._records,
            self._reporter,
            self._watcher,
            poll_interval_s=poll_interval_s,
        )
        self._ended_logs_kept = ended_logs_kept
        self._turns: Turns[ShardKey] = Turns()
        """One start or stop of a shard at a time; a shard's lock goes once no one waits."""
        self._closed = False

    async def start(self, spec: ShardSpec) -> ShardRecord:
        """Start the shard, or return its record if it is already running on the same port
        and GPUs.

        Raises ``ShardRunsOtherwise`` (reporting nothing: nothing changed) if it runs on
        another port or other GPUs, and ``EngineLaunchError`` (after reporting ``failed``)
        if no process could be started.
        """
        self._check_open()
        async with self._turns.of(spec.key):
            watched = self._inventory.running.get(spec.key)
            if watched is not None:
                check_runs_as_asked(watched.record, spec)
                return watched.record
            self._inventory.forget_failed(spec.key)
            record, process, oom_at_start = await self._launcher.launch(spec)
            self._watcher.watch(record, process, oom_at_start)
            return record

    async def stop(
        self,
        replica_id: str,
        shard_index: int,
        grace_s: float = 10.0,
        *,
        reason: str | None = None,
    ) -> None:
        """Send the engine's process group, and its workers outside it, its profile's stop
        signal (SIGTERM for every engine llmgw knows), SIGKILL them after ``grace_s``,
        report ``stopped`` once none of them runs and forget the shard. Stopping a shard
        that is not running only reports ``stopped``. An engine stopped before it was ever
        ready (timed out, most likely) reports its log tail with it: the operator's only
        clue to why. ``reason`` says why the agent stops it of its own accord (None: the
        control plane asked)."""
        key = ShardKey(replica_id, shard_index)
        async with self._turns.of(key):
            watched = self._inventory.running.get(key)
            exit_code = None if watched is None else await terminate(watched, grace_s)
            known = watched.record if watched is not None else self._inventory.failed(key)
            self._inventory.running.pop(key, None)
            self._inventory.forget_failed(key)
            self._records.remove(key)
            report = self._reporter.report
            if known is None:
                report(ShardChange(**key._asdict(), state=ShardState.STOPPED, reason=reason))
            else:
                never_ready = known.state is ShardState.STARTING
                tail = self._reporter.tail(key) if never_ready else ()
                stopped = msgspec.structs.replace(known, state=ShardState.STOPPED)
                report(change_of(stopped, exit_code=exit_code, log_tail=tail, reason=reason))
        self._forget_ended_logs()

    async def reattach(self) -> list[ShardRecord]:
        """Watch again every recorded engine that is still alive (never restarting it): the
        same pid and start time, with the record's launch token (``is_recorded_engine``);
        report the others ``failed``, kill what is left of them and drop their records; kill
        an engine an agent killed mid-start never recorded; remove the temporary file of a
        record an agent killed mid-write left. Call before any ``start``."""
        self._check_open()
        adopted = await self._adoption.adopt_recorded()
        self._forget_ended_logs()
        return adopted

    def failure(self, key: ShardKey) -> str | None:
        """Why the shard failed, while the inventory lists it ``failed``: what its
        ``failed`` change said (the next hello carries it, ``agent.reports``)."""
        return self._inventory.failure(key)

    def _forget_ended_logs(self) -> None:
        """Keep the logs of the shards running, failed (their tail is still asked for) or
        being started or stopped, and of the ``ended_logs_kept`` that ended last."""
        live = {*self._inventory.known(), *self._turns.keys()}
        forgotten = forget_ended_logs(
            self._reporter.logs_dir, {shard_file_stem(key) for key in live}, self._ended_logs_kept
        )
        if forgotten:
            log.info("engine_logs_forgotten", files=len(forgotten))

    def running(self, key: ShardKey) -> ShardRecord | None:
        """The record of the shard's engine while it runs (starting or ready)."""
        watched = self._inventory.running.get(key)
        return None if watched is None else watched.record

    def inventory(self) -> list[ShardRecord]:
        """Every shard this agent knows of, in its current state."""
        return self._inventory.records()

    def log_path(self, key: ShardKey) -> Path:
        return self._reporter.log_path(key)

    def log_tail(self, replica_id: str, shard_index: int, lines: int = LOG_TAIL_LINES) -> list[str]:
        return read_log_tail(self.log_path(ShardKey(replica_id, shard_index)), lines)

    async def shutdown(
        self, stop_engines: bool = False, grace_s: float = 10.0, *, reason: str | None = None
    ) -> None:
        """Stop watching; nothing starts from now on. Engines keep running unless
        ``stop_engines`` (each stop is reported, with ``reason``): by default an agent
        that exits must not take its engines with it."""
        self._closed = True
        running = self._inventory.running
        if stop_engines:
            keys = list(running)
            await asyncio.gather(*(self.stop(*key, grace_s=grace_s, reason=reason) for key in keys))
        tasks: list[asyncio.Task[int | None] | asyncio.Task[None]] = []
        for watched in running.values():
            tasks.append(watched.exit)
            if watched.monitor is not None:
                tasks.append(watched.monitor)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        running.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the engine supervisor has been shut down")
