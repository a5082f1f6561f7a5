"""The scenario ``benchmarks/codepaths.py`` traces: a drain through ``llmgw-cli drain
--wait``, then an agent killed and started again, on a cluster of real processes. Each
phase's start and end go to ``CODEPATHS_DIR/phases.jsonl``. It is copied beside the
end-to-end tests of the checkout being measured, to use that checkout's ``cluster``.

Each edge of a window waits on conditions, so that every run sees the whole phase:

- calls are recorded by the tenth of a second, so a window starts in a tenth of its own,
  after the one of the scenario's last request, and its end's tenth is over before the
  scenario sends another;
- the killed agent is started again well inside the lost timeout (``LOST_TIMEOUT_S``),
  and the scenario fails if its node was lost anyway: the reconnect it measures is the
  one that adopts a node's engines, not the one that replaces them;
- the reconnect's window opens once the agent's ``node_disconnected`` is in the log and the
  leader has finished a reconcile pass begun after it (what the disconnect set going is
  over), just before the agent is started again;
- it closes once ``node_connected`` is in the log and the leader has finished a pass begun
  after it: the adoption pass that compared the hello with the log, with whatever it
  appended and sent;
- after each phase the scenario waits until every server and agent still running has
  written the calls it made before the phase ended (``codepaths_site/sitecustomize.py``
  writes them every tenth of a second with a ``{"flushed": t}`` mark): the cluster's
  processes are SIGKILLed when the test ends, and what they called in their last moments
  is part of the path.

A pass is counted on the leader's ``/metrics`` (``llmgw_reconcile_passes_total``): a pass that
decides nothing leaves nothing in the log to wait for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path

import httpx

from tests.support.cluster import Cluster, about, node_of
from tests.support.waiting import wait_until

NODES = ("gpu-a", "gpu-b", "gpu-c")
MODEL = "sim"
LOST_TIMEOUT_S = 60.0
"""How long the killed agent's node may stay away before it is lost: far longer than the
agent takes to start again, even on a busy machine (the tests' 5 s is not, and a node
lost meanwhile makes the reconnect a replacement and a stray's stop)."""
PASSES = re.compile(r"^llmgw_reconcile_passes(?:_total)? (\S+)$", re.MULTILINE)
TENTHS = 10
"""Calls are recorded by the tenth of a second (``int(time * TENTHS)``)."""
TAIL_BYTES = 65536
"""How much of the end of a process's records is read for its last ``flushed`` mark."""


def _records() -> Path:
    return Path(os.environ["CODEPATHS_DIR"])


def _tenth(moment: float) -> int:
    """The tenth of a second ``moment`` falls in: calls are recorded by the tenth."""
    return int(moment * TENTHS)


def _mark(phase: str, edge: str) -> float:
    moment = time.time()
    with (_records() / "phases.jsonl").open("a") as out:
        out.write(json.dumps({"phase": phase, "edge": edge, "t": moment}) + "\n")
    return moment


async def _start(phase: str) -> None:
    """Mark ``phase``'s start in a tenth of a second of its own: the window's calls are
    counted from the tenth the start falls in, which must not hold the calls that served
    the scenario's last request."""
    asked = _tenth(time.time())
    await wait_until(lambda: _tenth(time.time()) > asked, every_s=0.01, what="the next tenth")
    _mark(phase, "start")


async def _end(cluster: Cluster, phase: str) -> None:
    """Mark ``phase``'s end, then wait until every server and agent still running has
    written the calls it made until the end of the tenth of a second the end falls in
    (the last one the window counts, and one the scenario's next request stays out of)."""
    counted_until = (_tenth(_mark(phase, "end")) + 1) / TENTHS
    running = [s.process for s in cluster.servers if not s.exited()]
    running += [a.process for a in cluster.agents.values() if not a.exited()]
    files = [_records() / f"{process.pid}.jsonl" for process in running]
    await wait_until(
        lambda: all(_flushed_after(file, counted_until) for file in files),
        within_s=10.0,
        every_s=0.05,
        what=f"the calls of {len(files)} processes until the {phase}'s end written",
    )


def _flushed_after(records: Path, moment: float) -> bool:
    """Whether the process writing ``records`` has written the calls it made before
    ``moment``: its last ``{"flushed": t}`` mark has ``t`` at or after it."""
    if not records.exists():
        return False
    with records.open("rb") as source:
        source.seek(max(0, source.seek(0, os.SEEK_END) - TAIL_BYTES))
        tail = source.read().decode(errors="replace").splitlines()
    for line in reversed(tail):
        try:
            mark = json.loads(line)
        except ValueError:
            continue  # cut by the seek, or still being written
        if isinstance(mark, dict) and "flushed" in mark:
            return bool(mark["flushed"] >= moment)
    return False


async def _a_whole_pass(cluster: Cluster, client: httpx.AsyncClient) -> None:
    """Until the leader has finished a reconcile pass begun after this call, one that
    read the log and the fleet as they are now. The pass under way when it is called may
    have read them before; the one after it has not."""
    metrics = f"{cluster.servers[0].admin_url}/metrics"

    async def passes() -> int:
        answer = await client.get(metrics)
        answer.raise_for_status()
        found = PASSES.search(answer.text)
        assert found, f"no llmgw_reconcile_passes on {metrics}"
        return int(float(found.group(1)))

    wanted = await passes() + 2

    async def passed() -> bool:
        return await passes() >= wanted

    await wait_until(passed, within_s=30.0, every_s=0.05, what=f"reconcile pass {wanted}")


async def test_trace_a_drain_and_a_reconnect(cluster: Cluster) -> None:
    cluster.settings = dataclasses.replace(cluster.settings, lost_timeout_s=LOST_TIMEOUT_S)
    cluster.start_server()
    await cluster.wait_for_leader()
    original, _ = await cluster.start_fleet(NODES, MODEL, replicas=2)
    drained = node_of(original)

    await _start("drain")
    done = await cluster.cli("drain", drained, "--wait")
    assert done.returncode == 0, done.stderr
    await cluster.wait_for_event("node_drain_finished", about(node_id=drained), within_s=30.0)
    await _end(cluster, "drain")

    victim = node_of((await cluster.replicas(phase="serving"))[0])
    killed_at = await cluster.last_position()
    async with httpx.AsyncClient(timeout=10.0) as client:
        cluster.agents[victim].kill()
        await cluster.wait_for_event("node_disconnected", about(node_id=victim), after=killed_at)
        await _a_whole_pass(cluster, client)
        await _start("reconnect")
        cluster.start_agent(victim)
        await cluster.wait_for_event(
            "node_connected", about(node_id=victim), after=killed_at, within_s=30.0
        )
        await _a_whole_pass(cluster, client)
        await _end(cluster, "reconnect")
    assert not await cluster.events("node_lost", after=killed_at), "the node was lost"
