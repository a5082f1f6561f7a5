"""Revoking certificates: by serial for good, or every certificate a node had until then."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.domain.envelope import Meta, Recorded
from app.domain.events import CertificateRevoked
from app.domain.evolve import evolve
from app.domain.revocations import (
    InvalidRevocation,
    PresentedCertificate,
    RevocationRequest,
    checked,
    revocation_refusal,
    revocation_stream,
    revoke,
)
from app.domain.state import ClusterState, Node
from app.pki.errors import InvalidRequest
from app.pki.names import check_subject_name
from wire.messages import fit_close_reason

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def recorded(state: ClusterState, request: RevocationRequest, at: datetime) -> ClusterState:
    change = revoke(state, checked(request))
    for event in change.events:
        evolve(
            state,
            Recorded(
                position=state.position + 1,
                stream=change.stream,
                version=1,
                event_id=uuid.uuid4(),
                recorded_at=at,
                meta=Meta(actor="alice"),
                event=event,
            ),
        )
    return state


def presented(
    serial: str = "5f1c", node: str = "gpu-7", issued: datetime = T0
) -> PresentedCertificate:
    return PresentedCertificate(common_name=node, serial=serial, issued_at=issued)


def test_a_certificate_revoked_by_serial_is_refused_naming_who_when_and_why() -> None:
    state = recorded(ClusterState(), RevocationRequest(serial="5F:1C", reason="stolen"), T0)

    reason = revocation_refusal(state.revocations, presented(serial="5f1c"))

    assert reason == "revoked: stolen (by alice at 2026-12-01T12:00:00+00:00; certificate 5f1c)"
    assert revocation_refusal(state.revocations, presented(serial="5f1d")) is None


def test_the_refusal_of_a_long_serial_carries_its_reason_within_a_close_frame() -> None:
    serial = "6ad5935851a8a2fbdefbc6cf7f4d18c47a6781a8"  # 40 digits, as llmgw's CA issues
    state = recorded(ClusterState(), RevocationRequest(serial=serial, reason="laptop stolen"), T0)

    reason = revocation_refusal(state.revocations, presented(serial=serial))

    assert reason is not None
    assert "laptop stolen" in fit_close_reason(reason)


def test_revoking_a_node_voids_what_it_was_issued_until_then_and_not_its_replacement() -> None:
    state = recorded(ClusterState(), RevocationRequest(node_id="gpu-7", reason="rebuilt"), T0)

    before = presented(issued=T0 - timedelta(days=30))
    after = presented(serial="77", issued=T0 + timedelta(minutes=1))

    reason = revocation_refusal(state.revocations, before)
    assert reason is not None
    assert "the certificates of node gpu-7 issued until then" in reason
    assert revocation_refusal(state.revocations, after) is None
    assert revocation_refusal(state.revocations, presented(node="gpu-8")) is None


def test_revoking_a_serial_twice_records_nothing_the_second_time() -> None:
    request = RevocationRequest(serial="0x5f1c", reason="stolen")
    state = recorded(ClusterState(), request, T0)

    assert revoke(state, checked(request)).events == ()
    assert revocation_stream(checked(request)) == "certificate-5f1c"


def test_revoking_a_node_again_moves_its_cut_off_forward() -> None:
    state = recorded(ClusterState(), RevocationRequest(node_id="gpu-7", reason="one"), T0)
    later = T0 + timedelta(days=1)
    state = recorded(state, RevocationRequest(node_id="gpu-7", reason="two"), later)

    between = presented(issued=T0 + timedelta(hours=1))
    assert revocation_refusal(state.revocations, between) is not None
    assert revocation_stream(checked(RevocationRequest(node_id="gpu-7", reason="x"))) == (
        "node-gpu-7"
    )


@pytest.mark.parametrize(
    ("request_", "fields"),
    [
        (RevocationRequest(reason="why"), ["serial"]),
        (RevocationRequest(serial="zz", reason="why"), ["serial"]),
        (RevocationRequest(serial="1" * 41, reason="why"), ["serial"]),
        (RevocationRequest(serial="1f", node_id="gpu-7", reason="why"), ["node_id"]),
        (RevocationRequest(node_id="gpu 7\n", reason="why"), ["node_id"]),
        (RevocationRequest(node_id="-x", reason="why"), ["node_id"]),
        (RevocationRequest(node_id="../gpu-7", reason="why"), ["node_id"]),
        (RevocationRequest(node_id="gpu/7", reason="why"), ["node_id"]),
        (RevocationRequest(node_id="g" * 64, reason="why"), ["node_id"]),
        (RevocationRequest(serial="1f", reason="  "), ["reason"]),
        (RevocationRequest(serial="1f", reason="x" * 501), ["reason"]),
    ],
)
def test_a_malformed_revocation_is_refused_naming_each_bad_field(
    request_: RevocationRequest, fields: list[str]
) -> None:
    with pytest.raises(InvalidRevocation) as refused:
        checked(request_)
    assert [error.field for error in refused.value.errors] == fields


def test_the_event_names_what_was_revoked() -> None:
    change = revoke(ClusterState(), checked(RevocationRequest(serial="ABC", reason=" lost ")))
    assert change.events == (CertificateRevoked(serial="abc", node_id=None, reason="lost"),)


@pytest.mark.parametrize("node_id", ["gpu-07", "7", "g" * 63, "rack1.gpu_7", "-x", "..", "a/b"])
def test_a_node_id_is_revocable_exactly_when_a_node_certificate_can_name_it(node_id: str) -> None:
    """Any other name would match no certificate the agent hub accepts."""
    try:
        check_subject_name("node id", node_id)
        issuable = True
    except InvalidRequest:
        issuable = False
    try:
        checked(RevocationRequest(node_id=node_id, reason="why"))
        revocable = True
    except InvalidRevocation:
        revocable = False

    assert revocable == issuable


GPU_07_SERIAL = "6f1a0fdd6118268495bc7e981781badfabe7651"


def connected_with(serial: str) -> ClusterState:
    state = ClusterState()
    state.nodes["gpu-07"] = Node(
        id="gpu-07", address="127.0.0.1", registered_at=T0, certificate_serial=serial
    )
    return state


def test_the_start_of_a_connected_node_s_serial_is_refused_naming_the_whole_one() -> None:
    """A revocation matches one serial exactly: the first digits of a node's serial, as an
    operator copies a short hash, would record a revocation no certificate matches and leave
    the stolen one connected."""
    request = checked(RevocationRequest(serial="6F:1A:0F:DD:61", reason="laptop stolen"))

    with pytest.raises(InvalidRevocation) as refused:
        revoke(connected_with(GPU_07_SERIAL), request)

    assert [(e.field, e.reason) for e in refused.value.errors] == [
        (
            "serial",
            "'6f1a0fdd61' is only the start of a serial: node gpu-07 last connected with "
            f"certificate {GPU_07_SERIAL}; give the whole serial, as a revocation matches "
            "one certificate exactly",
        )
    ]


def test_a_whole_serial_and_one_no_node_s_serial_begins_with_are_recorded() -> None:
    state = connected_with(GPU_07_SERIAL)

    for serial in (GPU_07_SERIAL, "5f1c0a9e3b"):
        request = checked(RevocationRequest(serial=serial, reason="laptop stolen"))
        assert revoke(state, request).events == (
            CertificateRevoked(serial=serial, node_id=None, reason="laptop stolen"),
        )
