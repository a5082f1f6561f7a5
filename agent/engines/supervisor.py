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
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import msgspec
import structlog

from agent.engines.changes import (
    LOG_TAIL_LINES,
    REASON_TAIL_LINES,
    ShardChange,
    can_transition,
    change_of,
    describe_exit,
)
from agent.engines.errors import (
    EngineError,
    EngineLaunchError,
    PortHeldElsewhere,
    ShardRunsOtherwise,
)
from agent.engines.family import (
    ask_each_to_stop,
    end_launched,
    end_remains,
    outside_group,
    signal_each,
    wait_until_gone,
)
from agent.engines.identity import AWAY_ERROR as AWAY_ERROR
from agent.engines.identity import identity_refusal
from agent.engines.logfiles import (
    KEPT_ENDED_SHARDS,
    forget_ended_logs,
    restrict_logs,
    rotate_log,
)
from agent.engines.logtail import read_log_tail
from agent.engines.oom import (
    SYSTEM_COUNTERS,
    OomCounts,
    oom_counter_files,
    oom_kills,
    oom_verdict,
)
from agent.engines.port_owner import HeldElsewhere, check_port_owner
from agent.engines.processes import (
    AdoptedProcess,
    ChildProcess,
    EngineProcess,
    ask_to_stop,
    spawn_engine,
)
from agent.engines.readiness import (
    DEFAULT_LIVENESS,
    READINESS_INTERVAL_S,
    Liveness,
    wait_until_serving,
    wait_until_unhealthy,
)
from agent.engines.records import (
    LaunchRecord,
    RecordStore,
    ShardKey,
    ShardRecord,
    ShardState,
    current_boot_id,
    is_same_process,
    process_identity,
    shard_file_stem,
)
from agent.engines.spec import ShardSpec, engine_env
from wire.engine_env import LAUNCH_TOKEN_VARIABLE
from wire.engines import failure_reason, profile_of
from wire.turns import Turns

log = structlog.get_logger(__name__)
T = TypeVar("T")

UNRECORDED_ERROR = (
    "the agent was killed while it started the engine, before it recorded it: the engine was killed"
)
KILL_WAIT_S = 10.0
FAILED_KEPT = 256
"""How many failed shards the agent keeps reporting, the newest. The control plane stops
only shards that run, so a failed one is otherwise kept until the agent exits: a model that
crashes again and again (a new replica each time) would grow every heartbeat and hello
without end, and past the 4,096 shards a message may list, the control plane would refuse
them all and the node could never connect again. A node runs far fewer shards at once, so
a failure it could not report while disconnected still reaches the next hello."""
MAX_COUNTER_FILE_BYTES = 2**20
"""The most read of a /proc or /sys file the OOM counters are in: /proc/vmstat is a few
KiB, /proc/self/mounts some hundred KiB on a node with thousands of mounts."""
REFUSED_GRACE_S = 5.0
"""How long an engine whose port is another process's gets to exit after SIGTERM."""


@dataclass(eq=False)
class _Watched:
    record: ShardRecord
    process: EngineProcess
    exit: asyncio.Task[int | None]
    monitor: asyncio.Task[None] | None = None
    stopping: bool = False
    refusal: str | None = None
    """Why the supervisor ended the engine itself (its port is another process's, or it
    stopped answering its health checks)."""
    port_held_elsewhere: bool = False
    """Whether a process that is not this engine was found listening on its port: the
    control plane avoids that port of this node (``wire.ShardStatus.port_held_elsewhere``)."""
    oom_at_start: OomCounts | None = None
    """The OOM kills counted when this agent spawned the engine (``agent.engines.oom``);
    None for an engine adopted, whose exit status is unknown anyway."""


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
        self._logs_dir = state_dir / "logs"
        self._on_change = on_change
        self._poll_interval_s = poll_interval_s
        self._readiness_interval_s = readiness_interval_s
        self._liveness = liveness
        self._running: dict[ShardKey, _Watched] = {}
        self._failed: dict[ShardKey, ShardRecord] = {}
        """Failed shards, oldest first, at most ``failed_kept`` (``FAILED_KEPT``)."""
        self._failures: dict[ShardKey, str] = {}
        """Why each shard in ``_failed`` failed, as its ``failed`` change said."""
        self._failed_kept = failed_kept
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
            watched = self._running.get(spec.key)
            if watched is not None:
                _check_runs_as_asked(watched.record, spec)
                return watched.record
            self._forget_failed(spec.key)
            launch = LaunchRecord(
                replica_id=spec.replica_id,
                shard_index=spec.shard_index,
                model=spec.model,
                port=spec.port,
                gpus=spec.gpus,
                command=spec.argv,
                log_path=str(self.log_path(spec.key)),
                started_at=datetime.now(UTC),
                engine=spec.engine,
                token=uuid.uuid4().hex,
                boot_id=current_boot_id(),
            )
            try:
                self._records.save_launch(launch)
            except OSError as exc:
                raise self._launch_failed(spec, f"cannot record the engine: {exc}") from exc
            try:
                record, process, oom_at_start = await self._launch(spec, launch)
            finally:
                # Left behind by a disk that refuses (logged), it is harmless: it names an
                # engine that is recorded, killed or was never spawned.
                self._records.remove_launch(spec.key)
            self._watch(record, process, oom_at_start)
            return record

    async def _launch(
        self, spec: ShardSpec, launch: LaunchRecord
    ) -> tuple[ShardRecord, ChildProcess, OomCounts]:
        """Spawn the engine and record it, or kill it and raise ``EngineLaunchError``; with
        the OOM kills counted as it starts."""
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
            raise self._launch_failed(spec, f"cannot start {spec.argv[0]!r}: {exc}") from exc
        except EngineLaunchError as exc:  # an empty command, or a log it cannot write
            raise self._launch_failed(spec, str(exc)) from exc
        process = ChildProcess(pid, poll_interval_s=self._poll_interval_s)
        # An unreaped child keeps its /proc entry even if it has already exited.
        start_time = process_identity(pid)
        if start_time is None:
            await _kill(process)
            raise self._launch_failed(spec, f"cannot read /proc/{pid}/stat")
        oom_at_start = await asyncio.to_thread(read_oom_counts, pid)
        record = launch.spawned(pid, start_time, ShardState.STARTING)
        try:
            self._records.save(record)
        except OSError as exc:
            await _kill(process)
            raise self._launch_failed(spec, f"cannot record the engine: {exc}") from exc
        return record, process, oom_at_start

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
            watched = self._running.get(key)
            exit_code = None if watched is None else await self._terminate(watched, grace_s)
            known = watched.record if watched is not None else self._failed.get(key)
            self._running.pop(key, None)
            self._forget_failed(key)
            self._records.remove(key)
            if known is None:
                self._report(ShardChange(**key._asdict(), state=ShardState.STOPPED, reason=reason))
            else:
                never_ready = known.state is ShardState.STARTING
                tail = self._tail(key) if never_ready else ()
                stopped = msgspec.structs.replace(known, state=ShardState.STOPPED)
                self._report(change_of(stopped, exit_code=exit_code, log_tail=tail, reason=reason))
        self._forget_ended_logs()

    async def reattach(self) -> list[ShardRecord]:
        """Watch again every recorded engine that is still alive (never restarting it): the
        same pid and start time, with the record's launch token (``is_recorded_engine``);
        report the others ``failed``, kill what is left of them and drop their records; kill
        an engine an agent killed mid-start never recorded; remove the temporary file of a
        record an agent killed mid-write left. Call before any ``start``."""
        self._check_open()
        adopted: list[ShardRecord] = []
        for leftover in self._records.remove_temporaries():
            log.info("shard_record_temporary_removed", path=str(leftover))
        records = self._records.load_all()
        recorded = {record.key for record in records}
        for launch in self._records.load_launches():
            if launch.key not in recorded:
                await self._end_unrecorded(launch)
            self._records.remove_launch(launch.key)
        for record in records:
            if record.key in self._running:
                continue
            refusal = identity_refusal(record)
            if refusal is None:
                # Starting again until it answers its health checks: it was not watched.
                unconfirmed = msgspec.structs.replace(record, state=ShardState.STARTING)
                self._save_state(unconfirmed)
                for restricted in restrict_logs(self.log_path(record.key)):
                    log.info("engine_log_restricted", path=str(restricted))
                process = AdoptedProcess(unconfirmed, poll_interval_s=self._poll_interval_s)
                adopted.append(self._watch(unconfirmed, process).record)
                continue
            end_remains(record)
            self._records.remove(record.key)
            failed = msgspec.structs.replace(record, state=ShardState.FAILED)
            searched = self._tail(record.key, REASON_TAIL_LINES)
            tail = searched[-LOG_TAIL_LINES:]
            error = _with_log_reason(refusal, record, searched)
            self._remember_failed(failed, error)
            self._report(change_of(failed, error=error, log_tail=tail))
        self._forget_ended_logs()
        return adopted

    async def _end_unrecorded(self, launch: LaunchRecord) -> None:
        """Kill the engine an agent killed mid-start spawned but never recorded (nobody
        was told it runs, and nothing would ever stop it); report it ``failed`` if it ran."""
        leader = await asyncio.to_thread(end_launched, launch.token)
        if leader is None:
            return
        log.warning("unrecorded_engine_killed", replica_id=launch.replica_id, pid=leader.pid)
        failed = launch.spawned(leader.pid, leader.start_time, ShardState.FAILED)
        self._remember_failed(failed, UNRECORDED_ERROR)
        self._report(change_of(failed, error=UNRECORDED_ERROR, log_tail=self._tail(launch.key)))

    def _remember_failed(self, record: ShardRecord, error: str) -> None:
        """Keep ``record`` in the inventory, with why it failed (``error``), until its shard
        is stopped or started again, or ``failed_kept`` newer failures push it out."""
        self._forget_failed(record.key)
        self._failed[record.key] = record
        self._failures[record.key] = error
        while len(self._failed) > self._failed_kept:
            self._forget_failed(next(iter(self._failed)))

    def _forget_failed(self, key: ShardKey) -> None:
        self._failed.pop(key, None)
        self._failures.pop(key, None)

    def failure(self, key: ShardKey) -> str | None:
        """Why the shard failed, while the inventory lists it ``failed``: what its
        ``failed`` change said (the next hello carries it, ``agent.reports``)."""
        return self._failures.get(key)

    def _forget_ended_logs(self) -> None:
        """Keep the logs of the shards running, failed (their tail is still asked for) or
        being started or stopped, and of the ``ended_logs_kept`` that ended last."""
        live = {*self._running, *self._failed, *self._turns.keys()}
        forgotten = forget_ended_logs(
            self._logs_dir, {shard_file_stem(key) for key in live}, self._ended_logs_kept
        )
        if forgotten:
            log.info("engine_logs_forgotten", files=len(forgotten))

    def running(self, key: ShardKey) -> ShardRecord | None:
        """The record of the shard's engine while it runs (starting or ready)."""
        watched = self._running.get(key)
        return None if watched is None else watched.record

    def inventory(self) -> list[ShardRecord]:
        """Every shard this agent knows of, in its current state."""
        records = [watched.record for watched in self._running.values()]
        records.extend(self._failed.values())
        return sorted(records, key=lambda record: record.key)

    def log_path(self, key: ShardKey) -> Path:
        return self._logs_dir / f"{shard_file_stem(key)}.log"

    def log_tail(self, replica_id: str, shard_index: int, lines: int = LOG_TAIL_LINES) -> list[str]:
        return read_log_tail(self.log_path(ShardKey(replica_id, shard_index)), lines)

    async def shutdown(
        self, stop_engines: bool = False, grace_s: float = 10.0, *, reason: str | None = None
    ) -> None:
        """Stop watching; nothing starts from now on. Engines keep running unless
        ``stop_engines`` (each stop is reported, with ``reason``): by default an agent
        that exits must not take its engines with it."""
        self._closed = True
        if stop_engines:
            keys = list(self._running)
            await asyncio.gather(*(self.stop(*key, grace_s=grace_s, reason=reason) for key in keys))
        tasks: list[asyncio.Task[int | None] | asyncio.Task[None]] = []
        for watched in self._running.values():
            tasks.append(watched.exit)
            if watched.monitor is not None:
                tasks.append(watched.monitor)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()

    # -- watching ------------------------------------------------------------------------

    def _watch(
        self, record: ShardRecord, process: EngineProcess, oom_at_start: OomCounts | None = None
    ) -> _Watched:
        watched = _Watched(
            record=record,
            process=process,
            exit=_task(process.wait_exit()),
            oom_at_start=oom_at_start,
        )
        self._running[record.key] = watched
        self._report(change_of(record))
        watched.monitor = _task(self._monitor(watched))
        return watched

    async def _monitor(self, watched: _Watched) -> None:
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
                self._transition(watched, ShardState.READY)
                await self._check_liveness(watched)
            elif isinstance(failure, PortHeldElsewhere):
                log.warning("engine_port_held_elsewhere", pid=record.pid, reason=str(failure))
                watched.refusal = str(failure)
                watched.port_held_elsewhere = True
                await self._end(watched)
            else:
                log.error("engine_readiness_failed", pid=record.pid, exc_info=failure)
        exit_code = await asyncio.shield(watched.exit)
        if watched.stopping:
            return
        # Its group is killed already; its workers outside the group are not.
        await asyncio.to_thread(end_remains, watched.record)
        searched = self._tail(watched.record.key, REASON_TAIL_LINES)
        tail = searched[-LOG_TAIL_LINES:]
        error = watched.refusal or await self._exit_error(watched, exit_code, searched)
        self._transition(
            watched,
            ShardState.FAILED,
            error=error,
            exit_code=exit_code,
            log_tail=tail,
            port_held_elsewhere=watched.port_held_elsewhere,
        )
        self._running.pop(watched.record.key, None)
        self._records.remove(watched.record.key)
        self._remember_failed(watched.record, error)

    async def _check_liveness(self, watched: _Watched) -> None:
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
        await self._end(watched)

    async def _end(self, watched: _Watched) -> None:
        """Send the engine's group its stop signal (and SIGCONT, ``ask_to_stop``), SIGKILL it
        after ``REFUSED_GRACE_S``."""
        if not ask_to_stop(watched.process, profile_of(watched.record.engine).stop_signal):
            return
        try:
            await asyncio.wait_for(asyncio.shield(watched.exit), REFUSED_GRACE_S)
        except TimeoutError:
            watched.process.signal_group(signal.SIGKILL)

    async def _exit_error(
        self, watched: _Watched, exit_code: int | None, log_tail: tuple[str, ...]
    ) -> str:
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

    async def _terminate(self, watched: _Watched, grace_s: float) -> int | None:
        """End the engine: its process group, and its workers in sessions or groups of their
        own (found while the leader still runs: once it is gone they are re-parented).
        Returns once none of its processes runs, or ``KILL_WAIT_S`` after SIGKILL."""
        watched.stopping = True
        if watched.monitor is not None:
            watched.monitor.cancel()
        pid = watched.record.pid
        outside = (
            await asyncio.to_thread(outside_group, pid) if is_same_process(watched.record) else {}
        )
        exit_code = await self._signal_until_exit(watched, grace_s, outside)
        signal_each(outside, signal.SIGKILL)
        left = await wait_until_gone(pid, outside, KILL_WAIT_S)
        if left:
            log.error("engine_processes_survived_sigkill", pid=pid, left=left)
        return exit_code

    async def _signal_until_exit(
        self, watched: _Watched, grace_s: float, outside: dict[int, int]
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

    # -- reporting -----------------------------------------------------------------------

    def _transition(
        self,
        watched: _Watched,
        target: ShardState,
        *,
        error: str | None = None,
        exit_code: int | None = None,
        log_tail: tuple[str, ...] = (),
        port_held_elsewhere: bool = False,
    ) -> None:
        if not can_transition(watched.record.state, target):
            return
        watched.record = msgspec.structs.replace(watched.record, state=target)
        if target is ShardState.READY:
            self._save_state(watched.record)
        change = change_of(watched.record, error=error, exit_code=exit_code, log_tail=log_tail)
        if port_held_elsewhere:
            change = msgspec.structs.replace(change, port_held_elsewhere=True)
        self._report(change)

    def _save_state(self, record: ShardRecord) -> None:
        """Save the new state of an engine already recorded. A write that fails (a full
        disk) is logged and no more: the record on disk still names the same process, only
        its state is old, and ``reattach`` sets that again anyway. It must not stop the
        engine from being watched and reported."""
        try:
            self._records.save(record)
        except OSError as exc:
            log.warning(
                "shard_record_not_saved",
                pid=record.pid,
                state=record.state.value,
                error=str(exc),
            )

    def _launch_failed(self, spec: ShardSpec, error: str) -> EngineLaunchError:
        self._report(
            ShardChange(
                replica_id=spec.replica_id,
                shard_index=spec.shard_index,
                state=ShardState.FAILED,
                model=spec.model,
                port=spec.port,
                error=error,
                log_tail=self._tail(spec.key),
            )
        )
        return EngineLaunchError(error)

    def _report(self, change: ShardChange) -> None:
        try:
            self._on_change(change)
        except Exception:
            # A failing listener must not stop the supervisor from watching its engines.
            log.exception("shard_change_listener_failed", change=change)

    def _tail(self, key: ShardKey, lines: int = LOG_TAIL_LINES) -> tuple[str, ...]:
        return tuple(read_log_tail(self.log_path(key), lines))

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the engine supervisor has been shut down")


def read_oom_counts(pid: int) -> OomCounts:
    """The OOM kills counted now in the memory cgroup of process ``pid`` and on the whole
    machine: the one place the supervisor reads the kernel's counters
    (``agent.engines.oom``). Unreadable files count as unknown."""
    proc_cgroup = _read_small(Path(f"/proc/{pid}/cgroup")) or ""
    mounts = _read_small(Path("/proc/self/mounts")) or ""
    at_start = OomCounts(cgroup_file=None, cgroup=None, in_cgroup=None, on_machine=None)
    for counter_file, cgroup in oom_counter_files(proc_cgroup, mounts):
        text = _read_small(counter_file)
        in_cgroup = None if text is None else oom_kills(text)
        if in_cgroup is not None:
            at_start = OomCounts(counter_file, cgroup, in_cgroup, None)
            break
    system = _read_small(SYSTEM_COUNTERS)
    return at_start._replace(on_machine=None if system is None else oom_kills(system))


def read_oom_kills(counts: OomCounts) -> tuple[int | None, int | None]:
    """The OOM kills counted now in the cgroup ``counts`` names, and on the machine."""
    in_cgroup = None
    if counts.cgroup_file is not None:
        text = _read_small(counts.cgroup_file)
        in_cgroup = None if text is None else oom_kills(text)
    text = _read_small(SYSTEM_COUNTERS)
    return in_cgroup, None if text is None else oom_kills(text)


def _read_small(path: Path) -> str | None:
    """A file of /proc or /sys, None if it is absent or unreadable."""
    try:
        with path.open("rb") as file:
            return file.read(MAX_COUNTER_FILE_BYTES).decode("utf-8", "replace")
    except OSError:
        return None


def _with_log_reason(why: str, record: ShardRecord, log_tail: tuple[str, ...]) -> str:
    """``why``, followed by the reason the engine's log gives, if a line of it matches one
    of its profile's failure patterns (``wire.engines.failure_reason``)."""
    reason = failure_reason(profile_of(record.engine), log_tail)
    return why if reason is None else f"{why}: {reason}"


def _check_runs_as_asked(record: ShardRecord, spec: ShardSpec) -> None:
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


def _task(coroutine: Coroutine[object, object, T]) -> asyncio.Task[T]:
    task = asyncio.create_task(coroutine)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("engine_watch_failed", exc_info=task.exception())
