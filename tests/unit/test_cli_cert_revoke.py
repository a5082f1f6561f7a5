"""`llmgw-cli cert revoke --node gpu-07 ...; llmgw-cli cert node gpu-07`, as its help and
docs/certificates.md print it, issues a replacement the agent hub lets in: revoke returns
only once a certificate issued here is issued after the revocation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from app.domain.revocations import PresentedCertificate, RevocationRequest, revocation_refusal
from app.domain.state import ClusterState
from app.pki.builders import build_ca, issue_node
from app.pki.describe import serial_hex
from app.pki.issued import read_issued
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


@pytest.fixture
def ca_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A CA that issued gpu-07's node certificate and alice's operator certificate, found
    as ``cert revoke`` finds it: ``$LLMGW_CA_DIR``."""
    monkeypatch.setenv("LLMGW_CONFIG", "/dev/null")
    monkeypatch.setenv("LLMGW_CA_DIR", str(tmp_path / "ca"))
    for argv in (
        ["cert", "init-ca"],
        ["cert", "node", "gpu-07", "--out", str(tmp_path), "--offline"],
        ["cert", "operator", "alice", "--out", str(tmp_path)],
    ):
        with pytest.raises(SystemExit) as ended:
            app(argv)
        assert ended.value.code == 0
    return tmp_path / "ca"


def serial_of(kind: str, ca_dir: Path) -> str:
    (serial,) = (c.serial for c in read_issued(ca_dir).certificates if c.kind == kind)
    return serial


def revoked(serial: str, capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    """The admin URL answers nothing: a request sent would end the command otherwise."""
    capsys.readouterr()
    argv = ["cert", "revoke", "--serial", serial, "--reason", "laptop stolen"]
    with pytest.raises(SystemExit) as ended:
        app([*argv, "--admin-url", "http://127.0.0.1:1"])
    return ended.value.code, capsys.readouterr().err


def test_the_start_of_a_serial_this_ca_issued_is_bad_usage_naming_the_whole_one(
    ca_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node certificate that never connected: the admin API cannot tell a serial copied
    short from another one, and would record a revocation no certificate matches."""
    whole = serial_of("node", ca_dir)

    assert revoked(whole[:10].upper(), capsys) == (
        2,
        f"llmgw-cli cert revoke: --serial {whole[:10].upper()} is only the start of the "
        f"serial of the node certificate of gpu-07, {whole}: give the whole serial, as a "
        "revocation matches one certificate exactly\n",
    )


def test_an_operator_certificate_s_serial_is_bad_usage_saying_it_stays_valid(
    ca_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The agent hub is all a revocation holds back: the admin API would go on taking
    alice's certificate while the command said it was revoked."""
    serial = serial_of("operator", ca_dir)

    assert revoked(serial, capsys) == (
        2,
        f"llmgw-cli cert revoke: --serial {serial} is the operator certificate of alice: "
        "only node certificates are revoked (the agent hub refuses them); an operator "
        "certificate stays valid until it expires, unless the CA is rotated "
        "(docs/certificates.md)\n",
    )


def test_a_whole_node_serial_and_one_this_ca_did_not_issue_are_sent(
    ca_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for serial in (serial_of("node", ca_dir), "5f1c0a9e3b7d24c81e6f90a3b5d7c2e4f1a8b603"):
        code, err = revoked(serial, capsys)
        assert (code, "cannot reach the admin API" in err) == (1, True), err
