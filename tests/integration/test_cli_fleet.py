"""`llmgw-cli nodes`, `node`, `cordon`, `uncordon`, `replicas`, `replica`,
`explain-placement` against a live admin API, over nodes and replicas recorded as the agent
hub and the reconciler record them."""

from __future__ import annotations

import asyncio
import json
import secrets

import pytest

from app.domain.events import (
    GpuMarkedUnhealthy,
    ModelUnplaceable,
    NodeConnected,
    NodeDisconnected,
    NodeDrainFinished,
    NodeLost,
    ReplacementServing,
    ReplicaDrainStarted,
    ReplicaFailed,
    ReplicaLost,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStopped,
    ReplicaStopping,
    ShardFailed,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    ShardStopped,
    node_stream,
)
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import last_position, record, seed_node, seed_serving_replica
from tests.support.operator_cli import OPERATOR, OnTerminal, Operator
from tests.support.routing import declare_model
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def an_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def rows(table: str) -> list[list[str]]:
    """The cells of every body row of the tables in ``table``."""
    found = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0]:
            found.append(cells)
    return found


async def test_nodes_and_node_show_connection_gpus_health_and_the_replicas_there(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node, other = an_id("gpu"), an_id("gpu")
    await seed_node(pg_store, node, labels={"zone": "a"})
    await seed_node(pg_store, other)
    await record(
        pg_store,
        f"agent:{node}",
        GpuMarkedUnhealthy(node_id=node, gpu_index=1, reason="XID 79: fell off the bus", xid=79),
    )
    replica = f"{an_id('llama')}-1"
    await seed_serving_replica(pg_store, replica, node)

    listed, table, shown, detail = await asyncio.gather(
        operator.run("nodes", "--output", "json"),
        operator.run("nodes"),
        operator.run("node", node, "--output", "json"),
        operator.run("node", node),
    )

    by_id = {n["id"]: n for n in listed.json()}
    assert set(by_id) == {node, other}
    assert (by_id[node]["healthy_gpus"], by_id[node]["free_gpus"], by_id[node]["replicas"]) == (
        1,
        0,
        1,
    )
    [row] = [r for r in rows(table.stdout) if r[0] == node]
    assert row[1:5] == ["connected", "1/2", "0", "1"]
    assert row[6] == "zone=a"
    gpus = shown.json()["gpus"]
    assert [g["excluded_because"] for g in gpus] == [
        f"used by replica {replica}",
        "unhealthy: XID 79: fell off the bus",
    ]
    assert detail.code == 0, detail.stderr
    assert "unhealthy: XID 79: fell off the bus" in detail.stdout
    assert [r[:2] for r in rows(detail.stdout) if r[0] in {"0", "1"}] == [
        ["0", f"GPU-{node}-0"],
        ["1", f"GPU-{node}-1"],
    ]
    assert [r[:3] for r in rows(detail.stdout) if r[0] == replica] == [
        [replica, replica.rsplit("-", 1)[0], "serving"]
    ]


async def _a_node_away_and_one_back(pg_store: PostgresEventStore, *, lost: bool) -> tuple[str, str]:
    """Two nodes: one disconnected for want of heartbeats (and lost, with ``lost``), one
    disconnected and connected again; their ids."""
    away, back = an_id("gpu"), an_id("gpu")
    await seed_node(pg_store, away)
    await seed_node(pg_store, back)
    await record(
        pg_store,
        "hub",
        NodeDisconnected(node_id=away, reason="no heartbeat for 30s"),
        *([NodeLost(node_id=away, disconnected_for_s=300.0)] if lost else []),
        NodeDisconnected(node_id=back, reason="hello twice"),
        NodeConnected(node_id=back, address="127.0.0.7"),
    )
    return away, back


async def test_node_says_why_a_node_away_lost_its_connection_until_it_reconnects(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    away, back = await _a_node_away_and_one_back(pg_store, lost=True)

    shown, detail, shown_back, detail_back = await asyncio.gather(
        operator.run("node", away, "--output", "json"),
        operator.run("node", away),
        operator.run("node", back, "--output", "json"),
        operator.run("node", back),
    )

    connection = shown.json()["connection"]
    assert (connection["lost"], connection["disconnect_reason"]) == (True, "no heartbeat for 30s")
    assert detail.code == 0, detail.stderr
    assert "disconnected: no heartbeat for 30s" in detail.stdout
    assert shown_back.json()["connection"]["disconnect_reason"] is None
    assert "hello twice" not in detail_back.stdout


async def test_nodes_lists_why_each_node_away_lost_its_connection(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    away, back = await _a_node_away_and_one_back(pg_store, lost=False)

    listed, table = await asyncio.gather(
        operator.run("nodes", "--output", "json"),
        operator.run("nodes", "--output", "wide"),
    )

    by_id = {n["id"]: n for n in listed.json()}
    assert by_id[away]["disconnect_reason"] == "no heartbeat for 30s"
    assert by_id[back]["disconnect_reason"] is None
    assert table.code == 0, table.stderr
    [header] = [line for line in table.stdout.splitlines() if "┃ node " in line]
    assert header.split("┃")[-2].strip() == "disconnected"
    by_row = {r[0]: r for r in rows(table.stdout)}
    assert by_row[away][-1] == "no heartbeat for 30s"
    assert by_row[back][-1] == ""


async def test_cordon_and_uncordon_are_recorded_as_the_operator_and_say_when_nothing_changed(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node = an_id("gpu")
    await seed_node(pg_store, node)

    cordoned = await operator.run("cordon", node, "--reason", "fan noise")
    recut = await operator.run("cordon", node, "--reason", "ECC errors on GPU 3")
    again = await operator.run("cordon", node, "--reason", "ECC errors on GPU 3")
    bare = await operator.run("cordon", node)
    shown = await operator.run("node", node, "--output", "json")
    uncordoned = await operator.run("uncordon", node, "--output", "json")
    uncordoned_again = await operator.run("uncordon", node)
    unknown = await operator.run("cordon", "gpu-nowhere")

    assert cordoned.stdout == f"node {node}: cordoned: fan noise\n"
    assert recut.stdout == f"node {node}: cordoned: ECC errors on GPU 3\n"
    unchanged = f"node {node}: already cordoned: ECC errors on GPU 3; nothing recorded\n"
    assert (again.stdout, bare.stdout) == (unchanged, unchanged)
    assert (shown.json()["cordoned"], shown.json()["cordon_reason"]) == (
        True,
        "ECC errors on GPU 3",
    )
    assert (uncordoned.json()["changed"], uncordoned.json()["node"]["cordoned"]) == (True, False)
    # The same form as every cordon's and uncordon's no-op, a GPU's too (before: ", nothing").
    assert uncordoned_again.stdout == f"node {node}: already uncordoned; nothing recorded\n"
    recorded = (await pg_store.read_stream(node_stream(node)))[-3:]
    assert [(type(r.event).__name__, r.meta.actor) for r in recorded] == [
        ("NodeCordoned", OPERATOR),
        ("NodeCordoned", OPERATOR),
        ("NodeUncordoned", OPERATOR),
    ]
    assert [getattr(r.event, "reason", None) for r in recorded] == [
        "fan noise",
        "ECC errors on GPU 3",
        None,
    ]
    assert unknown.code == 1
    assert "no node 'gpu-nowhere' is known" in unknown.stderr


async def test_replicas_filter_and_replica_shows_a_failed_shards_error_and_engine_log(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node = an_id("gpu")
    await seed_node(pg_store, node)
    serving = f"{an_id('llama')}-1"
    await seed_serving_replica(pg_store, serving, node)
    model = an_id("qwen")
    failed = f"{model}-1"
    shard = ShardPlacement(index=0, node_id=node, gpus=(1,), port=20001)
    await record(
        pg_store,
        "reconciler",
        ReplicaPlaced(replica_id=failed, model=model, number=1, shards=(shard,)),
    )
    await record(
        pg_store,
        f"agent:{node}",
        ShardFailed(
            replica_id=failed,
            shard_index=0,
            node_id=node,
            error="exited with code 1",
            exit_code=1,
            log_tail=("loading weights", OOM),
        ),
    )

    on_node, of_model, in_phase, shown, detail = await asyncio.gather(
        operator.run("replicas", "--node", node, "--output", "json"),
        operator.run("replicas", "--model", model, "--output", "json"),
        operator.run("replicas", "--phase", "serving"),
        operator.run("replica", failed, "--output", "json"),
        operator.run("replica", failed),
    )

    assert sorted(r["id"] for r in on_node.json()) == sorted([serving, failed])
    assert [r["id"] for r in of_model.json()] == [failed]
    assert [r[0] for r in rows(in_phase.stdout) if r[0] != "replica"] == [serving]
    [failed_shard] = shown.json()["shards"]
    assert (failed_shard["phase"], failed_shard["exit_code"]) == ("failed", 1)
    assert failed_shard["log_tail"] == ["loading weights", OOM]
    assert detail.code == 0, detail.stderr
    assert "exited with code 1 (exit code 1)" in detail.stdout
    assert "engine log of shard 0 (last lines):\n  loading weights\n" in detail.stdout
    assert f"  {OOM}\n" in detail.stdout


async def test_replica_shows_a_lost_replica_s_shard_lost_and_why_an_agent_stopped_one(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node = an_id("gpu")
    await seed_node(pg_store, node)
    lost = f"{an_id('llama')}-1"
    await seed_serving_replica(pg_store, lost, node)
    await record(
        pg_store,
        f"agent:{node}",
        ShardStarting(replica_id=lost, shard_index=0, node_id=node, pid=4242),
        ShardReady(replica_id=lost, shard_index=0, node_id=node),
    )
    await record(pg_store, "reconciler", ReplicaLost(replica_id=lost, reason=f"node {node} lost"))
    parked = f"{an_id('llama')}-1"
    await seed_serving_replica(pg_store, parked, node)
    stop = ShardStopped(
        replica_id=parked, shard_index=0, node_id=node, reason="agent shutting down"
    )
    await record(pg_store, f"agent:{node}", stop)

    lost_json, lost_table, parked_json, parked_table = await asyncio.gather(
        operator.run("replica", lost, "--output", "json"),
        operator.run("replica", lost),
        operator.run("replica", parked, "--output", "json"),
        operator.run("replica", parked),
    )

    [lost_shard] = lost_json.json()["shards"]
    assert (lost_json.json()["phase"], lost_shard["phase"]) == ("lost", "lost")
    assert "ready" not in [row[4] for row in rows(lost_table.stdout) if len(row) > 4]
    [parked_shard] = parked_json.json()["shards"]
    assert parked_json.json()["phase"] == "placed"
    assert (parked_shard["phase"], parked_shard["stop_reason"]) == (
        "stopped",
        "agent shutting down",
    )
    assert "stopped by its agent: agent shutting down" in parked_table.stdout


async def test_explain_placement_gives_every_nodes_reason_for_a_model_or_a_spec_on_trial(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    free, cordoned = an_id("gpu"), an_id("gpu")
    await seed_node(pg_store, free)
    await seed_node(pg_store, cordoned)
    assert (await operator.run("cordon", cordoned, "--reason", "new firmware")).code == 0
    model = an_id("llama")
    declared = operator.home / "llama.yaml"
    declared.write_text(f"name: {model}\ncommand: sim --port {{port}}\nreplicas: 0\n")
    assert (await operator.run("models", "apply", str(declared))).code == 0
    too_big = operator.home / "big.json"
    too_big.write_text(json.dumps({"command": "sim", "gpus_per_shard": 4}))

    for_model, table, trial, neither, both = await asyncio.gather(
        operator.run("explain-placement", model, "--output", "json"),
        operator.run("explain-placement", model),
        operator.run("explain-placement", "--spec", str(too_big), "--output", "json"),
        operator.run("explain-placement"),
        operator.run("explain-placement", model, "--spec", str(too_big)),
    )

    explained = for_model.json()
    assert explained["placeable"]
    reasons = {c["node_id"]: c["reasons"] for c in explained["candidates"]}
    assert reasons == {free: [], cordoned: ["cordoned (new firmware)"]}
    assert f"{model}: placeable" in table.stdout
    [row] = [r for r in rows(table.stdout) if r[0] == cordoned]
    assert (row[1], row[-1]) == ("no", "cordoned (new firmware)")
    assert not trial.json()["placeable"]
    assert trial.json()["summary"].startswith("needs 1 node(s) with 4 healthy free GPU(s)")
    assert (neither.code, both.code) == (2, 2)
    assert "give a model name or --spec FILE" in neither.stderr


async def test_explain_placement_counts_the_model_s_failures_on_each_node_in_the_table(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    failed_on, fresh = an_id("gpu"), an_id("gpu")
    await seed_node(pg_store, failed_on)
    await seed_node(pg_store, fresh)
    model = an_id("gemma")
    await declare_model(pg_store, model, replicas=0)
    shard = ShardPlacement(index=0, node_id=failed_on, gpus=(0,), port=20000)
    await record(
        pg_store,
        "reconciler",
        ReplicaPlaced(replica_id=f"{model}-1", model=model, number=1, shards=(shard,)),
        ReplicaFailed(replica_id=f"{model}-1", reason="engine exited with code 1"),
    )

    table = await operator.run("explain-placement", model, "--output", "wide")

    assert table.code == 0, table.stderr
    [header] = [line for line in table.stdout.splitlines() if "┃ node " in line]
    assert header.split("┃")[-2].strip() == "failed here"
    failed_here = {r[0]: r[-1] for r in rows(table.stdout)}
    assert (failed_here[failed_on], failed_here[fresh]) == ("1", "0")


async def test_drain_wait_on_a_terminal_shows_the_move_live_until_the_drain_completes(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node, other = an_id("gpu"), an_id("gpu")
    await seed_node(pg_store, node)
    await seed_node(pg_store, other)
    model = an_id("llama")
    original, replacement = f"{model}-1", f"{model}-2"
    await seed_serving_replica(pg_store, original, node)
    started = await operator.run("drain", node, "--output", "json")
    drain_id = started.json()["drain_id"]
    watcher = OnTerminal.start(operator, "drain-progress", drain_id, "--wait")
    try:
        await wait_until(lambda: "moving" in watcher.text(), what="the live view")
        # The reconciler's steps, recorded while the operator watches.
        shard = ShardPlacement(index=0, node_id=other, gpus=(0,), port=20000)
        await record(
            pg_store,
            "reconciler",
            ReplicaDrainStarted(replica_id=original, drain_id=drain_id, reason="node drains"),
            ReplicaPlaced(
                replica_id=replacement, model=model, number=2, shards=(shard,), replaces=original
            ),
            correlation_id=drain_id,
        )
        await wait_until(lambda: "replica_placed" in watcher.text(), what="the placement shown")
        await record(pg_store, "reconciler", ReplicaServing(replica_id=replacement))
        await record(
            pg_store,
            "reconciler",
            ReplacementServing(replica_id=original, replacement_id=replacement),
            ReplicaStopping(replica_id=original, reason=f"drain {drain_id}: replaced"),
            ReplicaStopped(replica_id=original),
            NodeDrainFinished(node_id=node, drain_id=drain_id, outcome="every replica moved"),
            correlation_id=drain_id,
        )
        code = await watcher.exit_code()
    finally:
        watcher.kill()

    assert code == 0, watcher.text()
    shown = watcher.text()
    assert f"{drain_id} drains node {node}, requested by {OPERATOR}" in shown
    assert "done: every replica moved" in shown
    assert f"replaced by {replacement}" in shown


async def test_a_drain_says_up_front_which_replica_has_nowhere_to_go_and_require_room_refuses_it(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node, other = an_id("gpu"), an_id("gpu")
    await seed_node(pg_store, node)
    await seed_node(pg_store, other, gpus=1)  # room for one replacement
    model = an_id("llama")
    await declare_model(pg_store, model, replicas=2)
    first, second = f"{model}-1", f"{model}-2"
    await record(
        pg_store,
        "reconciler",
        *(
            event
            for number in (1, 2)
            for event in (
                ReplicaPlaced(
                    replica_id=f"{model}-{number}",
                    model=model,
                    number=number,
                    shards=(
                        ShardPlacement(
                            index=0, node_id=node, gpus=(number - 1,), port=20000 + number
                        ),
                    ),
                ),
                ReplicaServing(replica_id=f"{model}-{number}"),
            )
        ),
    )
    no_room = (
        "needs 1 node(s) with 1 healthy free GPU(s), 0 eligible of 2: 1 draining, "
        "1 not enough healthy free GPUs; each node counted once, under the first check it fails"
    )
    before = await last_position(pg_store)

    refused = await operator.run("drain", node, "--require-room")

    assert refused.code == 1, refused.stderr
    assert await last_position(pg_store) == before  # nothing recorded
    assert refused.stdout == ""
    assert refused.stderr.splitlines() == [
        f"llmgw-cli drain: node {node} was not drained: 1 of 2 replica(s) on it have nowhere "
        "to go now; nothing was recorded",
        f"  {second} has nowhere to go now: {no_room} (llmgw-cli explain-placement {model})",
    ]

    started = await operator.run("drain", node, "--grace", "900")

    assert started.code == 0, started.stderr
    assert started.stderr.splitlines() == [
        f"warning: {second} has nowhere to go now: {no_room} (llmgw-cli explain-placement "
        f"{model}); when the 900s grace runs out it is stopped, not moved"
    ]
    assert first not in started.stderr  # its replacement takes the room there is
    assert "draining node" in started.stdout
    drain_id = started.stdout.split(":")[0]
    progress = (await operator.run("drain-progress", drain_id, "--output", "json")).json()
    assert progress["node_id"] == node


async def test_a_drain_with_nowhere_to_move_says_why_and_when_its_grace_runs_out(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node = an_id("gpu")
    await seed_node(pg_store, node)
    model = an_id("llama")
    await declare_model(pg_store, model)
    original = f"{model}-1"
    await seed_serving_replica(pg_store, original, node)
    started = await operator.run("drain", node, "--grace", "900", "--output", "json")
    drain_id = started.json()["drain_id"]
    full = "needs 1 node(s) with 1 healthy free GPU(s), 0 eligible of 1: 1 draining"
    await record(
        pg_store,
        "reconciler",
        ReplicaDrainStarted(replica_id=original, drain_id=drain_id, reason="node drains"),
        correlation_id=drain_id,
    )
    await record(pg_store, "reconciler", ModelUnplaceable(model=model, reason=full))

    shown, answer = await asyncio.gather(
        operator.run("drain-progress", drain_id, "--output", "wide"),
        operator.run("drain-progress", drain_id, "--output", "json"),
    )

    [move] = answer.json()["moves"]
    assert (move["replica_id"], move["replacement_id"], move["waiting_for"]) == (
        original,
        None,
        full,
    )
    requested = answer.json()["requested_at"]
    assert answer.json()["grace_ends_at"] > requested
    text = " ".join(shown.stdout.split())
    assert f"{original} waits for a replacement: {full} (llmgw-cli explain-placement {model})" in (
        text
    )
    assert "the grace runs out: what is still on the node then is stopped, not moved" in text


async def test_replicas_of_a_model_the_cluster_does_not_know_is_an_error_not_an_empty_list(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    idle = an_id("idle")
    await declare_model(pg_store, idle, replicas=0)
    nope = an_id("nope")

    unknown, unknown_json, known_without_replicas = await asyncio.gather(
        operator.run("replicas", "--model", nope),
        operator.run("replicas", "--model", nope, "--output", "json"),
        operator.run("replicas", "--model", idle, "--output", "json"),
    )

    assert (unknown.code, unknown.stdout) == (1, "")
    assert f"no model '{nope}' is known" in unknown.stderr
    assert (unknown_json.code, unknown_json.stdout) == (1, "")
    assert known_without_replicas.code == 0, known_without_replicas.stderr
    assert known_without_replicas.json() == []


async def test_replicas_on_a_node_the_cluster_does_not_know_is_an_error_not_an_empty_list(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    idle = an_id("gpu")
    await seed_node(pg_store, idle)
    nope = an_id("nope")

    unknown, unknown_json, known_without_replicas = await asyncio.gather(
        operator.run("replicas", "--node", nope),
        operator.run("replicas", "--node", nope, "--output", "json"),
        operator.run("replicas", "--node", idle, "--output", "json"),
    )

    assert (unknown.code, unknown.stdout) == (1, "")
    assert f"no node '{nope}' is known" in unknown.stderr
    assert (unknown_json.code, unknown_json.stdout) == (1, "")
    assert known_without_replicas.code == 0, known_without_replicas.stderr
    assert known_without_replicas.json() == []
