"""Memory another process takes on a fake GPU after its agent's hello (``llmgw-agent
fake-gpu use``) reaches placement with the agent's heartbeats: the control plane refuses the
GPU and says why (the node's view shows the memory in use it reads), and places on it once
the memory is freed, the agent connected all along."""

from __future__ import annotations

import pytest

from tests.support.cluster import SIMULATOR_COMMAND, Cluster, node_of
from tests.support.fleet import use_fake_gpu_memory
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

NODE = "gpu-a"
MODEL = "sim"
SPEC = {"name": MODEL, "command": SIMULATOR_COMMAND, "gpu_memory_gib": 20}
# 80 GiB (81920 MiB) less 70000 MiB used leaves 11920 MiB: 12 GiB, short of 20.
REFUSED = "needs 1 healthy GPU(s) with 20 GiB free, has 0: GPU 0 has 12 GiB free"


async def test_memory_taken_after_the_hello_refuses_the_gpu_and_freed_makes_it_placeable(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    await cluster.wait_for_leader()
    cluster.start_agent(NODE, fake_gpus="1x80GB")
    await cluster.wait_for_nodes_connected((NODE,))
    state_dir = cluster.directory / f"state-{NODE}"

    assert await use_fake_gpu_memory(state_dir, 0, 70_000) == 0
    reasons: list[object] = []

    async def refused() -> bool:
        answer = await cluster.admin("POST", "/admin/v1/placement", body=SPEC)
        assert isinstance(answer, dict)
        reasons[:] = [c["reasons"] for c in answer["candidates"]]
        return answer["placeable"] is False

    await wait_until(refused, within_s=15.0, every_s=0.2, what="the GPU's memory taken")
    assert reasons == [[REFUSED]]
    node = await cluster.admin("GET", f"/admin/v1/nodes/{NODE}")
    assert isinstance(node, dict)
    (gpu,) = node["gpus"]
    assert (gpu["memory_used_mib"], gpu["memory_free_mib"]) == (70_000, 11_920)
    await cluster.apply_simulated_model(MODEL, replicas=1, gpu_memory_gib=20)
    unplaceable = await cluster.wait_for_event("model_unplaceable")
    assert "1 not enough healthy free GPUs" in str(unplaceable.get("reason"))
    assert await cluster.replicas(model=MODEL) == []

    assert await use_fake_gpu_memory(state_dir, 0, 0) == 0

    (replica,) = await cluster.wait_for_serving(MODEL, 1)
    assert node_of(replica) == NODE
