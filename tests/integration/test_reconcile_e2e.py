"""The reconciler end to end, with nothing in process: ``llmgw-server serve`` processes on
one PostgreSQL database, ``llmgw-agent`` processes with fake GPUs dialling them over mutual
TLS, and the ``llmgw-sim-engine`` processes those agents start. An operator acts through the
admin API; every story is checked in the event log, the one thing that outlives a killed
control plane.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from tests.support.cluster import (
    ADMIN_TOKEN_NAME,
    Cluster,
    ClusterPki,
    JsonObject,
    LoggedEvent,
    ServerSettings,
    about,
    first,
    issue_pki,
    node_of,
)
from tests.support.fleet import is_running
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

NODES = ("gpu-a", "gpu-b", "gpu-c")
MODEL = "sim"
STABILITY_WINDOW_S = ServerSettings().stability_window_s
FAILOVER_WITHIN_S = 10.0
AGENTS_BACK_WITHIN_S = 6.0
"""After a control plane restarts, an agent may spend about 5 s more in its reconnect
backoff. A stability window this long keeps a drain from ending before every agent is
back; the late-node story at the end shows what happens when it does."""
SOON_LOST_S = 1.0
"""A lost timeout shorter than agents take to come back to a new leader: only the adoption
grace then keeps their nodes and replicas from being lost and replaced."""
ADOPTION_RULES = ("matches the log", "the log's copy never came up")
Shard = tuple[str, object]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ClusterPki:
    return issue_pki(tmp_path_factory.mktemp("e2e-pki"), NODES)


async def start_fleet(cluster: Cluster) -> list[JsonObject]:
    """Three agents, and two replicas of the model serving on two different nodes: those
    replicas, by id."""
    serving = await cluster.start_fleet(NODES, MODEL, replicas=2)
    assert len({node_of(r) for r in serving}) == 2, serving
    return serving


def of_type(log: Iterable[LoggedEvent], event_type: str) -> list[LoggedEvent]:
    return [event for event in log if event.type == event_type]


def shard_of(event: LoggedEvent) -> Shard:
    return (str(event.get("replica_id")), event.get("shard_index"))


def shards_running(log: Iterable[LoggedEvent]) -> set[Shard]:
    """The shards an agent reported starting that nothing reported ended since."""
    running: set[Shard] = set()
    for event in log:
        if event.type == "shard_starting":
            running.add(shard_of(event))
        elif event.type in ("shard_stopped", "shard_failed"):
            running.discard(shard_of(event))
    return running


async def test_a_drain_moves_a_replica_to_the_free_node_and_stops_the_original_after_it(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    await cluster.wait_for_leader()
    original, staying = await start_fleet(cluster)
    drained_node = node_of(original)
    (free_node,) = set(NODES) - {drained_node, node_of(staying)}

    drain_id = await cluster.drain_node(drained_node)
    await cluster.wait_for_event("node_drain_finished", about(drain_id=drain_id), within_s=20.0)

    log = await cluster.events()
    placed = first(log, "replica_placed", replaces=original["id"])
    replacement = placed.get("replica_id")
    shards = placed.get("shards")
    assert isinstance(shards, list)
    assert [shard["node_id"] for shard in shards] == [free_node]
    replacement_serves = first(log, "replica_serving", replica_id=replacement)
    moved = first(log, "replacement_serving", replica_id=original["id"])
    original_stops = first(log, "replica_stopping", replica_id=original["id"])
    assert moved.get("replacement_id") == replacement
    assert replacement_serves.position < moved.position < original_stops.position
    served_for = moved.recorded_at - replacement_serves.recorded_at
    assert served_for.total_seconds() >= STABILITY_WINDOW_S
    assert [shard_of(e) for e in of_type(log, "shard_stopped")] == [(original["id"], 0)]

    requested = first(log, "node_drain_requested", drain_id=drain_id)
    assert requested.actor == ADMIN_TOKEN_NAME
    move = [
        requested,
        first(log, "replica_drain_started", replica_id=original["id"]),
        placed,
        moved,
        original_stops,
        first(log, "replica_stopped", replica_id=original["id"]),
        first(log, "node_drain_finished", drain_id=drain_id),
    ]
    assert [(e.type, e.correlation_id) for e in move] == [(e.type, drain_id) for e in move]

    engine = first(log, "shard_starting", replica_id=original["id"]).get("pid")
    assert isinstance(engine, int)
    await wait_until(lambda: not is_running(engine), what="the original's engine gone")


async def test_a_control_plane_killed_mid_drain_adopts_the_fleet_and_finishes_the_drain(
    cluster: Cluster,
) -> None:
    cluster.settings = ServerSettings(
        lost_timeout_s=SOON_LOST_S, stability_window_s=AGENTS_BACK_WITHIN_S
    )
    server = cluster.start_server()
    await cluster.wait_for_leader()
    original, _ = await start_fleet(cluster)
    drain_id = await cluster.drain_node(node_of(original))
    await cluster.wait_for_event("replica_placed", about(replaces=original["id"]))

    server.kill()
    before = await cluster.events()
    killed = await cluster.leadership()
    assert killed is not None
    cluster.restart_server(server)
    await cluster.wait_for_leader(after_epoch=killed.epoch)
    await cluster.wait_for_event("node_drain_finished", about(drain_id=drain_id), within_s=30.0)

    after = await cluster.events(after=before[-1].position)
    running = shards_running(before)
    assert running, "no shard ran when the control plane was killed"
    adopted = {shard_of(e): e for e in of_type(after, "replica_adopted")}
    assert running <= set(adopted), [(e.type, e.data) for e in after]
    for adoption in adopted.values():
        assert str(adoption.get("rule")).startswith(ADOPTION_RULES), adoption
        assert adoption.epoch == killed.epoch + 1

    placed = [str(e.get("replica_id")) for e in await cluster.events("replica_placed")]
    assert len(placed) == 3, placed
    assert len(set(placed)) == 3, placed
    engines: dict[Shard, set[object]] = {}
    for starting in await cluster.events("shard_starting"):
        engines.setdefault(shard_of(starting), set()).add(starting.get("pid"))
    assert all(len(pids) == 1 for pids in engines.values()), engines

    verified = await cluster.verify_projections()
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_a_standby_takes_over_from_a_killed_leader_and_adopts_its_fleet(
    cluster: Cluster,
) -> None:
    cluster.settings = ServerSettings(lost_timeout_s=SOON_LOST_S)
    cluster.start_server()
    leader = await cluster.wait_for_leader()
    standby = cluster.start_server()
    await cluster.wait_until_serving_admin(standby)
    serving = await start_fleet(cluster)
    before = await cluster.leadership()
    assert before is not None
    assert before.holder == leader.server_id

    killed_at = await cluster.last_position()
    leader.kill()
    successor = await cluster.wait_for_leader(after_epoch=before.epoch, within_s=FAILOVER_WITHIN_S)
    assert successor is standby
    now = await cluster.leadership()
    assert now is not None
    assert now.epoch == before.epoch + 1

    for node in NODES:
        back = await cluster.wait_for_event("node_connected", about(node_id=node), after=killed_at)
        assert back.epoch == now.epoch
    for replica in serving:
        await cluster.wait_for_event(
            "replica_adopted", about(replica_id=replica["id"]), after=killed_at
        )
    assert len(await cluster.events("replica_placed")) == 2

    log = await cluster.events()
    first_of_new_term = min(e.position for e in log if e.epoch == now.epoch)
    late = [e for e in log if e.epoch == before.epoch and e.position > first_of_new_term]
    assert not late, late


async def test_a_node_back_late_but_within_the_adoption_grace_has_its_drained_replica_adopted(
    cluster: Cluster,
) -> None:
    server = cluster.start_server()
    await cluster.wait_for_leader()
    original, _ = await start_fleet(cluster)
    drained_node = node_of(original)
    await cluster.drain_node(drained_node)
    await cluster.wait_for_event("replica_placed", about(replaces=original["id"]))

    server.kill()
    cluster.agents[drained_node].kill()
    killed_at = await cluster.last_position()
    cluster.restart_server(server)
    await cluster.wait_for_leader(after_epoch=1)
    await cluster.wait_for_event(
        "replacement_serving", about(replica_id=original["id"]), after=killed_at
    )
    cluster.start_agent(drained_node)
    await cluster.wait_for_event("node_connected", about(node_id=drained_node), after=killed_at)

    what_became_of_it = await cluster.wait_for_event(
        ("replica_adopted", "shard_stopped", "stray_stopped"),
        about(replica_id=original["id"]),
        after=killed_at,
    )
    assert what_became_of_it.type == "replica_adopted", what_became_of_it
