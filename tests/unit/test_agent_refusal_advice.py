"""What an agent the hub refused says to do, by the reason the hub gave: the advice names
the machine that can do it, which for a new certificate is where the CA is kept, never a
server (docs/certificates.md: `ca.key` should never be copied to a server or a node)."""

from __future__ import annotations

import pytest

from agent.connection import refusal_advice


@pytest.mark.parametrize(
    "reason",
    [
        "revoked: laptop stolen (by alice at 2026-12-06T00:43:48+00:00; certificate 5f1c)",
        "the client certificate expired",
        "certificate common name 'gpu-01' does not match node id 'gpu-02'",
    ],
    ids=["revoked", "expired", "another-node"],
)
def test_a_new_certificate_is_issued_where_the_ca_is_kept_not_on_a_server(reason: str) -> None:
    advice = refusal_advice(reason)

    assert "on the control plane" not in advice
    assert "where the llmgw CA is kept (`llmgw-cli cert node <node-id>`" in advice
    assert "never on a server), copy it here" in advice


def test_a_revoked_certificate_is_told_once_that_a_new_one_is_needed() -> None:
    advice = refusal_advice("revoked: machine rebuilt (by alice at ...; node gpu-07)")

    assert advice.startswith(". This node needs a new certificate: issue a node certificate")
