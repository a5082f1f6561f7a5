"""The largest hello an agent can build fits in one message, and an agent whose hello does
not (shards started by an older agent) says so and stops instead of reconnecting."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import msgspec
import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from agent.config import AgentConfig
from agent.config_values import ServerAddress
from agent.gpu_reports import gpu_report
from agent.gpus import FakeGpuSource, GpuStatus
from agent.reports import json_bytes
from agent.runtime import AgentRuntime, HelloTooLarge, start_refusal
from wire.messages import (
    MAX_GPU_REPORT_BYTES,
    MAX_GPUS_PER_NODE,
    MAX_MESSAGE_BYTES,
    MAX_SHARD_REPORT_BYTES,
    MAX_SHARDS_PER_NODE,
    PROTOCOL_VERSION,
    CloseCode,
    Hello,
    ShardReport,
    StartShard,
    decode_from_agent,
    encode,
)
from wire.version import llmgw_version

WORST = "\x01"
"""The character that costs most as JSON: six bytes, escaped as \\u0001."""
WORST_IN_A_NAME = "\U0001f600"
"""The character that costs most in a name, which holds no control character: four bytes."""


def longest_start(replica_id: str, model: str) -> StartShard:
    return StartShard(
        command_id="c-1",
        replica_id=replica_id,
        shard_index=4095,
        model=model,
        argv=("vllm",),
        gpus=tuple(range(MAX_GPUS_PER_NODE)),
        port=65535,
    )


def gpus(count: int) -> list[GpuStatus]:
    return [
        GpuStatus(
            index=index, uuid=f"GPU-{index}", name="A100", memory_total_mib=1, memory_used_mib=0
        )
        for index in range(count)
    ]


def test_a_start_with_the_longest_ids_the_wire_allows_is_refused() -> None:
    """1,024 such shards would make a hello of megabytes that no control plane reads."""
    command = longest_start("r" * 512, "m" * 1024)

    refusal = start_refusal(command, (1, 65535), gpus(MAX_GPUS_PER_NODE), [])

    assert refusal is not None
    assert refusal.startswith("the replica id and model name would take ")
    assert f"more than the {MAX_SHARD_REPORT_BYTES} a shard may take" in refusal


def test_a_start_with_ordinary_ids_is_not_refused_for_its_size() -> None:
    command = longest_start("llama-3-70b-7f3a2c41-0", "meta-llama/Llama-3.1-70B-Instruct")

    assert start_refusal(command, (1, 65535), gpus(MAX_GPUS_PER_NODE), []) is None


def widest_accepted_report() -> ShardReport:
    """A report of a shard the agent accepts, padded to the most bytes it may take; its
    replica id starts with four digits a test may change to tell shards apart."""
    report = ShardReport(
        replica_id="0000",
        shard_index=4095,
        model=WORST_IN_A_NAME * 10,
        port=65535,
        gpus=tuple(range(4095 - MAX_GPUS_PER_NODE, 4095)),
        pid=2**31 - 1,
        state="starting",
        started_at=datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=timezone(timedelta(hours=-12))),
    )
    room = MAX_SHARD_REPORT_BYTES - json_bytes(report)
    assert room >= 0
    widened = msgspec.structs.replace(report, replica_id=report.replica_id + "r" * room)
    assert json_bytes(widened) == MAX_SHARD_REPORT_BYTES
    command = longest_start(widened.replica_id, widened.model)
    command = msgspec.structs.replace(command, gpus=widened.gpus)
    assert start_refusal(command, (1, 65535), gpus(4095), []) is None
    return widened


def widest_gpu(index: int) -> GpuStatus:
    return GpuStatus(
        index=4095 - index,
        uuid=WORST * 1024,
        name=WORST * 1024,
        memory_total_mib=2**63,
        memory_used_mib=2**63,
        healthy=False,
        unhealthy_reason=WORST * 1024,
    )


def test_the_largest_hello_an_agent_can_build_fits_in_one_message() -> None:
    """The sum behind MAX_SHARD_REPORT_BYTES: the most shards, each as wide as the agent
    lets one be; the most GPUs, each with texts as costly as can be; the longest node id,
    address and labels the wire takes."""
    widest = widest_accepted_report()
    reports = [gpu_report(widest_gpu(index)) for index in range(MAX_GPUS_PER_NODE)]
    assert max(json_bytes(report) for report in reports) <= MAX_GPU_REPORT_BYTES
    hello = Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id=WORST_IN_A_NAME * 512,
        agent_version=llmgw_version(),
        address=WORST_IN_A_NAME * 253,
        labels={f"{n:02d}" + WORST_IN_A_NAME * 61: WORST_IN_A_NAME * 256 for n in range(64)},
        port_range=(65535, 65535),
        gpus=tuple(reports),
        shards=tuple(
            msgspec.structs.replace(widest, replica_id=f"{n:04d}" + widest.replica_id[4:])
            for n in range(MAX_SHARDS_PER_NODE)
        ),
    )

    data = encode(hello)

    assert len(data) <= MAX_MESSAGE_BYTES
    assert decode_from_agent(data) == hello


# -- an agent whose hello is too large anyway --------------------------------------------


class OverfullRuntime(AgentRuntime):
    """Holds shards an older agent started with ids too long for a hello to carry."""

    def _hello(self) -> Hello:
        hello = super()._hello()
        shard = ShardReport(
            replica_id="r" * 512,
            shard_index=0,
            model="m" * 1024,
            port=20001,
            gpus=(0,),
            pid=4242,
            state="ready",
            started_at=datetime(2025, 3, 1, tzinfo=UTC),
        )
        shards = tuple(
            msgspec.structs.replace(shard, replica_id=f"{n:04d}" + "r" * 508)
            for n in range(MAX_SHARDS_PER_NODE)
        )
        return msgspec.structs.replace(hello, shards=shards)


def a_config(state_dir: Path) -> AgentConfig:
    return AgentConfig(
        servers=(ServerAddress("wss://cp:8443", "cp", 8443),),
        node_id="gpu-07",
        cert=state_dir / "node.crt",
        key=state_dir / "node.key",
        ca=state_dir / "ca.crt",
        fake_gpus="1x80GB",
        state_dir=state_dir,
        labels={},
        address="127.0.0.1",
        port_range=(20000, 20999),
        log_level="info",
    )


async def test_an_agent_whose_hello_is_too_large_stops_saying_why(tmp_path: Path) -> None:
    received: list[str | bytes] = []
    closed: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    async def control_plane(websocket: ServerConnection) -> None:
        try:
            async for frame in websocket:
                received.append(frame)
        except ConnectionClosed:
            pass
        finally:
            closed.set_result(websocket.close_code)

    config = a_config(tmp_path)
    runtime = OverfullRuntime(config, FakeGpuSource(gpus(1), None))
    async with asyncio.timeout(30):  # a guard: the agent used to wait for ever
        async with serve(control_plane, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            async with connect(f"ws://127.0.0.1:{port}", max_size=MAX_MESSAGE_BYTES) as websocket:
                with pytest.raises(HelloTooLarge) as raised:
                    await runtime.serve(websocket)
            assert await closed == CloseCode.MESSAGE_TOO_BIG

    assert received == [], "nothing the control plane cannot read was sent"
    assert "over the 1048576-byte message limit" in str(raised.value)
    assert "lists 1024 shards and 1 GPUs" in str(raised.value)
