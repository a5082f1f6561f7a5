"""A leading control plane in the test's process: elected, wired as ``llmgw-server serve``
wires one (``app.bootstrap.leader_wiring``), its agent hub on a free loopback port with
the test PKI, and stopped (its election released) when the block ends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from app.bootstrap import AgentHubConfig, leader_wiring
from app.services.control_plane import ControlPlaneConfig, Leader
from app.services.leader import LeaderElection
from app.store.postgres import PostgresEventStore
from tests.support.fake_agents import LOOPBACK, AgentPki

PASS_INTERVAL_S = 0.2
"""Fast passes, so that a test waits on what it asserts, not on the reconciler."""


@contextlib.asynccontextmanager
async def leading(
    store: PostgresEventStore, database_url: str, pki: AgentPki, server_id: str
) -> AsyncIterator[Leader]:
    election = LeaderElection(database_url, server_id)
    epoch = await election.acquire()
    config = ControlPlaneConfig(
        server_id=server_id,
        agent_host=LOOPBACK,
        agent_port=0,
        reconcile_interval_s=PASS_INTERVAL_S,
    )
    hub = AgentHubConfig(
        tls=pki.server_context(), heartbeat_interval_s=0.5, heartbeat_timeout_s=10.0
    )
    leader = Leader(store, config, epoch, leader_wiring(store, database_url, hub, server_id))
    await leader.start()
    try:
        yield leader
    finally:
        await leader.stop()
        await election.close()
