"""Operators at the admin API: the Litestar app served by uvicorn on a loopback socket in
this process and event loop, over real HTTP, against a fresh PostgreSQL database per test.
Nodes and replicas are seeded through the store, as the agent hub and the reconciler would
record them; everything else goes through the API."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.decision import Draft
from app.domain.drain import drain_moves
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    GpuMarkedUnhealthy,
    ModelScaled,
    NodeCordoned,
    NodeDrainCancelled,
    NodeDrainFinished,
    NodeDrainRequested,
    ReplicaDrainStarted,
    ReplicaFailed,
    ReplicaPlaced,
    ShardFailed,
    ShardPlacement,
    model_stream,
    node_stream,
    replica_stream,
)
from app.domain.state import ClusterState
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import (
    bearer_client,
    record,
    seed_node,
    seed_serving_replica,
    serving_admin,
)

OPERATOR = "alice"
TOKEN = secrets.token_hex(16)
LLAMA: dict[str, Any] = {
    "name": "llama",
    "command": "vllm serve {model} --port {port}",
    "replicas": 2,
    "gpu_memory_gib": 40,
}


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with admin_client(pg_store) as client:
        yield client


@asynccontextmanager
async def admin_client(store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    """An operator's HTTP client of the admin API served over ``store``."""
    async with (
        serving_admin(store, tokens={TOKEN: OPERATOR}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        yield client


async def events_of(store: PostgresEventStore, stream: str) -> list[Recorded]:
    return await store.read_stream(stream)


# -- models ------------------------------------------------------------------------------


async def test_applying_a_spec_twice_records_one_event(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    first = await admin.put("/admin/v1/models/llama", json=LLAMA)
    second = await admin.put("/admin/v1/models/llama", json=LLAMA)

    assert first.status_code == 200, first.text
    assert (first.json()["changed"], second.json()["changed"]) == (True, False)
    [declared] = await events_of(pg_store, model_stream("llama"))
    assert declared.meta.actor == OPERATOR
    shown = (await admin.get("/admin/v1/models/llama")).json()
    assert shown["spec"]["command"] == LLAMA["command"]
    assert shown["spec"]["gpus_per_shard"] == 1  # left out, so the default
    assert (shown["desired"], shown["serving"]) == (2, 0)
    assert shown["below_desired_because"] == ["2 replica(s) not placed yet"]
    assert [m["name"] for m in (await admin.get("/admin/v1/models")).json()] == ["llama"]


async def test_a_request_is_logged_once_with_its_id_which_correlates_its_events(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    with structlog.testing.capture_logs() as logs:
        answer = await admin.put(
            "/admin/v1/models/llama", json=LLAMA, headers={"x-request-id": "ticket-4711"}
        )

    assert answer.headers["x-request-id"] == "ticket-4711"
    [line] = [entry for entry in logs if entry["event"] == "admin_request"]
    assert (line["method"], line["path"], line["status"]) == ("PUT", "/admin/v1/models/llama", 200)
    assert line["actor"] == OPERATOR
    [declared] = await events_of(pg_store, model_stream("llama"))
    assert declared.meta.correlation_id == "ticket-4711"
    unnamed = await admin.get("/admin/v1/models")
    assert unnamed.headers["x-request-id"].startswith("req-")


async def test_an_invalid_spec_is_refused_naming_every_field_and_nothing_is_written(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    invalid = LLAMA | {"command": "vllm {nope}", "replicas": -1, "routing": {"weight": 0}}

    answers = [
        await admin.put("/admin/v1/models/llama", json=invalid),
        await admin.put("/admin/v1/models/llama", json=LLAMA | {"replica": 3}),
        await admin.put("/admin/v1/models/llama", json=LLAMA | {"replicas": "three"}),
        await admin.put("/admin/v1/models/llama", json=LLAMA | {"name": "qwen"}),
    ]

    assert [a.status_code for a in answers] == [422] * 4
    assert answers[0].headers["content-type"].startswith("application/problem+json")
    assert [(e["field"], e["reason"]) for e in answers[0].json()["errors"]] == [
        ("command", "unknown placeholder(s) nope; known: " + KNOWN_PLACEHOLDERS),
        ("replicas", "must be between 0 and 10000"),
        ("routing.weight", "must be between 0.001 and 1000000"),
    ]
    assert answers[1].json()["errors"] == [
        {"field": "replica", "reason": "is not a field of a model spec: did you mean replicas?"}
    ]
    assert answers[2].json()["errors"] == [
        {"field": "replicas", "reason": "expected `int`, got `str`"}
    ]
    assert answers[3].json()["errors"][0]["field"] == "name"
    assert await pg_store.last_position() == 0


KNOWN_PLACEHOLDERS = "gpu_count, gpus, host, leader, model, peers, port, rank, world_size"


async def test_scaling_records_the_count_and_an_unknown_model_is_a_404(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await admin.put("/admin/v1/models/llama", json=LLAMA)

    scaled = await admin.post("/admin/v1/models/llama/scale", json={"replicas": 3})
    unknown = await admin.post("/admin/v1/models/mistral/scale", json={"replicas": 3})

    assert scaled.status_code == 200, scaled.text
    assert scaled.json()["model"]["desired"] == 3
    assert [e.event for e in await events_of(pg_store, model_stream("llama"))][1:] == [
        ModelScaled(model="llama", replicas=3, previous=2)
    ]
    assert unknown.status_code == 404
    assert (unknown.json()["title"], unknown.json()["id"]) == ("unknown-model", "mistral")


async def test_an_operator_who_decided_on_a_stale_state_gets_a_409_not_a_lost_update(
    engine: AsyncEngine,
) -> None:
    """Bob scales the model in the moment between Alice's request loading the log and
    appending its decision: Alice's scale is refused, Bob's stands."""
    bob = PostgresEventStore(engine)
    alice_store = InterruptedStore(engine)
    async with admin_client(alice_store) as alice:
        await alice.put("/admin/v1/models/llama", json=LLAMA)
        await bob.catch_up()

        async def bob_scales() -> None:
            scaled = ModelScaled(model="llama", replicas=5, previous=2)
            await bob.append(model_stream("llama"), 1, [NewEvent(scaled)], Meta(actor="bob"))

        alice_store.after_next_load = bob_scales
        refused = await alice.post("/admin/v1/models/llama/scale", json={"replicas": 3})
        shown = (await alice.get("/admin/v1/models/llama")).json()

    assert refused.status_code == 409, refused.text
    assert "nothing was written" in refused.json()["detail"]
    assert shown["desired"] == 5
    assert [e.meta.actor for e in await bob.read_stream(model_stream("llama"))] == [
        OPERATOR,
        "bob",
    ]


class InterruptedStore(PostgresEventStore):
    """A real store that lets another writer in right after it next loads the log."""

    after_next_load: Callable[[], Awaitable[None]] | None = None

    async def catch_up(self) -> ClusterState:
        state = await super().catch_up()
        interruption, self.after_next_load = self.after_next_load, None
        if interruption is not None:
            await interruption()
        return state


# -- placement ---------------------------------------------------------------------------


async def test_placement_is_explained_for_every_node_with_every_reason(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    for node_id in ("gpu-1", "gpu-2", "gpu-3"):
        await seed_node(pg_store, node_id, gpus=1)
    await record(
        pg_store,
        "agent:gpu-1",
        GpuMarkedUnhealthy(node_id="gpu-1", gpu_index=0, reason="XID 79: fell off the bus", xid=79),
    )
    await record(pg_store, OPERATOR, NodeCordoned(node_id="gpu-2", reason="new firmware"))
    await admin.put("/admin/v1/models/llama", json=LLAMA)

    declared = await admin.get("/admin/v1/models/llama/placement")
    dry_run = await admin.post("/admin/v1/placement", json={"command": "x", "gpus_per_shard": 2})
    invalid_dry_run = await admin.post("/admin/v1/placement", json={"command": ""})

    assert declared.status_code == 200, declared.text
    explained = declared.json()
    assert explained["placeable"]
    assert explained["placement"] == [{"index": 0, "node_id": "gpu-3", "gpus": [0], "port": 20000}]
    assert explained["summary"].startswith("would place on gpu-3 (GPUs 0, port 20000")
    reasons = {c["node_id"]: c["reasons"] for c in explained["candidates"]}
    assert reasons == {
        "gpu-1": [
            "needs 1 healthy GPU(s) with 40 GiB free, has 0: GPU 0 unhealthy "
            "(XID 79: fell off the bus)"
        ],
        "gpu-2": ["cordoned (new firmware)"],
        "gpu-3": [],
    }
    assert dry_run.status_code == 200, dry_run.text
    assert not dry_run.json()["placeable"]
    assert dry_run.json()["summary"] == (
        "needs 1 node(s) with 2 healthy free GPU(s), 0 eligible of 3: "
        "1 cordoned, 2 not enough healthy free GPUs; each node counted once, under the first "
        "check it fails"
    )
    assert invalid_dry_run.status_code == 422
    assert await pg_store.last_position() > 0  # seeded, but the dry runs recorded nothing
    assert len(await events_of(pg_store, model_stream("dry-run"))) == 0
    gpus = (await admin.get("/admin/v1/nodes/gpu-1")).json()["gpus"]
    assert gpus[0]["excluded_because"] == "unhealthy: XID 79: fell off the bus"


async def test_placement_passes_over_the_node_a_model_just_failed_on_and_says_so(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seed_node(pg_store, "gpu-a", gpus=1)
    await seed_node(pg_store, "gpu-b", gpus=2)
    await admin.put("/admin/v1/models/gemma", json={"name": "gemma", "command": "x {port}"})
    # gpu-a, the tightest fit, took the first replica, whose engine found no model file.
    await record(
        pg_store,
        "reconciler",
        ReplicaPlaced(
            replica_id="gemma-1",
            model="gemma",
            number=1,
            shards=(ShardPlacement(index=0, node_id="gpu-a", gpus=(0,), port=20000),),
        ),
        ReplicaFailed(replica_id="gemma-1", reason="engine exited with code 1"),
    )

    explained = (await admin.get("/admin/v1/models/gemma/placement")).json()

    assert explained["placement"][0]["node_id"] == "gpu-b", explained
    failed_here = {c["node_id"]: c["failures_here"] for c in explained["candidates"]}
    assert failed_here == {"gpu-a": 1, "gpu-b": 0}
    assert "ranked by fewest failures of this model since one served" in explained["summary"]


# -- nodes and drains --------------------------------------------------------------------


async def test_cordon_then_drain_is_recorded_as_the_operator_and_its_progress_is_readable(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seed_node(pg_store, "gpu-1")
    await seed_serving_replica(pg_store, "llama-1", "gpu-1")
    await seed_serving_replica(pg_store, "llama-2", "gpu-1")

    cordoned = await admin.post("/admin/v1/nodes/gpu-1/cordon", json={"reason": "ECC errors"})
    again = await admin.post("/admin/v1/nodes/gpu-1/cordon", json={"reason": "ECC errors"})
    drain = await admin.post("/admin/v1/nodes/gpu-1/drain", json={"grace_s": 300})

    assert cordoned.status_code == 200, cordoned.text
    assert (cordoned.json()["changed"], again.json()["changed"]) == (True, False)
    assert cordoned.json()["node"]["cordon_reason"] == "ECC errors"
    assert drain.status_code == 202, drain.text
    drain_id = drain.json()["drain_id"]
    assert re.fullmatch(r"drain-[0-9a-f]{8}", drain_id)
    requested = (await events_of(pg_store, node_stream("gpu-1")))[-1]
    assert requested.meta.actor == OPERATOR
    assert requested.meta.correlation_id == drain_id
    assert requested.event == NodeDrainRequested(node_id="gpu-1", drain_id=drain_id, grace_s=300)

    # The reconciler starts moving the first replica, under the drain's id.
    started = ReplicaDrainStarted(replica_id="llama-1", drain_id=drain_id, reason="node drains")
    await record(pg_store, "reconciler", started, correlation_id=drain_id)
    progress = await admin.get(drain.json()["progress"])
    refused = await admin.post("/admin/v1/nodes/gpu-1/drain", json={})
    node = (await admin.get("/admin/v1/nodes/gpu-1")).json()

    assert progress.status_code == 200, progress.text
    shown = progress.json()
    assert (shown["node_id"], shown["requested_by"], shown["finished"]) == (
        "gpu-1",
        OPERATOR,
        False,
    )
    assert [e["type"] for e in shown["events"]] == ["node_drain_requested", "replica_drain_started"]
    assert [(r["id"], r["phase"]) for r in shown["replicas"]] == [("llama-1", "draining")]
    assert shown["still_on_node"] == ["llama-2"]
    assert refused.status_code == 409
    assert f"already draining (drain {drain_id}" in refused.json()["detail"]
    assert node["drain"]["drain_id"] == drain_id
    assert [(r["id"], r["phase"]) for r in node["replicas"]] == [
        ("llama-1", "draining"),
        ("llama-2", "serving"),
    ]
    assert (await admin.get("/admin/v1/drains/drain-00000000")).status_code == 404


async def test_an_operator_calls_a_drain_off_and_the_reconciler_ends_it_as_cancelled(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seed_node(pg_store, "gpu-1")
    await seed_serving_replica(pg_store, "llama-1", "gpu-1")
    drain_id = (await admin.post("/admin/v1/nodes/gpu-1/drain", json={})).json()["drain_id"]
    started = ReplicaDrainStarted(replica_id="llama-1", drain_id=drain_id, reason="node drains")
    await record(pg_store, "reconciler", started, correlation_id=drain_id)

    cancelled = await admin.post(f"/admin/v1/drains/{drain_id}/cancel")
    again = await admin.post(f"/admin/v1/drains/{drain_id}/cancel")
    unknown = await admin.post("/admin/v1/drains/drain-00000000/cancel")

    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["changed"], again.json()["changed"]) == (True, False)
    assert cancelled.json()["drain"]["state"] == "running"  # until the reconciler's pass
    recorded = (await events_of(pg_store, node_stream("gpu-1")))[-1]
    assert recorded.event == NodeDrainCancelled(node_id="gpu-1", drain_id=drain_id)
    assert (recorded.meta.actor, recorded.meta.correlation_id) == (OPERATOR, drain_id)
    assert unknown.status_code == 404

    # The reconciler's drain rule, over the log as it is now.
    draft = Draft(await pg_store.catch_up(), datetime.now(UTC), epoch=1)
    drain_moves(draft, stability_window_s=10, replica_grace_s=600, reports={})
    for planned in draft.decision().events:
        await record(pg_store, planned.actor, planned.event, correlation_id=planned.correlation_id)

    shown = (await admin.get(f"/admin/v1/drains/{drain_id}")).json()
    late = await admin.post(f"/admin/v1/drains/{drain_id}/cancel")
    node = (await admin.get("/admin/v1/nodes/gpu-1")).json()
    assert (shown["state"], shown["finished"]) == ("cancelled", True)
    assert shown["outcome"] == f"cancelled by {OPERATOR}"
    # llama-1's move was called off: it serves on the node, as the node's view says below.
    assert (shown["still_on_node"], shown["moves_called_off"]) == (["llama-1"], ["llama-1"])
    assert [e["type"] for e in shown["events"]][-2:] == [
        "replica_drain_cancelled",
        "node_drain_finished",
    ]
    assert (late.status_code, late.json()["changed"]) == (200, False)
    assert (node["cordoned"], node["drain"]) == (True, None)
    assert [(r["id"], r["phase"]) for r in node["replicas"]] == [("llama-1", "serving")]
    uncordoned = await admin.post("/admin/v1/nodes/gpu-1/uncordon")
    assert (uncordoned.status_code, uncordoned.json()["changed"]) == (200, True)


async def test_a_drain_that_finished_is_not_cancelled_and_the_refusal_says_how_it_ended(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seed_node(pg_store, "gpu-1")
    drain_id = (await admin.post("/admin/v1/nodes/gpu-1/drain", json={})).json()["drain_id"]
    done = NodeDrainFinished(
        node_id="gpu-1", drain_id=drain_id, outcome="every replica moved", succeeded=True
    )
    await record(pg_store, "reconciler", done, correlation_id=drain_id)
    before = await pg_store.last_position()

    refused = await admin.post(f"/admin/v1/drains/{drain_id}/cancel")

    assert refused.status_code == 409, refused.text
    assert "it succeeded: every replica moved" in refused.json()["detail"]
    assert await pg_store.last_position() == before


async def test_a_node_drain_answers_which_replicas_have_room_and_require_room_refuses_without(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seed_node(pg_store, "gpu-1")
    spec = {"command": "vllm serve {model} --port {port}", "replicas": 1}
    assert (await admin.put("/admin/v1/models/llama", json=spec)).status_code == 200
    await seed_serving_replica(pg_store, "llama-1", "gpu-1")
    no_room = "needs 1 node(s) with 1 healthy free GPU(s), 0 eligible of 1: 1 draining"
    room = [{"replica_id": "llama-1", "model": "llama", "has_room": False, "reason": no_room}]
    before = await pg_store.last_position()

    refused = await admin.post(
        "/admin/v1/nodes/gpu-1/drain", json={"grace_s": 300, "require_room": True}
    )

    assert refused.status_code == 409, refused.text
    assert refused.json()["title"] == "no-room-to-drain"
    assert refused.json()["room"] == room
    assert f"(llama-1: {no_room}); nothing was recorded" in refused.json()["detail"]
    assert await pg_store.last_position() == before

    drain = await admin.post("/admin/v1/nodes/gpu-1/drain", json={"grace_s": 300})

    assert drain.status_code == 202, drain.text
    assert (drain.json()["grace_s"], drain.json()["room"]) == (300, room)
    assert [type(e.event) for e in await events_of(pg_store, node_stream("gpu-1"))][-1] is (
        NodeDrainRequested
    )


async def test_a_serving_replica_is_drained_and_replicas_show_their_failures(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seed_node(pg_store, "gpu-1")
    await seed_serving_replica(pg_store, "llama-1", "gpu-1")
    await record(
        pg_store,
        "reconciler",
        ReplicaPlaced(
            replica_id="qwen-1",
            model="qwen",
            number=1,
            shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(1,), port=20001),),
        ),
    )
    await record(
        pg_store,
        "agent:gpu-1",
        ShardFailed(
            replica_id="qwen-1",
            shard_index=0,
            node_id="gpu-1",
            error="exited with code 1",
            exit_code=1,
            log_tail=("loading weights", "torch.OutOfMemoryError: CUDA out of memory"),
        ),
    )

    drained = await admin.post("/admin/v1/replicas/llama-1/drain")
    not_serving = await admin.post("/admin/v1/replicas/qwen-1/drain")
    serving = await admin.get("/admin/v1/replicas", params={"phase": "draining"})
    on_node = await admin.get("/admin/v1/replicas", params={"node": "gpu-1", "model": "qwen"})
    failed = (await admin.get("/admin/v1/replicas/qwen-1")).json()

    assert drained.status_code == 202, drained.text
    [started] = (await events_of(pg_store, replica_stream("llama-1")))[-1:]
    assert started.meta.correlation_id == drained.json()["drain_id"]
    assert not_serving.status_code == 409
    assert "not serving yet, so there is nothing to move" in not_serving.json()["detail"]
    assert [r["id"] for r in serving.json()] == ["llama-1"]
    assert [r["id"] for r in on_node.json()] == ["qwen-1"]
    [shard] = failed["shards"]
    assert (shard["phase"], shard["exit_code"]) == ("failed", 1)
    assert shard["log_tail"][-1] == "torch.OutOfMemoryError: CUDA out of memory"
    unknown = await admin.get("/admin/v1/replicas/llama-9")
    assert (unknown.status_code, unknown.json()["id"]) == (404, "llama-9")


# -- identity ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/admin/v1/models", None),
        ("PUT", "/admin/v1/models/llama", LLAMA),
        ("POST", "/admin/v1/placement", LLAMA),
        ("GET", "/admin/v1/nodes", None),
        ("POST", "/admin/v1/nodes/gpu-1/drain", {}),
        ("GET", "/admin/v1/replicas", None),
        ("POST", "/admin/v1/replicas/llama-1/drain", None),
        ("GET", "/admin/v1/drains/drain-00000000", None),
    ],
)
async def test_a_request_without_a_token_is_refused_and_records_nothing(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    await seed_node(pg_store, "gpu-1")
    before = await pg_store.last_position()

    answer = await admin.request(method, path, json=body, headers={"authorization": ""})

    assert answer.status_code == 401
    assert "Authorization: Bearer" in answer.json()["detail"]
    assert await pg_store.last_position() == before
