"""Two real agents over mTLS whose fake GPUs have one UUID (a cloned machine: its GPUs
derived from the same seed), recorded in a real PostgreSQL: the node connected first keeps
the UUID, the other's GPU takes no new shard, placement names the node that holds it, and
the hello that claimed it is a warning once. Neither node is refused or disturbed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from structlog.testing import capture_logs

from agent.connection import Backoff, stay_connected
from agent.gpus import FakeGpuSource, parse_fake_gpus
from agent.refusal_advice import NodeClaim
from agent.runtime import AgentRuntime
from app.domain.model_spec import ModelSpec
from app.domain.placement import explain_placement
from app.hub.hub import AgentHub
from app.store.postgres import PostgresEventStore
from tests.integration.test_agent_gpu_inventory import a_config
from tests.support.hub import Pki, hub, new_node_id, pki, run_hub
from tests.support.waiting import wait_until

__all__ = ["hub", "pki", "run_hub"]  # fixtures

SPEC = ModelSpec(name="llama", command="sim --port {port}", gpus_per_shard=1)


@contextlib.asynccontextmanager
async def an_agent(
    hub: AgentHub, pki: Pki, state_dir: Path, node_id: str, *, seed: str
) -> AsyncIterator[None]:
    """A real agent of ``node_id`` connected to ``hub``, its one fake GPU's UUID derived
    from ``seed`` rather than its node id."""
    await asyncio.to_thread(state_dir.mkdir)
    config = a_config(state_dir, node_id, hub)
    runtime = AgentRuntime(config, FakeGpuSource(parse_fake_gpus("1x80GB", seed=seed)))
    await runtime.start()
    connection = asyncio.create_task(
        stay_connected(
            config.servers,
            pki.node(node_id),
            runtime.serve,
            node=NodeClaim(node_id),
            backoff=Backoff(0.05),
        )
    )
    try:
        yield
    finally:
        connection.cancel()
        await asyncio.gather(connection, return_exceptions=True)
        await runtime.close()


async def test_a_cloned_node_keeps_its_connection_but_not_the_uuid_of_the_first(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore, tmp_path: Path
) -> None:
    first, clone = new_node_id(), new_node_id()
    [shared] = [gpu.uuid for gpu in parse_fake_gpus("1x80GB", seed=first)]

    def connected(node_id: str) -> bool:
        node = pg_store.state.nodes.get(node_id)
        return node is not None and node.connected

    async def caught_up(node_id: str) -> bool:
        await pg_store.catch_up()
        return connected(node_id)

    with capture_logs() as logs:
        async with an_agent(hub, pki, tmp_path / "first", first, seed=first):
            await wait_until(lambda: caught_up(first), what=f"{first} connected")
            async with an_agent(hub, pki, tmp_path / "clone", clone, seed=first):
                await wait_until(lambda: caught_up(clone), what=f"{clone} connected")
                state = pg_store.state
                assert sorted(hub.connected_nodes()) == sorted([first, clone])
                assert [g.uuid for g in state.nodes[clone].gpus] == [shared]

                explanation = explain_placement(state, SPEC)
                reasons = {c.node_id: c.reasons for c in explanation.candidates}
                assert reasons[first] == ()
                assert reasons[clone] == (
                    f"needs 1 healthy GPU(s), has 0: GPU 0 held elsewhere (its UUID {shared} "
                    f"is listed by node {first} too, connected longer)",
                )
                assert explanation.placement is not None
                assert [s.node_id for s in explanation.placement] == [first]

    warnings = [line for line in logs if line["event"] == "gpu_uuid_held_elsewhere"]
    assert [(w["node_id"], w["gpus"]) for w in warnings] == [
        (clone, [f"0 ({shared}) held by {first}"])
    ]
