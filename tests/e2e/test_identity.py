"""Identity: an agent holding one node's certificate cannot speak for another node. The
control plane refuses it, records the refusal in the log, and takes nothing it said into
the state: not its GPUs, not its labels, not the connection of the node it claimed.
"""

from __future__ import annotations

import pytest

from tests.support.cluster import Cluster, JsonObject, about
from tests.support.fleet import AgentProcess
from tests.support.traffic import Traffic, serves
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

HONEST = ("gpu-a", "gpu-b")
STRANGER = "gpu-x"
"""A node the cluster has never seen."""
HUB_ACTOR = "agent-hub"
REFUSED_EXIT_CODE = 1
MODEL = "sim"
CLIENTS = 4


async def test_an_agent_with_another_nodes_certificate_is_refused_recorded_and_ignored(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    await cluster.wait_for_leader()
    await cluster.start_fleet(HONEST, MODEL, replicas=2)
    gateway = await cluster.start_gateway()
    key = await cluster.create_key("identity-traffic", [MODEL])
    await wait_until(lambda: serves(gateway.url, key, MODEL), what="the gateway routes")
    before = {str(node["id"]): node for node in await cluster.nodes()}
    honest_until = await cluster.last_position()

    async with Traffic(gateway.url, key, MODEL, clients=CLIENTS) as traffic:
        await traffic.wait_for_successes(CLIENTS)
        impostors = {claim: impersonate(cluster, "gpu-a", claim) for claim in ("gpu-b", STRANGER)}

        for claim, impostor in impostors.items():
            refusal = await cluster.wait_for_event(
                "identity_rejected", about(claimed_node_id=claim), after=honest_until
            )
            assert refusal.stream == f"node-{claim}"
            assert refusal.actor == HUB_ACTOR
            assert "CN=gpu-a" in str(refusal.get("certificate_subject")), refusal
            assert "'gpu-a' does not match node id" in str(refusal.get("reason")), refusal
            await wait_until(
                impostor.exited, within_s=10.0, what=f"the agent claiming {claim} gone"
            )
            assert impostor.process.returncode == REFUSED_EXIT_CODE, impostor.log()
            assert "refused this node" in impostor.log()
        await traffic.wait_for_successes(2 * CLIENTS)
    traffic.assert_no_failures()

    since = await cluster.events(after=honest_until)
    assert {event.type for event in since} == {"identity_rejected"}, [
        (event.type, event.data) for event in since
    ]
    after = {str(node["id"]): node for node in await cluster.nodes()}
    assert after == before
    assert STRANGER not in after
    claimed = await node_view(cluster, "gpu-b")
    assert len(as_list(claimed["gpus"])) == 2, claimed
    assert claimed["labels"] == {}, claimed
    await cluster.wait_for_nodes_connected(HONEST)

    verified = await cluster.verify_projections()
    assert verified.returncode == 0, verified.stdout + verified.stderr


def impersonate(cluster: Cluster, holder: str, claim: str) -> AgentProcess:
    """An agent presenting ``holder``'s certificate while claiming to be ``claim``, with GPUs
    and a label of its own that must not reach the state."""
    server = cluster.servers[0]
    return cluster.fleet.start_agent(
        server.agent_uri,
        claim,
        cluster.pki.node(holder),
        cluster.directory / f"state-impostor-{claim}",
        fake_gpus="4x40GB",
        labels={"impostor": "yes"},
    )


async def node_view(cluster: Cluster, node_id: str) -> JsonObject:
    answer = await cluster.admin("GET", f"/admin/v1/nodes/{node_id}")
    assert isinstance(answer, dict), answer
    return answer


def as_list(value: object) -> list[object]:
    assert isinstance(value, list), value
    return value
