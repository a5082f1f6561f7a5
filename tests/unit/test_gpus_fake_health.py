"""A fake GPU health file is hostile input: whatever it holds, the node keeps its GPUs,
marks refuse what the node lacks, and clearing always recovers the file."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.command_line import EXIT_OK, EXIT_USAGE
from agent.gpus import FakeGpuSource, mark_fake_gpu, open_gpu_source, parse_fake_gpus
from agent.main import app

XID_79 = "XID 79: GPU has fallen off the bus"


def two_gpus(health: Path) -> FakeGpuSource:
    return FakeGpuSource(parse_fake_gpus("2x24GB", seed="node-a"), health)


def unhealthy(source: FakeGpuSource) -> dict[int, str | None]:
    snapshot = source.snapshot()
    assert [gpu.index for gpu in snapshot.gpus] == [0, 1], "the node keeps both GPUs"
    return {gpu.index: gpu.unhealthy_reason for gpu in snapshot.gpus if not gpu.healthy}


def test_a_mark_for_a_gpu_the_node_lacks_costs_that_entry_only_with_one_warning(
    tmp_path: Path,
) -> None:
    health = tmp_path / "health.json"
    health.write_text(json.dumps({"7": XID_79, "1": "XID 48: double-bit ECC error"}))
    source = two_gpus(health)

    with capture_logs() as logs:
        first, second = unhealthy(source), unhealthy(source)

    assert first == second == {1: "XID 48: double-bit ECC error"}
    (warning,) = [entry for entry in logs if entry["log_level"] == "warning"]
    assert warning["event"] == "fake_gpu_health_file_ignored"
    assert "entry '7' ignored: this node has GPUs 0 to 1" in warning["problems"][0]


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '["1"]',
        "[" * 100_000,
        '{"one": "broken", "1": "XID 13"}',
        '{"1": "", "0": 5}',
        '{"-1": "XID 79", "99999999999999999999999": "XID 79"}',
        '{"\u00b2": "superscript two", "\u0663": "arabic-indic three"}',
        json.dumps({"0": "XID 79\x1b[2J\r\nforged log line"}),
        json.dumps({"0": "x" * 1_000_000}),
        '{"0": "' + " " * 200_000 + '"}',
    ],
)
def test_a_hostile_health_file_never_costs_the_node_its_gpus(tmp_path: Path, content: str) -> None:
    health = tmp_path / "health.json"
    health.write_text(content, encoding="utf-8")

    with capture_logs() as logs:
        marked = unhealthy(two_gpus(health))

    assert set(marked) <= {1}, "only a well-formed entry for a GPU the node has counts"
    assert [entry["event"] for entry in logs] == ["fake_gpu_health_file_ignored"]


def test_a_fifo_as_health_file_is_ignored_without_waiting_for_a_writer(tmp_path: Path) -> None:
    health = tmp_path / "health.json"
    os.mkfifo(health)
    done = threading.Event()

    def writer() -> None:
        """Unblocks a reader that opened the FIFO, so such a reader returns to be seen."""
        while not done.is_set():
            try:
                descriptor = os.open(health, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet
                time.sleep(0.01)
                continue
            try:
                os.write(descriptor, b"{}")
            except BrokenPipeError:  # the reader has seen enough and closed it already
                pass
            finally:
                os.close(descriptor)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        with capture_logs() as logs:
            assert unhealthy(two_gpus(health)) == {}
    finally:
        done.set()
        thread.join()

    (warning,) = logs
    assert "is not a regular file" in warning["problems"][0]


def test_an_agent_declares_its_fake_gpus_so_a_mark_beyond_them_is_refused(
    tmp_path: Path,
) -> None:
    health = tmp_path / "fake-gpu-health.json"
    open_gpu_source("2x24GB", health, node_seed="node-a")

    with pytest.raises(ValueError, match=r"--gpu 7: the agent has 2 fake GPU\(s\), indices 0 to 1"):
        mark_fake_gpu(health, 7, XID_79)

    assert not health.exists()


def test_without_a_declaration_a_mark_is_held_to_the_most_fake_gpus_a_node_has(
    tmp_path: Path,
) -> None:
    health = tmp_path / "fake-gpu-health.json"

    mark_fake_gpu(health, 63, XID_79)
    with pytest.raises(ValueError, match="a fake GPU index is 0 to 63"):
        mark_fake_gpu(health, 10**30, XID_79)

    assert json.loads(health.read_text()) == {"63": XID_79}


@pytest.mark.parametrize(
    ("reason", "complaint"),
    [
        ("XID 79\nforged", "control characters"),
        ("x" * 501, "at most 500"),
        ("   ", "empty"),
    ],
)
def test_a_reason_that_a_table_or_log_cannot_show_is_refused(
    tmp_path: Path, reason: str, complaint: str
) -> None:
    health = tmp_path / "fake-gpu-health.json"

    with pytest.raises(ValueError, match=complaint):
        mark_fake_gpu(health, 0, reason)

    assert not health.exists()


def test_mark_refuses_a_gpu_the_agent_did_not_declare_and_clear_recovers_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    health = tmp_path / "fake-gpu-health.json"
    open_gpu_source("2x24GB", health, node_seed="node-a")
    state_dir = ["--state-dir", str(tmp_path)]

    mark = ["fake-gpu", "mark", "--gpu", "7", "--reason", "XID 79", *state_dir]
    refused = app(mark, result_action="return_value")
    health.write_text(json.dumps({"7": XID_79, "1": "XID 13", "x": 1}), encoding="utf-8")
    cleared = app(["fake-gpu", "clear", "--gpu", "7", *state_dir], result_action="return_value")

    assert refused == EXIT_USAGE
    assert cleared == EXIT_OK
    assert json.loads(health.read_text()) == {"1": "XID 13"}
    assert "dropped from the file" in capsys.readouterr().err


def test_clear_rewrites_a_file_that_is_not_json(tmp_path: Path) -> None:
    health = tmp_path / "fake-gpu-health.json"
    health.write_text("{half a", encoding="utf-8")

    clear = ["fake-gpu", "clear", "--gpu", "0", "--state-dir", str(tmp_path)]
    cleared = app(clear, result_action="return_value")

    assert cleared == EXIT_OK
    assert json.loads(health.read_text()) == {}


def test_marks_made_at_once_are_all_kept(tmp_path: Path) -> None:
    health = tmp_path / "fake-gpu-health.json"
    start = threading.Barrier(8)

    def mark_many(first: int) -> None:
        start.wait()
        for index in range(first, 64, 8):
            mark_fake_gpu(health, index, f"XID 79: mark {index}")

    threads = [threading.Thread(target=mark_many, args=(first,)) for first in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(int(key) for key in json.loads(health.read_text())) == list(range(64))
