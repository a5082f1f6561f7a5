"""open_gpu_source picks fake GPUs when declared and NVML otherwise."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from agent.gpus import FakeGpuSource, NvmlGpuSource, open_gpu_source, parse_fake_gpus
from agent.gpus.fake_health import mark_fake_gpu


def machine_has_nvidia_driver() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_a_fake_spec_gives_fake_gpus_seeded_by_the_node(tmp_path: Path) -> None:
    health = tmp_path / "health.json"
    source = open_gpu_source("2x24GB", health, node_seed="gpu-7")

    mark_fake_gpu(health, 1, "XID 92: high single-bit ECC error rate")
    snapshot = source.snapshot()
    source.close()

    assert isinstance(source, FakeGpuSource)
    assert [gpu.uuid for gpu in snapshot.gpus] == [
        gpu.uuid for gpu in parse_fake_gpus("2x24GB", seed="gpu-7")
    ]
    assert [gpu.healthy for gpu in snapshot.gpus] == [True, False]


def test_a_bad_fake_spec_fails_at_once() -> None:
    with pytest.raises(ValueError, match="COUNTxSIZE"):
        open_gpu_source("8xH100", None, node_seed="gpu-7")


@pytest.mark.skipif(machine_has_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_without_a_spec_real_nvml_on_a_machine_without_the_driver_reports_no_gpus() -> None:
    source = open_gpu_source(None, None, node_seed="gpu-7")

    snapshot = source.snapshot()
    source.close()

    assert isinstance(source, NvmlGpuSource)
    assert snapshot.gpus == ()
    assert snapshot.unavailable_reason is not None
    assert snapshot.unavailable_reason.startswith("no NVML: no GPUs discovered")
