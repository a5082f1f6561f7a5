"""GPUs that appear after the agent connected reach the control plane without a restart.

The control plane takes a node's GPUs from its hello only. An agent whose first snapshot
fails (NVML not ready at boot) says hello with no GPU; once its GPU source lists them, it
closes the connection and says hello again, over a real hub and TLS."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from agent.config import AgentConfig
from agent.config_values import parse_server
from agent.connection import Backoff, stay_connected
from agent.gpus import GpuSnapshot, GpuStatus
from agent.refusal_advice import NodeClaim
from agent.runtime import AgentRuntime
from app.domain.reports import AgentConnected, AgentReport
from app.hub.hub import AgentHub
from tests.support.hub import ENGINE_ADDRESS, LOOPBACK, Pki, new_node_id, pki
from tests.support.waiting import wait_until

__all__ = ["pki"]  # the fixture, from tests.support.hub


class Reports:
    """What a hub hands on: every report, in order."""

    def __init__(self) -> None:
        self.seen: list[AgentReport] = []

    async def handle(self, report: AgentReport) -> None:
        self.seen.append(report)

    def hellos(self) -> list[AgentConnected]:
        return [report for report in self.seen if isinstance(report, AgentConnected)]


class LateGpus:
    """A GPU source that fails, as NVML does before the driver is up, until ``ready``."""

    def __init__(self) -> None:
        self.ready = False

    def snapshot(self) -> GpuSnapshot:
        if not self.ready:
            raise RuntimeError("NVML Shared Library Not Found")
        return GpuSnapshot(
            gpus=tuple(
                GpuStatus(
                    index=index,
                    uuid=f"GPU-late-{index}",
                    name="llmgw fake GPU 80GB",
                    memory_total_mib=81920,
                    memory_used_mib=0,
                )
                for index in range(2)
            )
        )

    def close(self) -> None:
        pass


def a_config(state_dir: Path, node_id: str, hub: AgentHub) -> AgentConfig:
    return AgentConfig(
        servers=(parse_server(f"wss://{LOOPBACK}:{hub.port}"),),
        node_id=node_id,
        cert=state_dir / "node.crt",
        key=state_dir / "node.key",
        ca=state_dir / "ca.crt",
        fake_gpus=None,
        state_dir=state_dir,
        labels={},
        address=ENGINE_ADDRESS,
        port_range=(20000, 20999),
        log_level="info",
    )


@contextlib.asynccontextmanager
async def a_hub(pki: Pki) -> AsyncIterator[tuple[AgentHub, Reports]]:
    reports = Reports()
    hub = AgentHub(reports, pki.server_context(), heartbeat_interval_s=1.0, server_id="hub")
    await hub.start(LOOPBACK, 0)
    try:
        yield hub, reports
    finally:
        await hub.stop()


async def test_gpus_listed_after_a_failed_first_snapshot_reach_the_control_plane(
    pki: Pki, tmp_path: Path
) -> None:
    node_id = new_node_id()
    source = LateGpus()
    async with a_hub(pki) as (hub, reports):
        config = a_config(tmp_path, node_id, hub)
        runtime = AgentRuntime(config, source, gpu_poll_interval_s=0.05)
        await runtime.start()
        tasks = [
            asyncio.create_task(runtime.watch_gpus()),
            asyncio.create_task(
                stay_connected(
                    config.servers,
                    pki.node(node_id),
                    runtime.serve,
                    node=NodeClaim(node_id),
                    backoff=Backoff(0.05),
                )
            ),
        ]
        try:
            await wait_until(lambda: bool(reports.hellos()), what="the first hello")
            assert reports.hellos()[0].inventory.gpus == ()

            source.ready = True
            await wait_until(
                lambda: len(reports.hellos()[-1].inventory.gpus) == 2,
                what="a hello listing the 2 GPUs",
            )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await runtime.close()

    hellos = reports.hellos()
    assert [gpu.uuid for gpu in hellos[-1].inventory.gpus] == ["GPU-late-0", "GPU-late-1"]
    assert len(hellos) == 2, "one reconnect, not one per poll"
