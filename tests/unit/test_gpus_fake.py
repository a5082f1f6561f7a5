"""Fake GPUs: declared on the command line, marked unhealthy through a file."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.gpus.fake import FakeGpuSource, parse_fake_gpus
from agent.gpus.fake_health import mark_fake_gpu
from agent.gpus.xid import XidClass

UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def fixed_now() -> datetime:
    return datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "count", "mib", "name"),
    [
        ("4x80GB", 4, 81920, "llmgw fake GPU 80GB"),
        ("2x24GB", 2, 24576, "llmgw fake GPU 24GB"),
        ("1x40GiB", 1, 40960, "llmgw fake GPU 40GiB"),
        ("3x512MiB", 3, 512, "llmgw fake GPU 512MiB"),
        (" 2 x 24gb ", 2, 24576, "llmgw fake GPU 24GB"),
    ],
)
def test_a_spec_declares_count_gpus_of_size(spec: str, count: int, mib: int, name: str) -> None:
    gpus = parse_fake_gpus(spec)

    assert [gpu.index for gpu in gpus] == list(range(count))
    assert {(gpu.memory_total_mib, gpu.memory_used_mib, gpu.name) for gpu in gpus} == {
        (mib, 0, name)
    }
    assert all(gpu.healthy and gpu.unhealthy_reason is None for gpu in gpus)
    assert all(UUID.fullmatch(gpu.uuid) for gpu in gpus)


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("8xH100", "expected COUNTxSIZE such as '4x80GB'"),
        ("4x80TB", "units GB, GiB or MiB"),
        ("", "expected COUNTxSIZE"),
        ("4 GPUs", "expected COUNTxSIZE"),
        ("0x80GB", "count must be 1 to 64"),
        ("65x80GB", "65 GPUs; a node may report at most 64"),
        ("4x0GB", "memory size must be positive"),
    ],
)
def test_a_bad_spec_is_refused_with_a_clear_message(spec: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=re.escape(complaint)) as refused:
        parse_fake_gpus(spec)

    assert repr(spec) in str(refused.value)


def test_uuids_are_stable_per_node_and_differ_between_nodes() -> None:
    node_a = [gpu.uuid for gpu in parse_fake_gpus("4x80GB", seed="node-a")]

    assert node_a == [gpu.uuid for gpu in parse_fake_gpus("4x80GB", seed="node-a")]
    assert len(set(node_a)) == 4
    assert set(node_a).isdisjoint(gpu.uuid for gpu in parse_fake_gpus("4x80GB", seed="node-b"))


def test_without_a_health_file_every_fake_gpu_is_healthy() -> None:
    gpus = parse_fake_gpus("2x24GB")
    source = FakeGpuSource(gpus)

    snapshot = source.snapshot()

    assert snapshot.gpus == tuple(gpus)
    assert snapshot.xid_events == ()
    assert snapshot.unavailable_reason is None


def test_marking_a_gpu_unhealthy_and_recovering_it_at_run_time(tmp_path: Path) -> None:
    health = tmp_path / "health.json"
    source = FakeGpuSource(parse_fake_gpus("4x80GB", seed="node-a"), health, now=fixed_now)
    healthy = source.snapshot()

    mark_fake_gpu(health, 2, "XID 79: GPU has fallen off the bus")
    fallen = source.snapshot()
    still_fallen = source.snapshot()
    mark_fake_gpu(health, 2, None)
    recovered = source.snapshot()

    assert all(gpu.healthy for gpu in healthy.gpus)
    assert [gpu.index for gpu in fallen.gpus if not gpu.healthy] == [2]
    assert fallen.gpus[2].unhealthy_reason == "XID 79: GPU has fallen off the bus"
    assert fallen.gpus[2].xid == 79
    (event,) = fallen.xid_events
    assert (event.gpu_index, event.xid, event.classification, event.at) == (
        2,
        79,
        XidClass.HARDWARE,
        fixed_now(),
    )
    assert still_fallen.xid_events == (), "the XID is reported once"
    assert not still_fallen.gpus[2].healthy
    assert recovered.gpus == healthy.gpus
    assert recovered.xid_events == ()


def test_a_reason_without_an_xid_marks_the_gpu_but_reports_no_event(tmp_path: Path) -> None:
    health = tmp_path / "health.json"
    source = FakeGpuSource(parse_fake_gpus("2x24GB"), health)

    mark_fake_gpu(health, 0, "fan failure reported by the BMC")
    snapshot = source.snapshot()

    assert snapshot.gpus[0].unhealthy_reason == "fan failure reported by the BMC"
    assert snapshot.gpus[0].xid is None
    assert snapshot.xid_events == ()


def test_marks_accumulate_and_are_written_atomically(tmp_path: Path) -> None:
    health = tmp_path / "state" / "health.json"

    mark_fake_gpu(health, 3, "XID 48: double-bit ECC error")
    mark_fake_gpu(health, 1, "XID 94: contained ECC error")

    assert json.loads(health.read_text(encoding="utf-8")) == {
        "1": "XID 94: contained ECC error",
        "3": "XID 48: double-bit ECC error",
    }
    assert {path.name for path in health.parent.iterdir()} == {"health.json", ".health.json.lock"}


def test_an_operator_can_write_the_file_by_hand(tmp_path: Path) -> None:
    health = tmp_path / "health.json"
    source = FakeGpuSource(parse_fake_gpus("2x24GB"), health)

    health.write_text('{"1": "XID 48: double-bit ECC error"}', encoding="utf-8")

    assert [gpu.healthy for gpu in source.snapshot().gpus] == [True, False]


def test_an_empty_reason_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="the reason is empty"):
        mark_fake_gpu(tmp_path / "health.json", 0, "")


def test_an_xid_the_table_calls_an_application_fault_is_reported_but_keeps_the_gpu_healthy(
    tmp_path: Path,
) -> None:
    """As NVML would: XID 13 (a bad access in a CUDA kernel) is the application's fault, so
    the source reports it once and the GPU stays in service."""
    health = tmp_path / "health.json"
    source = FakeGpuSource(parse_fake_gpus("2x24GB", seed="node-a"), health, now=fixed_now)
    clean = source.snapshot()

    mark_fake_gpu(health, 1, "XID 13: graphics engine exception")
    faulted = source.snapshot()
    later = source.snapshot()

    (event,) = faulted.xid_events
    assert (event.gpu_index, event.xid, event.classification, event.marks_unhealthy) == (
        1,
        13,
        XidClass.APPLICATION,
        False,
    )
    assert faulted.gpus == clean.gpus, "an application XID leaves the GPU healthy"
    assert later.xid_events == (), "the XID is reported once"
    assert later.gpus == clean.gpus
