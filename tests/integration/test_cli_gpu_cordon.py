"""`llmgw-cli cordon NODE --gpu N` and `uncordon NODE --gpu N` against a live admin API over
PostgreSQL: what is recorded and by whom, what `node`, `nodes`, `explain-placement` and
`history` say of it, and that it outlives the agent's reconnect and a restart of the
control plane, since it is in the log."""

from __future__ import annotations

import json
import secrets

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.events import NodeConnected, event_type, node_stream
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import gpu, record, seed_node, seed_serving_replica
from tests.support.operator_cli import OPERATOR, TOKEN, Operator, live_admin_api

pytestmark = pytest.mark.timeout(120)


def an_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


async def test_a_gpu_cordon_keeps_placements_off_it_is_shown_and_outlives_a_restart(
    operator: Operator, pg_store: PostgresEventStore, engine: AsyncEngine
) -> None:
    node = an_id("gpu")
    await seed_node(pg_store, node, gpus=4)
    replica = f"{an_id('llama')}-1"
    await seed_serving_replica(pg_store, replica, node)  # on GPU 0
    four_gpus = operator.home / "four.json"
    four_gpus.write_text(json.dumps({"command": "sim", "gpus_per_shard": 4}))

    cordoned = await operator.run("cordon", node, "--gpu", "0", "--reason", "ecc errors")
    again = await operator.run("cordon", node, "--gpu", "0")
    missing = await operator.run("cordon", node, "--gpu", "7", "--reason", "ecc errors")
    unknown = await operator.run("cordon", "gpu-nowhere", "--gpu", "0")
    explained = await operator.run(
        "explain-placement", "--spec", str(four_gpus), "--output", "json"
    )
    listed = await operator.run("nodes", "--output", "json")
    table = await operator.run("nodes")
    shown = await operator.run("node", node)
    history = await operator.run("history", "node", node, "--output", "json")
    still_serving = await operator.run("replica", replica, "--output", "json")

    assert cordoned.stdout == f"node {node}: GPU 0 cordoned by {OPERATOR}: ecc errors\n"
    assert again.stdout == (
        f"node {node}: GPU 0 already cordoned by {OPERATOR}: ecc errors; nothing recorded\n"
    )
    assert missing.code == 1
    assert f"node {node} has no GPU 7: its GPUs are 0, 1, 2, 3" in missing.stderr
    assert unknown.code == 1
    assert "no node 'gpu-nowhere' is known" in unknown.stderr
    [candidate] = [c for c in explained.json()["candidates"] if c["node_id"] == node]
    assert candidate["reasons"] == [
        f"needs 4 healthy GPU(s), has 3: GPU 0 cordoned by {OPERATOR}: ecc errors"
    ]
    [summary] = [n for n in listed.json() if n["id"] == node]
    assert (summary["cordoned"], summary["cordoned_gpus"], summary["free_gpus"]) == (False, [0], 3)
    assert "connected, GPU 0 cordoned" in table.stdout
    assert f"GPU 0 cordoned by {OPERATOR}: ecc errors" in shown.stdout
    told = [(e["actor"], e["type"], e["summary"]) for e in history.json()]
    cordon_told = f"node {node} GPU 0 ({gpu(0, node).uuid}) cordoned: ecc errors"
    assert (OPERATOR, "gpu_cordoned", cordon_told) in told
    assert still_serving.json()["phase"] == "serving"

    # The agent reconnects, listing the same GPUs; then a control plane starts afresh.
    await record(
        pg_store,
        f"agent:{node}",
        NodeConnected(
            node_id=node, address="127.0.0.7", gpus=tuple(gpu(i, node) for i in range(4))
        ),
    )
    async with live_admin_api(pg_store) as url:
        restarted = Operator(home=operator.home, admin_url=url)
        after_restart = await restarted.run("node", node, "--output", "json")
        uncordoned = await restarted.run("uncordon", node, "--gpu", "0")
        uncordoned_again = await restarted.run("uncordon", node, "--gpu", "0")

    [gpu_0, *_] = after_restart.json()["gpus"]
    assert (gpu_0["cordoned"], gpu_0["cordon_reason"], gpu_0["cordoned_by"]) == (
        True,
        "ecc errors",
        OPERATOR,
    )
    assert uncordoned.stdout == f"node {node}: GPU 0 uncordoned\n"
    assert uncordoned_again.stdout == f"node {node}: GPU 0 already uncordoned; nothing recorded\n"
    recorded = await pg_store.read_stream(node_stream(node))
    cordons = {"gpu_cordoned", "gpu_uncordoned"}
    assert [
        (event_type(r.event), r.meta.actor) for r in recorded if event_type(r.event) in cordons
    ] == [
        ("gpu_cordoned", OPERATOR),
        ("gpu_uncordoned", OPERATOR),
    ]


async def test_a_cordon_of_a_gpu_the_node_no_longer_lists_is_shown_and_can_be_lifted(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    """GPU 3 is cordoned, then pulled out of the machine: the agent's next hello lists 0-2.
    `node` still shows the cordon, saying the node does not list the GPU, and `uncordon
    --gpu 3` lifts it; a new cordon of GPU 3 is refused."""
    node = an_id("gpu")
    await seed_node(pg_store, node, gpus=4)
    assert (await operator.run("cordon", node, "--gpu", "3", "--reason", "ecc errors")).code == 0
    await record(
        pg_store,
        f"agent:{node}",
        NodeConnected(node_id=node, address="127.0.0.7", gpus=tuple(gpu(i) for i in range(3))),
    )

    shown = await operator.run("node", node)
    uncordoned = await operator.run("uncordon", node, "--gpu", "3")
    cordoned_again = await operator.run("cordon", node, "--gpu", "3", "--reason", "ecc errors")
    after = await operator.run("node", node, "--output", "json")

    assert f"GPU 3 (not listed by the node): cordoned by {OPERATOR}: ecc errors" in shown.stdout
    assert uncordoned.stdout == f"node {node}: GPU 3 uncordoned\n"
    assert cordoned_again.code == 1
    assert f"node {node} has no GPU 3: its GPUs are 0, 1, 2" in cordoned_again.stderr
    assert after.json()["unlisted_gpu_cordons"] == []
    recorded = await pg_store.read_stream(node_stream(node))
    assert [event_type(r.event) for r in recorded][-2:] == ["node_connected", "gpu_uncordoned"]


async def test_the_nodes_table_projects_each_gpus_cordon(
    operator: Operator, pg_store: PostgresEventStore, engine: AsyncEngine
) -> None:
    node = an_id("gpu")
    await seed_node(pg_store, node, gpus=2)

    assert (await operator.run("cordon", node, "--gpu", "1", "--reason", "xid 48")).code == 0

    async with engine.connect() as conn:
        gpus = (
            await conn.execute(text("SELECT gpus FROM nodes WHERE id = :id"), {"id": node})
        ).scalar_one()
    assert [(g["index"], g["cordoned"], g["cordon_reason"], g["cordoned_by"]) for g in gpus] == [
        (0, False, None, None),
        (1, True, "xid 48", OPERATOR),
    ]


async def test_a_path_that_names_no_gpu_index_is_refused_saying_what_one_is(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node = an_id("gpu")
    await seed_node(pg_store, node, gpus=2)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async with httpx.AsyncClient(base_url=operator.admin_url, headers=headers) as client:
        answers = [
            await client.post(f"/admin/v1/nodes/{node}/gpus/{gpu_index}/cordon")
            for gpu_index in ("abc", "-1", "+1", "1.0", "9" * 30)
        ]

    assert [a.status_code for a in answers] == [409] * 5
    assert "'abc' is not a GPU index: a GPU is named by its index, such as 3" in answers[0].text
    assert f"'{'9' * 20}…' is not a GPU index" in answers[4].text
    recorded = await pg_store.read_stream(node_stream(node))
    assert [type(r.event).__name__ for r in recorded] == ["NodeRegistered", "NodeConnected"]
