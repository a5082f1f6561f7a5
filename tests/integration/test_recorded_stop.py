"""``stop-engines``' stop of recorded engines signals only a process that is still the
recorded engine, checked right before each signal: an engine that replaced itself with
another program (``exec``: same pid, same start time, no launch token) while it was asked to
stop is no longer the engine, is not killed, and is reported gone."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.engines.identity import is_recorded_engine
from agent.engines.recorded_stop import stop_recorded_engines
from agent.engines.records import (
    RecordStore,
    ShardRecord,
    ShardState,
    is_same_process,
    read_proc_stat,
)
from tests.support.waiting import wait_until
from wire.engine_env import LAUNCH_TOKEN_VARIABLE

GRACE_S = 0.5

BECOMES_ANOTHER_PROGRAM = """
import os, signal, sys, time
sleep = sys.argv[2]
def become_another_program(signum, frame):
    os.execve(sleep, [sleep, "600"], {})
signal.signal(signal.SIGTERM, become_another_program)
open(sys.argv[1], "w").close()
while True:
    time.sleep(1)
"""
"""An engine that, asked to stop, replaces itself with ``sleep`` without its environment."""


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    token = uuid.uuid4().hex
    ready = tmp_path / "ready"
    sleep = shutil.which("sleep")
    assert sleep is not None
    process = subprocess.Popen(
        [sys.executable, "-c", BECOMES_ANOTHER_PROGRAM, str(ready), sleep],
        env={**os.environ, LAUNCH_TOKEN_VARIABLE: token},
        start_new_session=True,
    )
    try:
        yield process, token, ready
    finally:
        process.kill()
        process.wait()


async def test_an_engine_that_became_another_program_is_not_killed_and_is_reported_gone(
    tmp_path: Path, engine: tuple[subprocess.Popen[bytes], str, Path]
) -> None:
    process, token, ready = engine
    await wait_until(ready.exists, within_s=10, what="the engine ready for SIGTERM")
    stat = read_proc_stat(process.pid)
    assert stat is not None
    record = ShardRecord(
        replica_id="sim-1",
        shard_index=0,
        model="sim",
        port=20000,
        gpus=(0,),
        command=(sys.executable,),
        log_path=str(tmp_path / "engine.log"),
        started_at=datetime.now(UTC),
        pid=process.pid,
        process_start_time=stat.start_time,
        state=ShardState.READY,
        launch_token=token,
    )
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    RecordStore(state_dir).save(record)
    assert is_recorded_engine(record)

    stops = await asyncio.to_thread(stop_recorded_engines, state_dir, GRACE_S)

    assert [(stop.record.key, stop.outcome) for stop in stops] == [(record.key, "gone")]
    assert process.poll() is None, "the program the engine became was killed"
    assert is_same_process(record)
    assert not is_recorded_engine(record)
