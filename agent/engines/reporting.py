"""What the supervisor tells of its shards, and the files that back what it tells.

Every state change goes to the ``on_change`` callback (a failing listener is logged, never
raised: it must not stop the watching), a state reached is saved in the shard's record,
and a failure carries the tail of the engine's log. Launching, watching, adoption and
stopping all report, so this is the one place that does it, with the one place that names
an engine's log file (``log_path``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import structlog

from agent.engines.changes import LOG_TAIL_LINES, ShardChange, can_transition, change_of
from agent.engines.errors import EngineLaunchError
from agent.engines.logtail import read_log_tail
from agent.engines.records import RecordStore, ShardKey, ShardRecord, ShardState, shard_file_stem
from agent.engines.spec import ShardSpec
from agent.engines.watched import Watched

log = structlog.get_logger(__name__)


class ShardReporter:
    def __init__(
        self, on_change: Callable[[ShardChange], None], records: RecordStore, logs_dir: Path
    ) -> None:
        self._on_change = on_change
        self._records = records
        self.logs_dir = logs_dir

    def report(self, change: ShardChange) -> None:
        try:
            self._on_change(change)
        except Exception:
            # A failing listener must not stop the supervisor from watching its engines.
            log.exception("shard_change_listener_failed", change=change)

    def transition(
        self,
        watched: Watched,
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
            self.save_state(watched.record)
        change = change_of(watched.record, error=error, exit_code=exit_code, log_tail=log_tail)
        if port_held_elsewhere:
            change = msgspec.structs.replace(change, port_held_elsewhere=True)
        self.report(change)

    def save_state(self, record: ShardRecord) -> None:
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

    def launch_failed(self, spec: ShardSpec, error: str) -> EngineLaunchError:
        """Report the shard ``failed`` with ``error``; the error to raise."""
        self.report(
            ShardChange(
                replica_id=spec.replica_id,
                shard_index=spec.shard_index,
                state=ShardState.FAILED,
                model=spec.model,
                port=spec.port,
                error=error,
                log_tail=self.tail(spec.key),
            )
        )
        return EngineLaunchError(error)

    def log_path(self, key: ShardKey) -> Path:
        return self.logs_dir / f"{shard_file_stem(key)}.log"

    def tail(self, key: ShardKey, lines: int = LOG_TAIL_LINES) -> tuple[str, ...]:
        return tuple(read_log_tail(self.log_path(key), lines))
