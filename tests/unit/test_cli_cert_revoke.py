"""`llmgw-cli cert revoke --node gpu-07 ...; llmgw-cli cert node gpu-07`, as its help and
docs/certificates.md print it, issues a replacement the agent hub lets in: revoke returns
only once a certificate issued here is issued after the revocation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from app.domain.revocations import PresentedCertificate, RevocationRequest, revocation_refusal
from app.domain.state import ClusterState
from app.pki.builders import build_ca, issue_node
from app.pki.describe import serial_hex
from app.pki.model import CLOCK_SKEW
from cli.cert_revocation import replacement_wait_s
from cli.main import app
from tests.unit.test_domain_revocations import recorded

REVOKED_AT = datetime(2026, 12, 5, 10, 34, 42, 500_000, tzinfo=UTC)


def issued_at(when: datetime) -> PresentedCertificate:
    """A node certificate for gpu-07 issued at ``when``, as the hub sees it."""
    ca = build_ca(ec.generate_private_key(ec.SECP256R1()), "llmgw CA", when, days=30)
    certificate = issue_node(ca, ec.generate_private_key(ec.SECP256R1()), "gpu-07", when, 7)
    return PresentedCertificate(
        common_name="gpu-07",
        serial=serial_hex(certificate),
        issued_at=certificate.not_valid_before_utc + CLOCK_SKEW,
    )


@pytest.mark.parametrize("answered_after_s", [0.0, 0.2, 0.499])
def test_the_replacement_issued_once_revoke_returns_connects(answered_after_s: float) -> None:
    state = recorded(
        ClusterState(), RevocationRequest(node_id="gpu-07", reason="machine rebuilt"), REVOKED_AT
    )
    now = REVOKED_AT + timedelta(seconds=answered_after_s)

    replacement = issued_at(now + timedelta(seconds=replacement_wait_s(REVOKED_AT, now)))

    assert revocation_refusal(state.revocations, replacement) is None
    # Issued at once, in the revocation's own second, it would have been refused.
    assert revocation_refusal(state.revocations, issued_at(now)) is not None


def test_a_clock_past_the_revocation_s_second_or_far_behind_it_is_not_waited_for() -> None:
    assert replacement_wait_s(REVOKED_AT, REVOKED_AT + timedelta(seconds=1)) == 0.0
    assert replacement_wait_s(REVOKED_AT, REVOKED_AT - timedelta(minutes=5)) == 1.0


@pytest.mark.parametrize("node", ["../gpu-07", "-x", "gpu/07", "g" * 64])
def test_a_node_id_no_certificate_can_name_is_bad_usage_and_nothing_is_sent(
    capsys: pytest.CaptureFixture[str], node: str
) -> None:
    """The admin URL answers nothing: a request sent would end the command otherwise."""
    argv = ["cert", "revoke", f"--node={node}", "--reason", "rebuilt"]

    with pytest.raises(SystemExit) as ended:
        app([*argv, "--admin-url", "http://127.0.0.1:1"])

    assert ended.value.code == 2
    assert capsys.readouterr().err == (
        f"llmgw-cli cert revoke: --node: invalid node id {node!r}: use 1-63 letters, digits, "
        "'.', '_' or '-', starting with a letter or digit\n"
    )
