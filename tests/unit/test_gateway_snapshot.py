"""The snapshot a gateway builds from the projection's rows."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.domain.model_spec import MAX_REPLICAS
from app.gateway.snapshot import MAX_UNIX_TIME, build_snapshot, engine_url
from app.gateway.table import Canary, StartFailure
from app.store.routing_rows import (
    ApisRow,
    CanaryRow,
    ColdStartRow,
    KeyRow,
    RouteRow,
    StartFailureRow,
)


def route(
    replica_id: str, model: str, address: str = "127.0.0.7", port: int = 20001, revision: int = 1
) -> RouteRow:
    return RouteRow(
        replica_id=replica_id,
        model=model,
        address=address,
        port=port,
        weight=2.0,
        target_waiting=3,
        kv_ceiling=0.7,
        draining=replica_id.endswith("-2"),
        revision=revision,
    )


def test_engine_urls_use_the_registered_address_with_ipv6_in_brackets() -> None:
    assert engine_url("127.0.0.7", 20001) == "http://127.0.0.7:20001"
    assert engine_url("gpu-7.internal", 20001) == "http://gpu-7.internal:20001"
    assert engine_url("::1", 20001) == "http://[::1]:20001"
    assert engine_url("[::1]", 20001) == "http://[::1]:20001"


def test_routes_are_grouped_by_model_in_replica_order_and_keys_by_prefix() -> None:
    keys = [
        KeyRow(id="k-1", name="ci", prefix="0a1b2c3d", secret_hash="h", models=["llama"], rpm=60,
               tpm=None),
        KeyRow(id="k-2", name="all", prefix="99887766", secret_hash="g", models=[], rpm=None,
               tpm=1000),
    ]  # fmt: skip
    snapshot = build_snapshot(
        42,
        ["llama", "qwen", "idle"],
        [route("qwen-1", "qwen"), route("llama-2", "llama"), route("llama-1", "llama")],
        keys,
        at=7.5,
    )

    assert snapshot.declared == frozenset({"llama", "qwen", "idle"})
    assert [r.replica_id for r in snapshot.routes["llama"]] == ["llama-1", "llama-2"]
    assert [r.draining for r in snapshot.routes["llama"]] == [False, True]
    assert "idle" not in snapshot.routes
    first = snapshot.routes["llama"][0]
    assert (first.url, first.weight, first.target_waiting, first.kv_ceiling) == (
        "http://127.0.0.7:20001",
        2.0,
        3,
        0.7,
    )
    assert snapshot.keys["0a1b2c3d"].allows("llama")
    assert not snapshot.keys["0a1b2c3d"].allows("qwen")
    assert snapshot.keys["99887766"].allows("qwen")  # an empty scope is every model
    assert (snapshot.position, snapshot.loaded_at) == (42, 7.5)


def test_a_key_that_expires_carries_its_expiry_as_seconds_since_the_epoch() -> None:
    expires_at = datetime(2027, 1, 31, 9, 30, tzinfo=UTC)
    keys = [
        KeyRow(id="k-1", name="demo", prefix="0a1b2c3d", secret_hash="h", models=[], rpm=None,
               tpm=None, expires_at=expires_at),
        KeyRow(id="k-2", name="ci", prefix="99887766", secret_hash="g", models=[], rpm=None,
               tpm=None),
    ]  # fmt: skip

    snapshot = build_snapshot(1, [], [], keys, at=1.0)

    assert snapshot.keys["0a1b2c3d"].expires_at == expires_at.timestamp() == 1801387800.0
    assert snapshot.keys["99887766"].expires_at is None


def test_each_route_carries_its_revision_and_each_declared_model_its_canary() -> None:
    snapshot = build_snapshot(
        7,
        ["llama", "qwen"],
        [route("llama-1", "llama"), route("llama-3", "llama", revision=2), route("qwen-1", "qwen")],
        [],
        at=1.0,
        canaries=[
            CanaryRow(model="llama", revision=2, traffic=0.1),
            CanaryRow(model="removed", revision=3, traffic=0.5),
        ],
    )

    assert [(r.replica_id, r.revision) for r in snapshot.routes["llama"]] == [
        ("llama-1", 1),
        ("llama-3", 2),
    ]
    assert snapshot.canaries == {"llama": Canary(revision=2, share=0.1)}


@pytest.mark.parametrize("traffic", [0.0, -0.5, 1.5, float("nan"), float("inf")])
def test_a_canary_row_without_a_share_between_0_and_1_is_no_canary(traffic: float) -> None:
    snapshot = build_snapshot(
        7,
        ["llama"],
        [route("llama-1", "llama"), route("llama-3", "llama", revision=2)],
        [],
        at=1.0,
        canaries=[CanaryRow(model="llama", revision=2, traffic=traffic)],
    )

    assert snapshot.canaries == {}


def test_a_share_of_exactly_1_is_a_canary() -> None:
    snapshot = build_snapshot(
        7, ["llama"], [], [], at=1.0, canaries=[CanaryRow(model="llama", revision=2, traffic=1)]
    )

    assert snapshot.canaries == {"llama": Canary(revision=2, share=1.0)}


def test_each_declared_model_with_an_autoscaling_policy_has_its_cold_start_timeout() -> None:
    snapshot = build_snapshot(
        7,
        ["llama", "qwen"],
        [route("qwen-1", "qwen")],
        [],
        at=1.0,
        cold_starts=[
            ColdStartRow(model="llama", timeout_s=120.0),
            ColdStartRow(model="qwen", timeout_s=3600.0),
            ColdStartRow(model="removed", timeout_s=60.0),
        ],
    )

    assert snapshot.cold_start_s == {"llama": 120.0, "qwen": 3600.0}


@pytest.mark.parametrize("timeout_s", [0.0, -1.0, 3600.5, float("nan"), float("inf")])
def test_a_cold_start_timeout_the_spec_does_not_allow_holds_nothing(timeout_s: float) -> None:
    snapshot = build_snapshot(
        7, ["llama"], [], [], at=1.0, cold_starts=[ColdStartRow("llama", timeout_s)]
    )

    assert snapshot.cold_start_s == {}


def test_the_apis_a_spec_names_are_carried_and_others_serve_the_default() -> None:
    snapshot = build_snapshot(
        1,
        ["embedder", "chat", "odd"],
        [],
        [],
        at=0.0,
        apis=[
            ApisRow(model="embedder", apis=["embeddings", "rerank"]),
            ApisRow(model="odd", apis=["chat", 7, "images"]),
            ApisRow(model="removed", apis=["embeddings"]),
        ],
    )

    assert snapshot.serves("embedder", "embeddings")
    assert not snapshot.serves("embedder", "chat")
    assert snapshot.apis_of("chat") == frozenset({"chat", "completions"})
    # A row the spec could not have written keeps only the names the gateway knows.
    assert snapshot.apis_of("odd") == frozenset({"chat"})
    assert "removed" not in snapshot.apis


def test_a_declared_model_carries_when_it_was_first_declared_and_an_unwritable_time_none() -> None:
    snapshot = build_snapshot(
        1,
        ["llama", "qwen", "ancient", "future"],
        [],
        [],
        at=0.0,
        created={
            "llama": 1_764_000_000,
            "qwen": 0,
            "ancient": -1,
            "future": MAX_UNIX_TIME + 1,
            "removed": 1_764_000_000,
        },
    )

    assert snapshot.created == {"llama": 1_764_000_000, "qwen": 0}


def test_a_model_failing_to_start_retries_at_when_its_backoff_ends_by_the_gateway_clock() -> None:
    snapshot = build_snapshot(
        7,
        ["llama", "qwen", "mistral", "idle"],
        [],
        [],
        at=100.0,
        start_failures=[
            StartFailureRow(model="llama", failures=3, retry_in_s=38.5),
            StartFailureRow(model="qwen", failures=1, retry_in_s=9.0),
            StartFailureRow(model="mistral", failures=1, retry_in_s=float("nan")),
            StartFailureRow(model="removed", failures=1, retry_in_s=5.0),
        ],
        scaled_to_zero=["idle", "removed"],
    )

    assert snapshot.start_failures["llama"] == StartFailure(failures=3, retry_at=138.5)
    assert snapshot.start_failures["qwen"] == StartFailure(failures=1, retry_at=109.0)
    assert set(snapshot.start_failures) == {"llama", "qwen"}
    assert snapshot.scaled_to_zero == frozenset({"idle"})


def test_a_models_replicas_starting_are_counted_and_counts_no_reconciler_wrote_are_none() -> None:
    snapshot = build_snapshot(
        7,
        ["llama", "qwen", "zero", "negative", "huge", "most"],
        [],
        [],
        at=100.0,
        starting={
            "llama": 2,
            "qwen": 1,
            "removed": 3,
            "zero": 0,
            "negative": -1,
            "huge": 2 * MAX_REPLICAS + 1,
            "most": 2 * MAX_REPLICAS,
        },
    )

    assert snapshot.starting == {"llama": 2, "qwen": 1, "most": 2 * MAX_REPLICAS}
