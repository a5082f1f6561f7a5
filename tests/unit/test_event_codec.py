"""Every event survives the trip through the store's codec; old payloads are lifted."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import given, settings

from app.domain.describe import describe
from app.domain.events import (
    EVENT_TYPES,
    AnyEvent,
    ApiKeyCreated,
    NodeDrainFinished,
    ReplicaStartupTimedOut,
    ReplicaStopping,
    RolloutStarted,
    ShardFailed,
)
from app.store.codec import decode_event, encode_event, storable, upcast
from app.store.errors import UnreadableEvent
from tests.support.generators import events


@settings(max_examples=300)
@given(events())
def test_every_event_round_trips_its_codec(event: AnyEvent) -> None:
    type_name, schema_version, data = encode_event(event)

    assert type_name in EVENT_TYPES
    assert decode_event(1, type_name, schema_version, data) == storable(event)
    if b"\\u0000" not in (encoded := msgspec.json.encode(event)) and b"-0.0" not in encoded:
        assert storable(event) is event


def test_nul_characters_postgres_cannot_store_become_replacement_characters() -> None:
    event = ShardFailed(
        replica_id="m-1", shard_index=0, node_id="n", error="bad\x00byte", log_tail=("a\\u0000",)
    )

    stored = decode_event(1, *encode_event(event))

    assert stored == storable(event)
    assert isinstance(stored, ShardFailed)
    assert stored.error == "bad\ufffdbyte"
    assert stored.log_tail == ("a\\u0000",)  # an escaped backslash is left alone


@settings(max_examples=200)
@given(events())
def test_every_event_can_be_told_in_words(event: AnyEvent) -> None:
    assert describe(event).strip()


def test_a_stored_v1_shard_failure_reads_as_v2() -> None:
    v1 = msgspec.json.encode(
        {
            "type": "shard_failed",
            "replica_id": "llama-3",
            "shard_index": 0,
            "node_id": "gpu-7",
            "error": "exited with 1",
            "exit_code": 1,
            "log": "INFO loading\nERROR CUDA out of memory",
        }
    )

    event = decode_event(17, "shard_failed", 1, v1)

    assert isinstance(event, ShardFailed)
    assert event.log_tail == ("INFO loading", "ERROR CUDA out of memory")
    assert ShardFailed.schema_version == 2


FAILED_BEFORE_THE_PORT_FLAG = (
    b'{"type":"shard_failed","replica_id":"llama-3","shard_index":0,"node_id":"gpu-7",'
    b'"error":"exited with 1","exit_code":1,"log_tail":["ERROR CUDA out of memory"]}'
)
"""A failure as stored before ``port_held_elsewhere`` existed."""


def test_a_failure_for_another_reason_is_stored_as_before_the_port_flag_existed() -> None:
    event = ShardFailed(
        replica_id="llama-3",
        shard_index=0,
        node_id="gpu-7",
        error="exited with 1",
        exit_code=1,
        log_tail=("ERROR CUDA out of memory",),
    )

    assert encode_event(event) == ("shard_failed", 2, FAILED_BEFORE_THE_PORT_FLAG)
    assert decode_event(9, "shard_failed", 2, FAILED_BEFORE_THE_PORT_FLAG) == event


def test_a_port_held_elsewhere_is_stored_and_read_back() -> None:
    event = ShardFailed(
        replica_id="llama-3", shard_index=0, node_id="gpu-7", error="held", port_held_elsewhere=True
    )

    _, _, data = encode_event(event)
    stored = decode_event(9, "shard_failed", 2, data)

    assert b'"port_held_elsewhere":true' in data
    assert isinstance(stored, ShardFailed)
    assert stored.port_held_elsewhere is True


@pytest.mark.parametrize(("flag", "held"), [(b"false", False), (b"true", True)])
def test_a_failure_stored_with_the_port_flag_written_out_reads_as_it_says(
    flag: bytes, held: bool
) -> None:
    """Failures recorded while the flag was written on every one, ``false`` included."""
    data = FAILED_BEFORE_THE_PORT_FLAG[:-1] + b',"port_held_elsewhere":' + flag + b"}"

    stored = decode_event(9, "shard_failed", 2, data)

    assert isinstance(stored, ShardFailed)
    assert bool(stored.port_held_elsewhere) is held
    assert stored.log_tail == ("ERROR CUDA out of memory",)


def test_a_key_recorded_before_keys_could_expire_reads_as_one_that_never_expires() -> None:
    stored = msgspec.json.encode(
        {
            "type": "api_key_created",
            "key_id": "k-7f3a09c2",
            "name": "ci",
            "prefix": "7f3a09c2",
            "secret_hash": "5f1d0c2e",
            "models": ["llama"],
            "rpm": 60,
            "tpm": None,
        }
    )
    expiring = msgspec.json.encode(
        {**msgspec.json.decode(stored), "expires_at": "2027-01-31T09:00:00+09:00"}
    )

    old = decode_event(3, "api_key_created", ApiKeyCreated.schema_version, stored)
    new = decode_event(4, "api_key_created", ApiKeyCreated.schema_version, expiring)

    assert isinstance(old, ApiKeyCreated)
    assert old.expires_at is None
    assert isinstance(new, ApiKeyCreated)
    assert new.expires_at == datetime(2027, 1, 31, tzinfo=UTC)


def test_a_rollout_started_before_undos_said_what_they_undo_reads_as_undoing_nothing() -> None:
    stored = msgspec.json.encode(
        {
            "type": "rollout_started",
            "model": "llama",
            "rollout_id": "rollout-llama-r3",
            "revision": 3,
            "from_revision": 2,
        }
    )

    old = decode_event(5, "rollout_started", RolloutStarted.schema_version, stored)

    assert old == RolloutStarted(
        model="llama", rollout_id="rollout-llama-r3", revision=3, from_revision=2
    )
    assert old.undoes is None


def test_stops_and_drain_ends_recorded_before_they_said_more_read_as_they_did() -> None:
    stopping = msgspec.json.encode(
        {"type": "replica_stopping", "replica_id": "llama-1", "reason": "scaled down to 2"}
    )
    finished = msgspec.json.encode(
        {
            "type": "node_drain_finished",
            "node_id": "gpu-1",
            "drain_id": "drain-1",
            "outcome": "every replica moved",
        }
    )

    old_stop = decode_event(6, "replica_stopping", ReplicaStopping.schema_version, stopping)
    old_end = decode_event(7, "node_drain_finished", NodeDrainFinished.schema_version, finished)

    assert old_stop == ReplicaStopping(replica_id="llama-1", reason="scaled down to 2")
    assert isinstance(old_stop, ReplicaStopping)
    assert old_stop.surplus is False
    assert isinstance(old_end, NodeDrainFinished)
    assert (old_end.outcome, old_end.succeeded) == ("every replica moved", None)


def test_a_payload_without_an_upcaster_is_reported_not_guessed() -> None:
    with pytest.raises(UnreadableEvent, match="no upcaster"):
        upcast("shard_failed", 0, {})


def test_an_unknown_event_type_is_reported_with_its_position() -> None:
    with pytest.raises(UnreadableEvent, match=r"event 9 .*unknown event type"):
        decode_event(9, "replica_teleported", 1, b"{}")


def test_a_corrupt_payload_is_reported_with_its_position() -> None:
    with pytest.raises(UnreadableEvent, match="event 4"):
        decode_event(4, "replica_serving", 1, b'{"type": "replica_serving"}')


def test_a_negative_zero_reads_back_as_the_log_keeps_it_positive() -> None:
    event = ReplicaStartupTimedOut(replica_id="m-1", waited_s=-0.0, timeout_s=600.0)

    stored = storable(event)

    assert isinstance(stored, ReplicaStartupTimedOut)
    assert str(stored.waited_s) == "0.0"  # jsonb has no -0: the writer folds what a replay will
    assert describe(stored) == describe(decode_event(1, *encode_event(stored)))
    assert storable(ReplicaStartupTimedOut(replica_id="m-1", waited_s=2.5, timeout_s=600.0)) == (
        ReplicaStartupTimedOut(replica_id="m-1", waited_s=2.5, timeout_s=600.0)
    )
