"""Launching an engine: recorded before it is spawned, and recorded again once it runs.

A ``LaunchRecord`` is saved before the spawn and removed once the engine's ``ShardRecord``
is saved (``agent.engines.records``), so an agent killed in between leaves what finds the
engine again. An engine that cannot be recorded is killed rather than left running unseen.
Every failure is reported ``failed`` and raised as ``EngineLaunchError``. Apart from the
supervisor because the steps of a launch, and what each one's failure leaves behind, are
a concern of their own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from datetime import UTC, datetime
from pathlib import Path

import structlog

from agent.engines.errors import EngineLaunchError, ShardRunsOtherwise
from agent.engines.logfiles import rotate_log
from agent.engines.oom import OomCounts
from agent.engines.oom_counts import read_oom_counts
from agent.engines.processes import ChildProcess, EngineProcess, spawn_engine
from agent.engines.records import (
    LaunchRecord,
    RecordStore,
    ShardRecord,
    ShardState,
    current_boot_id,
    process_identity,
)
from agent.engines.reporting import ShardReporter
from agent.engines.spec import ShardSpec, engine_env
from wire.engine_env import LAUNCH_TOKEN_VARIABLE

log = structlog.get_logger(__name__)


class EngineLauncher:
    def __init__(
        self, records: RecordStore, reporter: ShardReporter, *, poll_interval_s: float
    ) -> None:
        self._records = records
        self._reporter = reporter
        self._poll_interval_s = poll_interval_s

    async def launch(self, spec: ShardSpec) -> tuple[ShardRecord, ChildProcess, OomCounts]:
        """Spawn the shard's engine and record it, with the OOM kills counted as it starts;
        or report ``failed`` and raise ``EngineLaunchError`` if no process could be
        started."""
        launch = LaunchRecord(
            replica_id=spec.replica_id,
            shard_index=spec.shard_index,
            model=spec.model,
            port=spec.port,
            gpus=spec.gpus,
            command=spec.argv,
            log_path=str(self._reporter.log_path(spec.key)),
            started_at=datetime.now(UTC),
            engine=spec.engine,
            token=uuid.uuid4().hex,
            boot_id=current_boot_id(),
        )
        try:
            self._records.save_launch(launch)
        except OSError as exc:
            raise self._reporter.launch_failed(spec, f"cannot record the engine: {exc}") from exc
        try:
            return await self._spawn(spec, launch)
        finally:
            # Left behind by a disk that refuses (logged), it is harmless: it names an
            # engine that is recorded, killed or was never spawned.
            self._records.remove_launch(spec.key)

    async def _spawn(
        self, spec: ShardSpec, launch: LaunchRecord
    ) -> tuple[ShardRecord, ChildProcess, OomCounts]:
        """Spawn the engine and record it, or kill it and raise ``EngineLaunchError``; with
        the OOM kills counted as it starts."""
        failed = self._reporter.launch_failed
        env = {**engine_env(os.environ, spec), LAUNCH_TOKEN_VARIABLE: launch.token}
        log_path = Path(launch.log_path)
        try:
            rotate_log(log_path)
        except OSError as exc:
            # Appending to the old log is better than not starting the engine at all.
            log.warning("engine_log_not_rotated", path=str(log_path), error=str(exc))
        try:
            pid = spawn_engine(spec.argv, env, log_path)
        except (OSError, ValueError) as exc:
            # ValueError: an argv or env no process can be given (a NUL byte, a name
            # with "=" or none at all), refused by the spawn itself.
            raise failed(spec, f"cannot start {spec.argv[0]!r}: {exc}") from exc
        except EngineLaunchError as exc:  # an empty command, or a log it cannot write
            raise failed(spec, str(exc)) from exc
        process = ChildProcess(pid, poll_interval_s=self._poll_interval_s)
        # An unreaped child keeps its /proc entry even if it has already exited.
        start_time = process_identity(pid)
        if start_time is None:
            await _kill(process)
            raise failed(spec, f"cannot read /proc/{pid}/stat")
        oom_at_start = await asyncio.to_thread(read_oom_counts, pid)
        record = launch.spawned(pid, start_time, ShardState.STARTING)
        try:
            self._records.save(record)
        except OSError as exc:
            await _kill(process)
            raise failed(spec, f"cannot record the engine: {exc}") from exc
        return record, process, oom_at_start


def check_runs_as_asked(record: ShardRecord, spec: ShardSpec) -> None:
    """Raise ``ShardRunsOtherwise`` unless the running engine listens on the port and holds
    the GPUs ``spec`` asks for: a start acknowledged for an engine elsewhere would have the
    control plane route to a port nothing of this shard serves on."""
    if (record.port, record.gpus) == (spec.port, spec.gpus):
        return
    raise ShardRunsOtherwise(
        f"replica {spec.replica_id} shard {spec.shard_index} already runs on port "
        f"{record.port} with GPUs {list(record.gpus)} (pid {record.pid}); stop it before "
        f"starting it on port {spec.port} with GPUs {list(spec.gpus)}"
    )


async def _kill(process: EngineProcess) -> None:
    """Kill an engine the supervisor will not watch (one it could not record)."""
    process.signal_group(signal.SIGKILL)
    await process.wait_exit()
