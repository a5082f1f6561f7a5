"""A GPU listing with one index or one UUID twice is corrected before any hello says it:
the control plane refuses such a hello, and the node could not connect until the agent
restarted. The GPU source is built never to list one twice; this is the last defence."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from structlog.testing import capture_logs

from agent.gpu_duplicates import DUPLICATE_UUID_REASON, without_duplicate_gpus
from agent.reports import MAX_GPU_UUID_BYTES, wire_uuid
from agent.runtime import AgentRuntime
from app.hub.claims import inventory_refusal
from tests.unit.test_agent_vanished_gpus import ScriptedGpus, a_config, a_gpu, hello_of, listed

LOST = "GPU is lost: NVML nvmlDeviceGetUUID answered 'GPU is lost'"


async def test_a_uuid_listed_twice_goes_out_once_with_a_warning(tmp_path: Path) -> None:
    """GPU 1, lost, is listed as last read: as GPU-b, which GPU 0 answers now. GPU 0 keeps
    GPU-b; GPU 1 goes out without a UUID, and the hello is one the control plane takes."""
    lost = replace(a_gpu(1, "GPU-b"), healthy=False, unhealthy_reason=LOST)
    source = ScriptedGpus(a_gpu(0, "GPU-b"), lost)
    runtime = AgentRuntime(a_config(tmp_path), source)
    try:
        with capture_logs() as logs:
            await runtime.start()
            await runtime.refresh_gpus()
        hello = await hello_of(runtime)
    finally:
        await runtime.close()

    assert inventory_refusal(hello) is None
    assert listed(hello) == [(0, "GPU-b", True, None), (1, "", False, LOST)]
    [warning] = [line for line in logs if line["event"] == "duplicate_gpu_corrected"]
    assert warning["log_level"] == "warning"
    assert (warning["gpu"], warning["uuid"], warning["shared"]) == (1, "GPU-b", "uuid")
    assert (warning["with_gpu"], warning["outcome"]) == (0, "without its UUID")


async def test_an_index_listed_twice_goes_out_once(tmp_path: Path) -> None:
    source = ScriptedGpus(a_gpu(0, "GPU-a"), a_gpu(1, "GPU-b"), a_gpu(1, "GPU-c"))
    runtime = AgentRuntime(a_config(tmp_path), source)
    try:
        with capture_logs() as logs:
            await runtime.start()
        hello = await hello_of(runtime)
    finally:
        await runtime.close()

    assert inventory_refusal(hello) is None
    assert listed(hello) == [(0, "GPU-a", True, None), (1, "GPU-b", True, None)]
    [warning] = [line for line in logs if line["event"] == "duplicate_gpu_corrected"]
    assert (warning["gpu"], warning["uuid"], warning["outcome"]) == (1, "GPU-c", "left out")


def test_the_gpu_that_answers_keeps_the_uuid_wherever_it_is_listed() -> None:
    lost = replace(a_gpu(0, "GPU-b"), healthy=False, unhealthy_reason=LOST)

    gpus, [duplicate] = without_duplicate_gpus([lost, a_gpu(1, "GPU-b")])

    assert [(gpu.index, gpu.uuid, gpu.unhealthy_reason) for gpu in gpus] == [
        (0, "", LOST),
        (1, "GPU-b", None),
    ]
    assert (duplicate.gpu.index, duplicate.kept.index) == (0, 1)


def test_of_two_healthy_gpus_with_one_uuid_the_second_is_unhealthy_without_it() -> None:
    gpus, _ = without_duplicate_gpus([a_gpu(0, "GPU-b"), a_gpu(1, "GPU-b")])

    assert [(gpu.index, gpu.uuid, gpu.healthy, gpu.unhealthy_reason) for gpu in gpus] == [
        (0, "GPU-b", True, None),
        (1, "", False, DUPLICATE_UUID_REASON),
    ]


def test_a_gpu_listed_now_keeps_its_index_over_a_vanished_one() -> None:
    vanished = replace(a_gpu(1, "GPU-b"), healthy=False, listed=False)

    gpus, _ = without_duplicate_gpus([a_gpu(0, "GPU-a"), vanished, a_gpu(1, "GPU-c")])

    assert [(gpu.index, gpu.uuid) for gpu in gpus] == [(0, "GPU-a"), (1, "GPU-c")]


def test_uuids_are_told_apart_as_the_hello_carries_them() -> None:
    """The hello cuts a UUID to its bytes; two that differ only past the cut are one there."""
    long = "GPU-" + "f" * MAX_GPU_UUID_BYTES

    gpus, _ = without_duplicate_gpus([a_gpu(0, long + "1"), a_gpu(1, long + "2")])

    assert [gpu.uuid for gpu in gpus] == [long + "1", ""]


def test_a_uuid_holding_a_control_character_is_listed_as_the_wire_takes_it() -> None:
    """The control plane refuses a hello whose GPU UUID holds a control character; a driver
    that reports one still leaves the node able to connect, the character as U+FFFD."""
    assert wire_uuid("GPU-\x1b[2J\x00-0") == "GPU-\ufffd[2J\ufffd-0"


def test_gpus_never_read_share_their_empty_uuid_and_nothing_changes() -> None:
    gpus = (a_gpu(0, ""), a_gpu(1, ""), a_gpu(2, "GPU-c"))

    assert without_duplicate_gpus(gpus) == (gpus, ())


def test_one_gpu_listed_twice_goes_out_once() -> None:
    gpu = a_gpu(0, "GPU-a")

    gpus, [duplicate] = without_duplicate_gpus([gpu, gpu])

    assert gpus == (gpu,)
    assert (duplicate.shared, duplicate.outcome) == ("index", "left out")
