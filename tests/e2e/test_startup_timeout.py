"""Startup timeout: an engine that never becomes ready cannot hold its GPUs for ever. The
control plane times its replica out by its own clock once the model's startup timeout has
passed, stops the engine, places a replacement after the model's failure backoff, and
``llmgw-cli replica`` shows the operator the last lines the engine wrote.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from agent.simulator.launcher import simulator_command
from tests.support.cluster import Cluster, about
from tests.support.fleet import is_running
from tests.support.traffic import Traffic, serves
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(60), pytest.mark.serial]  # asserts how soon things happen

NODE = "gpu-a"
MODEL = "stuck"
HEALTHY = "sim"
"""Served beside the stuck model, with clients of it running throughout."""
CLIENTS = 4
STARTUP_TIMEOUT_S = 2.0
NEVER_READY_COMMAND = (
    f"{simulator_command()} --port {{port}} --model {{model}} --instant --never-ready"
)
FIRST_FAILURE_BACKOFF_S = 10.0
"""The model waits this long after its first failure before it places again."""
LATE_BY_AT_MOST_S = 2.5
"""Reconcile passes come every 0.2 s; the rest is a loaded machine's scheduling."""
ENGINE_START_LINE = "simulator_starting"
"""What the simulator logs first: the engine's own words, read from its log file."""


async def test_an_engine_that_never_becomes_ready_is_timed_out_and_replaced_on_schedule(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    await cluster.wait_for_leader()
    await cluster.start_fleet([NODE], HEALTHY, replicas=1)
    gateway = await cluster.start_gateway()
    key = await cluster.create_key("startup-timeout-traffic", [HEALTHY])
    await wait_until(lambda: serves(gateway.url, key, HEALTHY), what="the gateway routes")
    async with Traffic(gateway.url, key, HEALTHY, clients=CLIENTS) as traffic:
        await traffic.wait_for_successes(CLIENTS)
        stuck = await time_out_and_replace(cluster)
        await traffic.wait_for_successes(2 * CLIENTS)
    traffic.assert_no_failures()

    shown = await cluster.cli("replica", stuck)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "timed_out" in shown.stdout, shown.stdout
    assert "engine log of shard 0" in shown.stdout, shown.stdout
    assert ENGINE_START_LINE in shown.stdout, shown.stdout

    as_json = await cluster.cli("replica", stuck, "--output", "json")
    view = json.loads(as_json.stdout)
    (shard,) = view["shards"]
    assert shard["phase"] == "stopped", view
    assert any(ENGINE_START_LINE in line for line in shard["log_tail"]), view


async def time_out_and_replace(cluster: Cluster) -> str:
    """Declare the model whose engine never becomes ready; see it timed out, its GPU freed,
    and a replacement placed after the failure backoff. Its replica id."""
    await cluster.apply_simulated_model(
        MODEL, replicas=1, command=NEVER_READY_COMMAND, startup_timeout_s=STARTUP_TIMEOUT_S
    )
    placed = await cluster.wait_for_event("replica_placed", about(model=MODEL))
    stuck = str(placed.get("replica_id"))
    starting = await cluster.wait_for_event("shard_starting", about(replica_id=stuck))
    engine = starting.get("pid")
    assert isinstance(engine, int), starting

    timed_out = await cluster.wait_for_event(
        "replica_startup_timed_out", about(replica_id=stuck), within_s=STARTUP_TIMEOUT_S + 10
    )
    assert timed_out.get("timeout_s") == STARTUP_TIMEOUT_S
    waited = timed_out.recorded_at - placed.recorded_at
    assert timedelta(seconds=STARTUP_TIMEOUT_S) <= waited, waited
    assert waited <= timedelta(seconds=STARTUP_TIMEOUT_S + LATE_BY_AT_MOST_S), waited
    assert timed_out.actor == "reconciler"

    await cluster.wait_for_event("shard_stopped", about(replica_id=stuck))
    await wait_until(lambda: not is_running(engine), what="the stuck engine gone")
    node = next(n for n in await cluster.nodes() if n["id"] == NODE)
    healthy_gpus = node["healthy_gpus"]
    assert isinstance(healthy_gpus, int), node
    assert node["free_gpus"] == healthy_gpus - 1, node  # one serves the healthy model

    replacement = await cluster.wait_for_event(
        "replica_placed",
        lambda event: event.get("model") == MODEL and event.get("replica_id") != stuck,
        within_s=FIRST_FAILURE_BACKOFF_S + 10,
    )
    backed_off = replacement.recorded_at - timed_out.recorded_at
    assert timedelta(seconds=FIRST_FAILURE_BACKOFF_S) <= backed_off, backed_off
    assert backed_off <= timedelta(seconds=FIRST_FAILURE_BACKOFF_S + LATE_BY_AT_MOST_S)
    return stuck
