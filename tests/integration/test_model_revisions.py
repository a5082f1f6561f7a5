"""Model revisions as an operator meets them: `models apply` of a changed command is
revision 2, the admin API and `llmgw-cli models`, `model`, `replicas`, `replica` and
`history model` show it and mark the replicas that still run revision 1, the projection
tables carry it, and a rebuild of them from the log agrees."""

from __future__ import annotations

import asyncio
import json
import re
import secrets

import pytest

from app.domain.events import (
    ModelDeclared,
    ReplicaPlaced,
    ReplicaServing,
    RolloutStarted,
    ShardPlacement,
    model_stream,
)
from app.store.database import connection
from app.store.postgres import PostgresEventStore
from app.store.rebuild import rebuild
from tests.support.admin_server import record, seed_node, seed_serving_replica
from tests.support.operator_cli import Operator

pytestmark = pytest.mark.timeout(120)

SECRET = f"hf_{secrets.token_hex(8)}"


def spec_yaml(name: str, command: str, *, replicas: int = 2, extra: str = "") -> str:
    return f"name: {name}\ncommand: {command}\nreplicas: {replicas}\n{extra}"


async def apply(operator: Operator, text: str, *args: str) -> str:
    path = operator.home / f"spec-{secrets.token_hex(3)}.yaml"
    path.write_text(text)
    applied = await operator.run("models", "apply", str(path), *args)
    assert applied.code == 0, applied.stderr
    return applied.stdout


async def test_a_changed_command_is_revision_2_and_replicas_on_revision_1_are_marked(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    name = f"llama-{secrets.token_hex(3)}"
    old_command = "vllm serve {model} --port {port}"
    new_command = "vllm serve {model} --port {port} --enable-prefix-caching"
    first = await apply(operator, spec_yaml(name, old_command))
    await seed_node(pg_store, "gpu-1")
    await seed_serving_replica(pg_store, f"{name}-1", "gpu-1")
    await seed_serving_replica(pg_store, f"{name}-2", "gpu-1")

    second = await apply(
        operator, spec_yaml(name, new_command, extra=f"env: {{HF_ENDPOINT: {SECRET}}}\n")
    )
    shard = ShardPlacement(index=0, node_id="gpu-1", gpus=(1,), port=20001)
    await record(
        pg_store,
        "reconciler",
        ReplicaPlaced(replica_id=f"{name}-3", model=name, number=3, shards=(shard,), revision=2),
        ReplicaServing(replica_id=f"{name}-3"),
    )
    models, model, table, replicas, replicas_table, replica, history = await asyncio.gather(
        operator.run("models", "--output", "json"),
        operator.run("model", name),
        operator.run("models", "--output", "wide"),
        operator.run("replicas", "--model", name, "--output", "json"),
        operator.run("replicas", "--model", name, "--output", "wide"),
        operator.run("replica", f"{name}-1"),
        operator.run("history", "model", name, "--output", "wide"),
    )

    assert first == f"model {name}: declared\n"
    assert second == (
        f"model {name}: declared, revision 2\n"
        f"  2 replicas placed with another revision keep running it until replaced: "
        f"{name}-1, {name}-2\n"
    )
    [listed] = models.json()
    assert (listed["revision"], listed["outdated"]) == (2, [f"{name}-1", f"{name}-2"])
    assert re.search(r"^revision:\s+2$", model.stdout, re.MULTILINE), model.stdout
    assert f"{name}-1, {name}-2 run(s) another revision until replaced" in " ".join(
        model.stdout.split()
    )
    [model_row] = [line for line in table.stdout.splitlines() if name in line]
    assert "2 (2 old)" in model_row
    answers = {r["id"]: (r["revision"], r["current_revision"]) for r in replicas.json()}
    assert answers == {f"{name}-1": (1, 2), f"{name}-2": (1, 2), f"{name}-3": (2, 2)}
    rows = {
        line.split("│")[1].strip(): line
        for line in replicas_table.stdout.splitlines()
        if f"{name}-" in line
    }
    assert "1 (current 2)" in rows[f"{name}-1"]
    assert "current" not in rows[f"{name}-3"]
    assert "1 (current 2): it runs the spec it was placed with until it is replaced" in " ".join(
        replica.stdout.split()
    )
    revised = [line for line in history.stdout.splitlines() if "revision 2:" in line]
    assert len(revised) == 1, history.stdout
    assert "command" in revised[0]
    assert "env: added HF_ENDPOINT" in revised[0]
    assert SECRET not in history.stdout
    stream = await pg_store.read_stream(model_stream(name))
    declarations = [e.event for e in stream if isinstance(e.event, ModelDeclared)]
    assert [e.revision for e in declarations] == [1, 2]
    started = [e.event for e in stream if isinstance(e.event, RolloutStarted)]
    assert [(e.from_revision, e.revision) for e in started] == [(1, 2)]


async def test_routing_and_replica_count_changes_keep_the_revision_and_take_effect_at_once(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    name = f"qwen-{secrets.token_hex(3)}"
    command = "sglang serve {model} --port {port}"
    await apply(operator, spec_yaml(name, command))

    rescaled = await apply(operator, spec_yaml(name, command, replicas=4), "--output", "json")
    rerouted = await apply(
        operator,
        spec_yaml(name, command, replicas=4, extra="routing: {weight: 2.5}\n"),
        "--output",
        "json",
    )

    [rescaled_change], [rerouted_change] = json.loads(rescaled), json.loads(rerouted)
    assert rescaled_change["changed"]
    assert rerouted_change["changed"]
    assert (rescaled_change["model"]["revision"], rerouted_change["model"]["revision"]) == (1, 1)
    shown = (await operator.run("model", name, "--output", "json")).json()
    assert (shown["revision"], shown["desired"], shown["spec"]["routing"]["weight"]) == (1, 4, 2.5)
    events = await pg_store.read_stream(model_stream(name))
    assert [e.event.revision for e in events] == [1, 1, 1]  # type: ignore[union-attr]


async def test_the_tables_carry_revisions_and_a_rebuild_from_the_log_agrees(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    name = f"mistral-{secrets.token_hex(3)}"
    await apply(operator, spec_yaml(name, "vllm serve {model} --port {port}"))
    await seed_node(pg_store, "gpu-1")
    await seed_serving_replica(pg_store, f"{name}-1", "gpu-1")
    await apply(
        operator, spec_yaml(name, "vllm serve {model} --port {port}", extra="gpus_per_shard: 2\n")
    )
    shard = ShardPlacement(index=0, node_id="gpu-1", gpus=(2, 3), port=20002)
    await record(
        pg_store,
        "reconciler",
        ReplicaPlaced(replica_id=f"{name}-2", model=name, number=2, shards=(shard,), revision=2),
    )

    async with connection(pg_store.engine) as db:
        model_revision = await db.fetchval("SELECT revision FROM models WHERE name = $1", name)
        replica_revisions = await db.fetch(
            "SELECT id, revision FROM replicas WHERE model = $1 ORDER BY id", name
        )
    report = await rebuild(pg_store.engine, verify=True)

    assert model_revision == 2
    assert [tuple(r) for r in replica_revisions] == [(f"{name}-1", 1), (f"{name}-2", 2)]
    assert report.differences == []
