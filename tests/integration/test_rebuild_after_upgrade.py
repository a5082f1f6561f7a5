"""``projections rebuild --verify`` after an upgrade: a model's row as the older release
projected it, its spec without the fields added since, is no difference from the log; a
field whose value differs still is."""

from __future__ import annotations

import json
import secrets
from typing import Any

from app.domain.events import ModelDeclared
from app.store.codec import decode_event
from app.store.database import connection
from app.store.postgres import PostgresEventStore
from app.store.rebuild import rebuild
from tests.support.admin_server import record

# What llmgw 41d815f (schema revision 0013) appended for `models apply` of a model, and
# projected as the model's `spec` column: its rollout policy has no `min_latency_samples`.
OLD_MODEL_DECLARED = """{"spec": {"env": {}, "apis": ["chat", "completions"], "name": "demo",
"engine": "vllm", "command": "llmgw-sim-engine --port {port} --model {model}",
"rollout": {"steps": [{"hold_s": 5.0, "traffic": 0.5, "replicas": 1}], "max_surge": 1,
"max_failures": 2, "min_requests": 20, "max_unavailable": 0, "max_latency_ratio": 1.2,
"stability_window_s": null, "max_error_rate_increase": 0.01}, "routing": {"policy":
"least_loaded", "weight": 1.0, "kv_ceiling": 0.8, "load_factor": 0.25, "prefix_bytes": 1024,
"session_keys": ["header", "prompt_cache_key", "user"], "max_in_flight": null,
"target_waiting": 5}, "replicas": 2, "autoscale": null, "max_moves": 1, "stop_grace_s": 30.0,
"node_selector": {}, "gpu_memory_gib": 0.0, "gpus_per_shard": 1, "startup_timeout_s": 60.0,
"shards_per_replica": 1}, "type": "model_declared", "model": "demo", "changes": [],
"revision": 1}"""


def old_payload(name: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(OLD_MODEL_DECLARED)
    payload["model"] = payload["spec"]["name"] = name
    return payload


async def declare_as_the_old_release_did(store: PostgresEventStore, name: str) -> None:
    """The old event, read as this release reads it, appended; and the model's row put back
    to what the old release projected from it."""
    payload = old_payload(name)
    event = decode_event(0, "model_declared", 1, json.dumps(payload))
    assert isinstance(event, ModelDeclared)
    assert event.spec.rollout.min_latency_samples == 50  # the default fills the gap
    await record(store, "alice", event)
    await write_spec(store, name, payload["spec"])


async def write_spec(store: PostgresEventStore, name: str, spec: dict[str, Any]) -> None:
    async with connection(store.engine) as db:
        await db.execute(
            "UPDATE models SET spec = $1::jsonb WHERE name = $2", json.dumps(spec), name
        )


def differences_of(report: Any, name: str) -> list[tuple[str, str, list[str]]]:
    return [
        (d.table, d.key, sorted(d.columns))
        for d in report.differences
        if d.table == "models" and d.key == name
    ]


async def test_a_spec_projected_by_an_older_release_verifies_without_difference(
    pg_store: PostgresEventStore,
) -> None:
    """It used to differ (``spec: table has {...} log implies {... 'min_latency_samples':
    50}``), and ``--verify`` exited 1 right after every upgrade."""
    name = f"demo-{secrets.token_hex(3)}"
    await declare_as_the_old_release_did(pg_store, name)

    report = await rebuild(pg_store.engine, verify=True)

    assert differences_of(report, name) == []


async def test_a_spec_field_that_differs_from_the_log_is_still_a_difference(
    pg_store: PostgresEventStore,
) -> None:
    name = f"demo-{secrets.token_hex(3)}"
    await declare_as_the_old_release_did(pg_store, name)
    tampered = old_payload(name)["spec"] | {"max_moves": 2}
    await write_spec(pg_store, name, tampered)

    report = await rebuild(pg_store.engine, verify=True)
    (difference,) = [d for d in report.differences if d.key == name]
    live, implied = difference.columns["spec"]

    assert differences_of(report, name) == [("models", name, ["spec"])]
    assert (live["max_moves"], implied["max_moves"]) == (2, 1)
    assert implied["rollout"]["min_latency_samples"] == 50
