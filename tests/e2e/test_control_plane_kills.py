"""The control plane killed at random moments: while clients use the model through a
standalone gateway, an operator scales it up twice, drains a node, scales it down and rolls
out a new command, and the leader is SIGKILLed ten times along the way, at points drawn
from a seed (printed, and taken from ``$LLMGW_E2E_SEED`` when set), and started again each
time.

After every restart the new leader adopts every engine the agents still run (an engine the
log had already ended is stopped instead) and the projections equal a replay of the log.
At the end every operation has completed, no replica id was used twice, no shard ever had
two engines (by the log and by the agents' own records), nothing was lost, failed or
stopped as a stray, and no client request failed. The rollout succeeded, and each of its
moves placed one replacement, which served before its original was stopped.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from agent.engines.records import RecordStore, is_same_process
from tests.support.cluster import (
    SIMULATOR_COMMAND,
    Cluster,
    LoggedEvent,
    ServerProcess,
    ServerSettings,
    first,
)
from tests.support.fleet import is_running
from tests.support.traffic import Traffic, serves
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(150), pytest.mark.serial]  # asserts how soon things happen

NODES = ("gpu-a", "gpu-b", "gpu-c")
MODEL = "sim"
CLIENTS = 6
KILLS = 10
NOT_THE_OPERATIONS = ("node_connected", "node_disconnected", "replica_adopted")
"""Events of a restart, not of the operation it interrupted."""
RECONNECT_MAX_DELAY_S = 1.0
"""Kills come faster than every 10 s, so agents' reconnect backoff never starts over."""
BACK_WITHIN_S = 20.0
TROUBLE = (
    "replica_lost",
    "replica_failed",
    "replica_startup_timed_out",
    "stray_stopped",
    "node_lost",
    "model_unplaceable",
)
REVISED_COMMAND = f"{SIMULATOR_COMMAND} --profile vllm"
"""The rollout's new command: the simulator's default profile named, the same engine."""
Shard = tuple[str, int]
Engine = tuple[str, int, int]
"""Replica id, shard index, pid."""


@dataclass
class Operation:
    name: str
    begin: Callable[[], Awaitable[object]]
    completed: Callable[[], Awaitable[bool]]
    events: int
    """How many events it logs when nothing interrupts it."""
    kills: int

    def kill_points(self, draw: random.Random) -> list[int]:
        """After which of its events to kill the leader: distinct, never after the last."""
        return sorted(draw.sample(range(1, self.events), self.kills))


@dataclass
class Restart:
    """What one kill left to check."""

    epoch: int
    killed_after: int
    """The last log position before the kill."""
    unadopted: list[Engine]
    """Engines running at the kill that the new leader did not adopt (gone since)."""
    verified: asyncio.Task[subprocess.CompletedProcess[str]]


async def test_a_leader_killed_at_ten_random_points_finishes_every_operation_cleanly(
    cluster: Cluster,
) -> None:
    seed = int(os.environ.get("LLMGW_E2E_SEED") or random.randrange(2**32))
    print(f"control plane kill points: seed {seed} (LLMGW_E2E_SEED={seed} to replay)")
    draw = random.Random(seed)
    cluster.settings = ServerSettings(stability_window_s=1.0)
    cluster.agent_reconnect_max_delay_s = RECONNECT_MAX_DELAY_S
    server = cluster.start_server()
    await cluster.wait_for_leader()
    for node in NODES:
        cluster.start_agent(node)
    await cluster.wait_for_nodes_connected(NODES)
    await cluster.apply_simulated_model(MODEL, replicas=1)
    await wait_until(lambda: settled_at(cluster, 1), within_s=20.0, what="one replica serving")
    gateway = await cluster.start_gateway()
    key = await cluster.create_key("kills", [MODEL])
    await wait_until(
        lambda: serves(gateway.url, key, MODEL), within_s=10.0, what="the gateway routes"
    )
    drain = NodeDrain(cluster)
    rollout = Rollout(cluster)
    operations = [
        Operation("scale to 2", lambda: scale(cluster, 2), lambda: settled_at(cluster, 2), 5, 2),
        Operation("scale to 3", lambda: scale(cluster, 3), lambda: settled_at(cluster, 3), 5, 1),
        Operation("drain", drain.begin, drain.finished, 11, 3),
        Operation("scale to 2", lambda: scale(cluster, 2), lambda: settled_at(cluster, 2), 4, 1),
        Operation("rollout", rollout.begin, rollout.finished, 22, 3),
    ]
    assert sum(operation.kills for operation in operations) == KILLS
    restarts: list[Restart] = []

    try:
        async with Traffic(gateway.url, key, MODEL, clients=CLIENTS) as traffic:
            await traffic.wait_for_successes(2 * CLIENTS)
            for operation in operations:
                began_after = await cluster.last_position()
                await operation.begin()
                for point in operation.kill_points(draw):
                    in_flight = await wait_for_kill_point(cluster, operation, began_after, point)
                    killed_at = time.monotonic()
                    server, restart = await kill_and_restart(cluster, server)
                    print(
                        f"kill {len(restarts) + 1}: {operation.name}, after its event {point}"
                        f"{'' if in_flight else ' (it had completed)'}; back and adopted in "
                        f"{time.monotonic() - killed_at:.1f}s"
                    )
                    restarts.append(restart)
                await wait_until(
                    operation.completed, within_s=BACK_WITHIN_S, what=f"{operation.name} done"
                )
            await traffic.wait_for_successes(2 * CLIENTS)
    finally:  # no check may outlive the database it reads
        await asyncio.gather(*(restart.verified for restart in restarts), return_exceptions=True)
    print(traffic.summary())
    traffic.assert_no_failures()

    log = await cluster.events()
    trouble = [(e.type, e.data) for e in log if e.type in TROUBLE]
    assert not trouble, trouble
    placed = [str(e.get("replica_id")) for e in log if e.type == "replica_placed"]
    assert placed == [f"{MODEL}-{n}" for n in range(1, 7)], placed
    rollout.assert_each_move_placed_once_and_handed_over_in_order(log)
    assert engines_per_shard(log) == {shard: 1 for shard in engines_per_shard(log)}, log
    ended = {str(e.get("replica_id")) for e in log if e.type == "replica_stopped"}
    for restart in restarts:
        assert {replica for replica, _, _ in restart.unadopted} <= ended, restart
        verified = await restart.verified
        assert verified.returncode == 0, (restart.epoch, verified.stdout + verified.stderr)

    serving = await cluster.replicas(model=MODEL, phase="serving")
    assert len(serving) == 2, serving
    assert all(drain.node not in as_nodes(r["nodes"]) for r in serving), serving
    running = engines_on_agents(cluster)
    assert sorted(replica for replica, _, _ in running) == sorted(str(r["id"]) for r in serving)
    started = started_pids(log)
    assert all(started[(replica, shard)] == {pid} for replica, shard, pid in running), running
    final = await cluster.verify_projections()
    assert final.returncode == 0, final.stdout + final.stderr


async def kill_and_restart(
    cluster: Cluster, server: ServerProcess
) -> tuple[ServerProcess, Restart]:
    """SIGKILL the leader, start it again, and once it has adopted the fleet, what is left
    to check: the engines it did not adopt, and a projections check running meanwhile."""
    killed = await cluster.leadership()
    assert killed is not None
    server.kill()
    killed_after = await cluster.last_position()
    engines = engines_on_agents(cluster)
    assert engines, "no engine ran when the leader was killed"
    server = cluster.restart_server(server)
    await cluster.wait_for_leader(after_epoch=killed.epoch, within_s=BACK_WITHIN_S)
    await cluster.wait_until_serving_admin(server)
    leading = await cluster.leadership()
    assert leading is not None
    epoch = leading.epoch

    async def agents_back() -> bool:
        connected = await cluster.events("node_connected", after=killed_after)
        return {str(e.get("node_id")) for e in connected if e.epoch == epoch} == set(NODES)

    await wait_until(agents_back, within_s=BACK_WITHIN_S, every_s=0.05, what="agents back")
    unadopted: list[Engine] = []

    async def adopted_or_gone() -> bool:
        adoptions = await cluster.events("replica_adopted", after=killed_after)
        adopted = {
            (str(e.get("replica_id")), e.get("shard_index"), e.get("pid"))
            for e in adoptions
            if e.epoch == epoch
        }
        unadopted[:] = [engine for engine in engines if engine not in adopted]
        return not any(is_running(pid) for _, _, pid in unadopted)

    await wait_until(
        adopted_or_gone, within_s=BACK_WITHIN_S, every_s=0.05, what="every engine adopted"
    )
    running = engines_on_agents(cluster)
    assert len({(replica, shard) for replica, shard, _ in running}) == len(running), running
    verified = asyncio.create_task(cluster.verify_projections())
    return server, Restart(epoch, killed_after, unadopted, verified)


@dataclass
class NodeDrain:
    """Draining the node of the first serving replica."""

    cluster: Cluster
    node: str = ""
    drain_id: str = ""

    async def begin(self) -> None:
        first, *_ = await self.cluster.replicas(model=MODEL, phase="serving")
        (self.node,) = as_nodes(first["nodes"])
        self.drain_id = await self.cluster.drain_node(self.node)

    async def finished(self) -> bool:
        return (await self.cluster.drain(self.drain_id))["finished"] is True


@dataclass
class Rollout:
    """The model's command changed (to one that runs the same engine): its replicas, as
    they serve then, are replaced one by one by the new revision."""

    cluster: Cluster
    originals: list[str] = field(default_factory=list)
    rollout_id: str = ""

    async def begin(self) -> None:
        serving = await self.cluster.replicas(model=MODEL, phase="serving")
        self.originals = sorted(str(r["id"]) for r in serving)
        before = await self.cluster.last_position()
        await self.cluster.apply_simulated_model(
            MODEL, replicas=len(serving), command=REVISED_COMMAND
        )
        started = await self.cluster.wait_for_event("rollout_started", after=before)
        self.rollout_id = str(started.get("rollout_id"))

    async def finished(self) -> bool:
        """The rollout has ended (however) and its last original has stopped."""
        ended = await self.cluster.events("rollout_finished")
        return any(e.get("rollout_id") == self.rollout_id for e in ended) and await settled_at(
            self.cluster, len(self.originals)
        )

    def assert_each_move_placed_once_and_handed_over_in_order(self, log: list[LoggedEvent]) -> None:
        """The rollout succeeded; each original got exactly one replacement, of the new
        revision, which served before the original was taken out and stopped; and no other
        replica of the new revision was placed."""
        finished = first(log, "rollout_finished", rollout_id=self.rollout_id)
        assert finished.get("succeeded") is True, finished
        revision = first(log, "rollout_started", rollout_id=self.rollout_id).get("revision")
        new = [e for e in log if e.type == "replica_placed" and e.get("revision") == revision]
        assert sorted(str(e.get("replaces")) for e in new) == self.originals, new
        for placed in new:
            original, replacement = str(placed.get("replaces")), placed.get("replica_id")
            assert placed.correlation_id == self.rollout_id, placed
            order = [
                first(log, "replica_drain_started", replica_id=original, drain_id=self.rollout_id),
                placed,
                first(log, "replica_serving", replica_id=replacement),
                first(log, "replacement_serving", replica_id=original),
                first(log, "replica_stopping", replica_id=original),
                first(log, "replica_stopped", replica_id=original),
            ]
            assert [e.position for e in order] == sorted(e.position for e in order), order
            assert order[0].correlation_id == self.rollout_id, order
            stopped = [e for e in log if e.type == "replica_stopping"]
            assert replacement not in {e.get("replica_id") for e in stopped}, stopped


async def scale(cluster: Cluster, replicas: int) -> None:
    await cluster.admin("POST", f"/admin/v1/models/{MODEL}/scale", body={"replicas": replicas})


async def settled_at(cluster: Cluster, count: int) -> bool:
    """``count`` replicas serve and no other is on its way in or out."""
    replicas = await cluster.replicas(model=MODEL)
    phases = [str(r["phase"]) for r in replicas]
    in_motion = {"placed", "starting", "draining", "stopping"}
    return phases.count("serving") == count and not in_motion & set(phases)


async def wait_for_kill_point(
    cluster: Cluster, operation: Operation, began_after: int, point: int
) -> bool:
    """Until ``operation`` has logged ``point`` events since ``began_after``, or completed
    (an interrupted operation may log fewer); whether it is still in flight."""
    completed: list[bool] = []

    async def reached() -> bool:
        since = await cluster.events(after=began_after)
        if sum(e.type not in NOT_THE_OPERATIONS for e in since) >= point:
            return True
        completed[:] = [await operation.completed()]
        return completed[0]

    await wait_until(
        reached, within_s=BACK_WITHIN_S, what=f"{operation.name}'s event {point} or its end"
    )
    return not completed or not completed[0]


def engines_on_agents(cluster: Cluster) -> list[Engine]:
    """Every engine the agents' records hold that is alive: what the agents really run."""
    return sorted(
        (record.replica_id, record.shard_index, record.pid)
        for agent in {a.state_dir: a for a in cluster.agents.values()}.values()
        for record in RecordStore(agent.state_dir).load_all()
        if is_same_process(record)
    )


def started_pids(log: list[LoggedEvent]) -> dict[Shard, set[object]]:
    """Every engine pid the log saw for each shard, started or adopted."""
    pids: dict[Shard, set[object]] = {}
    for event in log:
        if event.type in ("shard_starting", "replica_adopted") and event.get("pid") is not None:
            shard = (str(event.get("replica_id")), int(str(event.get("shard_index"))))
            pids.setdefault(shard, set()).add(event.get("pid"))
    return pids


def engines_per_shard(log: list[LoggedEvent]) -> dict[Shard, int]:
    return {shard: len(pids) for shard, pids in started_pids(log).items()}


def as_nodes(value: object) -> list[str]:
    assert isinstance(value, list), value
    return [str(node) for node in value]
