"""The scenario ``benchmarks/codepaths.py`` traces: a drain through ``llmgw-cli drain
--wait``, then an agent killed and started again, on a cluster of real processes. Each
phase's start and end go to ``CODEPATHS_DIR/phases.jsonl``. It is copied beside the
end-to-end tests of the checkout being measured, to use that checkout's ``cluster``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.support.cluster import Cluster, about, node_of

NODES = ("gpu-a", "gpu-b", "gpu-c")
MODEL = "sim"


def _mark(phase: str, edge: str) -> None:
    with (Path(os.environ["CODEPATHS_DIR"]) / "phases.jsonl").open("a") as out:
        out.write(json.dumps({"phase": phase, "edge": edge, "t": time.time()}) + "\n")


async def test_trace_a_drain_and_a_reconnect(cluster: Cluster) -> None:
    cluster.start_server()
    await cluster.wait_for_leader()
    original, _ = await cluster.start_fleet(NODES, MODEL, replicas=2)
    drained = node_of(original)

    _mark("drain", "start")
    done = await cluster.cli("drain", drained, "--wait")
    assert done.returncode == 0, done.stderr
    await cluster.wait_for_event("node_drain_finished", about(node_id=drained), within_s=30.0)
    _mark("drain", "end")

    victim = node_of((await cluster.replicas(phase="serving"))[0])
    killed_at = await cluster.last_position()
    cluster.agents[victim].kill()
    await cluster.wait_for_event("node_disconnected", about(node_id=victim), after=killed_at)
    _mark("reconnect", "start")
    cluster.start_agent(victim)
    await cluster.wait_for_event("node_connected", about(node_id=victim), after=killed_at)
    _mark("reconnect", "end")
