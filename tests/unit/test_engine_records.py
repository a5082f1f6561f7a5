"""Shard records: what a restarted agent reads to find its engines again."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import msgspec
from structlog.testing import capture_logs

from agent.engines.records import (
    EngineLaunch,
    LaunchRecord,
    RecordStore,
    ShardKey,
    ShardRecord,
    ShardState,
    is_same_process,
    parse_proc_stat,
    process_identity,
    shard_file_stem,
)
from tests.support.failing_disk import FailingDisk


def a_record(**changes: object) -> ShardRecord:
    record = ShardRecord(
        replica_id="llama-8b-3",
        shard_index=1,
        model="llama-8b",
        port=20017,
        gpus=(0, 1),
        command=("vllm", "serve", "meta-llama/Llama-3.1-8B", "--port", "20017"),
        pid=4242,
        process_start_time=123456,
        log_path="/var/lib/llmgw-agent/logs/llama-8b-3-1.log",
        started_at=datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
        state=ShardState.READY,
    )
    return msgspec.structs.replace(record, **changes)


def a_launch() -> LaunchRecord:
    record = a_record()
    return LaunchRecord(
        replica_id=record.replica_id,
        shard_index=record.shard_index,
        model=record.model,
        port=record.port,
        gpus=record.gpus,
        command=record.command,
        log_path=record.log_path,
        started_at=record.started_at,
        token="5f0c",
    )


def test_a_spawned_record_carries_every_field_of_its_launch() -> None:
    launch = msgspec.structs.replace(
        a_launch(), engine="llamacpp", boot_id="8c1e2f3a-59d4-4d8e-9b1a-3f0e6c7d2b10"
    )
    fields = msgspec.structs.fields(EngineLaunch)
    left_at_default = [
        field.name
        for field in fields
        if field.default is not msgspec.NODEFAULT and getattr(launch, field.name) == field.default
    ]
    assert left_at_default == [], "give the launch a value of its own for each of these"

    record = launch.spawned(4242, 123456, ShardState.STARTING)

    assert {field.name: getattr(record, field.name) for field in fields} == {
        field.name: getattr(launch, field.name) for field in fields
    }
    assert (record.pid, record.process_start_time, record.state, record.launch_token) == (
        4242,
        123456,
        ShardState.STARTING,
        "5f0c",
    )


def test_a_saved_record_reads_back_equal(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    record = a_record()

    store.save(record)

    assert store.load_all() == [record]
    assert [path.name for path in (tmp_path / "shards").iterdir()] == ["llama-8b-3-1.json"]


def test_records_are_for_the_agents_user_alone(tmp_path: Path) -> None:
    """A record holds the engine's command and its launch token: under a umask of 022 they
    were 0644, for every local user to read."""
    store = RecordStore(tmp_path)
    umask = os.umask(0o022)
    try:
        store.save(a_record())
        store.save(a_record())  # replaced, not reused
    finally:
        os.umask(umask)

    [path] = (tmp_path / "shards").iterdir()
    assert path.stat().st_mode & 0o777 == 0o600


def test_saving_again_replaces_the_record(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.save(a_record(state=ShardState.STARTING))

    store.save(a_record(state=ShardState.READY))

    assert [record.state for record in store.load_all()] == [ShardState.READY]


def test_a_removed_record_is_gone_and_removing_twice_is_harmless(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.save(a_record())

    store.remove(ShardKey("llama-8b-3", 1))
    store.remove(ShardKey("llama-8b-3", 1))

    assert store.load_all() == []


def test_a_record_a_read_only_disk_keeps_is_logged_with_its_path_and_errno(
    tmp_path: Path,
) -> None:
    disk = FailingDisk()
    store = RecordStore(tmp_path, unlink=disk.unlink)
    store.save(a_record())
    disk.remounted_read_only()

    with capture_logs() as logs:
        store.remove(ShardKey("llama-8b-3", 1))

    assert logs == [
        {
            "event": "shard_record_not_removed",
            "log_level": "warning",
            "path": str(tmp_path / "shards" / "llama-8b-3-1.json"),
            "errno": "EROFS",
            "error": "Read-only file system",
        }
    ]
    assert store.load_all() == [a_record()]


def test_a_record_left_by_a_failing_disk_is_removed_by_the_next_change_once_it_can_be(
    tmp_path: Path,
) -> None:
    disk = FailingDisk()
    store = RecordStore(tmp_path, unlink=disk.unlink)
    store.save(a_record())
    store.save_launch(a_launch())
    disk.failing_with_eio()
    store.remove(ShardKey("llama-8b-3", 1))
    with capture_logs() as still_failing:
        store.remove_launch(ShardKey("llama-8b-3", 1))
        store.remove(ShardKey("llama-8b-3", 1))
    disk.repaired()

    with capture_logs() as logs:
        store.save(a_record(replica_id="other-1"))

    assert [entry["path"] for entry in still_failing] == [
        str(tmp_path / "shards" / "llama-8b-3-1.launch")
    ]
    assert store.load_all() == [a_record(replica_id="other-1")]
    assert store.load_launches() == []
    assert sorted(entry["path"] for entry in logs) == [
        str(tmp_path / "shards" / "llama-8b-3-1.json"),
        str(tmp_path / "shards" / "llama-8b-3-1.launch"),
    ]
    assert {entry["event"] for entry in logs} == {"shard_record_removed_late"}


def test_a_record_saved_again_after_its_removal_failed_is_kept(tmp_path: Path) -> None:
    disk = FailingDisk()
    store = RecordStore(tmp_path, unlink=disk.unlink)
    store.save(a_record(state=ShardState.STARTING))
    disk.remounted_read_only()
    store.remove(ShardKey("llama-8b-3", 1))
    disk.repaired()

    store.save(a_record(state=ShardState.READY))  # the shard started again
    store.remove(ShardKey("other-1", 0))

    assert store.load_all() == [a_record(state=ShardState.READY)]


def test_an_unreadable_record_is_skipped(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.save(a_record())
    (tmp_path / "shards" / "torn-0.json").write_bytes(b'{"replica_id": "tor')

    assert store.load_all() == [a_record()]


def test_replica_ids_that_are_not_file_names_are_escaped() -> None:
    assert shard_file_stem(ShardKey("org/model-1", 0)) == "org%2Fmodel-1-0"
    assert shard_file_stem(ShardKey("qwen2.5-7b-12", 3)) == "qwen2.5-7b-12-3"


def test_the_start_time_is_field_22_even_when_the_name_has_spaces_and_parens() -> None:
    fields_after_name = ["S", *[str(n) for n in range(4, 22)], "987654", "0", "0"]
    text = f"4242 (python3 (x) y) {' '.join(fields_after_name)}\n"

    assert parse_proc_stat(text) == ("S", 987654)


def test_the_running_process_is_itself() -> None:
    start_time = process_identity(os.getpid())
    assert start_time is not None

    assert is_same_process(a_record(pid=os.getpid(), process_start_time=start_time))


def test_a_reused_pid_is_not_the_recorded_process() -> None:
    start_time = process_identity(os.getpid())
    assert start_time is not None

    assert not is_same_process(a_record(pid=os.getpid(), process_start_time=start_time - 1))


def test_a_pid_that_does_not_exist_is_not_the_recorded_process() -> None:
    beyond_any_pid_max = 2**22 + 1

    assert process_identity(beyond_any_pid_max) is None
    assert not is_same_process(a_record(pid=beyond_any_pid_max))


def test_a_record_written_before_engine_profiles_reads_as_the_default_engine(
    tmp_path: Path,
) -> None:
    store = RecordStore(tmp_path)
    store.save(a_record(engine="llamacpp"))
    [path] = (tmp_path / "shards").iterdir()
    older = msgspec.json.decode(path.read_bytes())
    del older["engine"]
    path.write_bytes(msgspec.json.encode(older))

    [record] = store.load_all()

    assert record.engine == "vllm"
    assert record == a_record()


def test_a_record_that_is_not_a_regular_file_is_skipped_unread_and_logged(
    tmp_path: Path,
) -> None:
    store = RecordStore(tmp_path)
    store.save(a_record())
    os.mkfifo(tmp_path / "shards" / "fifo-0.json")
    (tmp_path / "shards" / "folder-0.json").mkdir()

    with capture_logs() as logs:
        assert store.load_all() == [a_record()]

    assert [(entry["path"], entry["error"]) for entry in logs] == [
        (str(tmp_path / "shards" / "fifo-0.json"), "not a regular file but a named pipe (FIFO)"),
        (str(tmp_path / "shards" / "folder-0.json"), "not a regular file but a directory"),
    ]
