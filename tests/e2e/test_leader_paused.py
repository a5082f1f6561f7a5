"""The leading control plane is frozen (SIGSTOP: a stalled VM, a debugger, swap) while its
process and its database session stay up. Its advisory lock would be held for as long as
the session lasts, which for a frozen process is for ever: the kernel still answers for
its sockets. The lock's session ends once it has been idle for the leader lease instead,
so a standby takes over, and the frozen server, thawed, finds it no longer leads: it
appends nothing under its old epoch, stops listening for agents and exits with code 3, and
its agent connects to the new leader."""

from __future__ import annotations

import os
import signal

import pytest

from app.services.leader import DEFAULT_LEASE_S
from devcluster.ports import listens
from tests.support.cluster import Cluster, about
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.serial]  # asserts how soon things happen

NODE = "gpu-a"
TAKEN_OVER_WITHIN_S = DEFAULT_LEASE_S + 15.0
"""The lease, then the standby's next try for the lock (every second), with room for a
loaded machine."""
EXIT_DEPOSED = 3
AGENT_BACK_WITHIN_S = 40.0
"""An agent that dialled the frozen leader (whose kernel still accepts connections) dials
the standby beside it every 5 s (``--next-server-after``), so it is back within seconds of
the takeover; the bound leaves room for an agent that does not (a single ``--server``)."""


async def test_a_standby_takes_over_from_a_frozen_leader_which_then_steps_down(
    cluster: Cluster,
) -> None:
    frozen = cluster.start_server()
    await cluster.wait_for_leader()
    standby = cluster.start_server()
    await cluster.wait_until_serving_admin(standby)
    cluster.start_agent(NODE)
    await cluster.wait_for_nodes_connected([NODE])
    before = await cluster.leadership()
    assert before is not None
    assert before.holder == frozen.server_id

    os.kill(frozen.process.pid, signal.SIGSTOP)
    try:
        frozen_at = await cluster.last_position()
        successor = await cluster.wait_for_leader(
            after_epoch=before.epoch, within_s=TAKEN_OVER_WITHIN_S
        )
        assert successor is standby
    finally:
        os.kill(frozen.process.pid, signal.SIGCONT)

    await wait_until(frozen.exited, within_s=30, what="the thawed leader exits")
    assert frozen.process.returncode == EXIT_DEPOSED
    assert not listens(frozen.agent_port)
    back = await cluster.wait_for_event(
        "node_connected", about(node_id=NODE), after=frozen_at, within_s=AGENT_BACK_WITHIN_S
    )
    assert back.epoch == before.epoch + 1, back
    stale = [e for e in await cluster.events(after=frozen_at) if e.epoch == before.epoch]
    assert stale == [], [(e.type, e.data) for e in stale]
