"""What each event is about: ``subjects`` names every model, node, replica, key and revoked
certificate an event carries, and nothing else."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.events import (
    EVENT_TYPES,
    CertificateRevoked,
    Event,
    IdentityRejected,
    ModelTuned,
    NodeRefused,
    StrayStopped,
    Subjects,
    subjects,
)
from tests.support.generators import struct_strategy

# The fields, across every event, that name an entity, and the subject each one is.
ID_FIELDS = {
    "model": "model",
    "node_id": "node",
    "claimed_node_id": "node",
    "replica_id": "replica",
    "key_id": "key",
    "serial": "certificate",
}
# Fields that hold ids too, of something other than what the event is about.
NOT_SUBJECTS = {
    "drain_id",  # a drain is an operation (its events' correlation id), not an entity
    "rollout_id",  # a rollout too
    "replacement_id",  # the replaced replica's event; the replacement has its own
    "certificate_serial",  # the node connected (or was refused) with this certificate
}


def named_ids(event: Event) -> dict[str, Any]:
    """The subjects ``event``'s own fields name, by the convention of their names."""
    named: dict[str, Any] = {}
    for field in msgspec.structs.fields(type(event)):
        subject = ID_FIELDS.get(field.name)
        if subject is not None and (value := getattr(event, field.name)) is not None:
            named[subject] = value
    return named


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_every_event_type_names_exactly_the_entities_its_fields_carry(name: str) -> None:
    cls = EVENT_TYPES[name]
    id_fields = {f.name for f in msgspec.structs.fields(cls)} & set(ID_FIELDS)
    other_ids = {
        f.name
        for f in msgspec.structs.fields(cls)
        if f.name.endswith(("_id", "serial")) and f.name not in ID_FIELDS
    }
    assert other_ids <= NOT_SUBJECTS, f"is {name} about {other_ids - NOT_SUBJECTS}?"
    assert id_fields, f"{name} names no entity"

    @settings(max_examples=30, deadline=None)
    @given(struct_strategy(cls))
    def named_alike(event: Any) -> None:
        about = subjects(event)
        assert msgspec.structs.asdict(about) == {
            **msgspec.structs.asdict(Subjects()),
            **named_ids(event),
        }

    named_alike()


def test_a_stopped_stray_is_about_its_node_its_replica_and_its_model() -> None:
    stray = StrayStopped(
        node_id="gpu-7", replica_id="llama-9", shard_index=0, model="llama", port=20001, rule="r"
    )

    assert subjects(stray) == Subjects(node="gpu-7", replica="llama-9", model="llama")


def test_a_refused_identity_is_about_the_node_it_claimed() -> None:
    refused = IdentityRejected(
        claimed_node_id="gpu-7", certificate_subject="CN=gpu-8", remote_address="127.0.0.8:4431",
        reason="common name gpu-8 is not gpu-7",
    )  # fmt: skip

    assert subjects(refused) == Subjects(node="gpu-7")


def test_a_revocation_is_about_its_certificate_or_its_whole_node() -> None:
    by_serial = CertificateRevoked(serial="0a1b", reason="laptop lost")
    whole_node = CertificateRevoked(node_id="gpu-7", reason="decommissioned")

    assert subjects(by_serial) == Subjects(certificate="0a1b")
    assert subjects(whole_node) == Subjects(node="gpu-7")


def test_tuning_is_about_the_model_and_the_replica_it_was_measured_on() -> None:
    common = {"model": "llama", "weight": 2.0, "target_waiting": 4, "kv_ceiling": 0.7}

    assert subjects(ModelTuned(**common)) == Subjects(model="llama")
    assert subjects(ModelTuned(replica_id="llama-3", **common)) == Subjects(
        model="llama", replica="llama-3"
    )


@given(st.text(min_size=1, max_size=8))
def test_a_refused_node_is_about_that_node_not_its_certificate(serial: str) -> None:
    refused = NodeRefused(
        node_id="gpu-7", remote_address="127.0.0.7:4431", certificate_serial=serial, reason="r"
    )

    assert subjects(refused) == Subjects(node="gpu-7")
