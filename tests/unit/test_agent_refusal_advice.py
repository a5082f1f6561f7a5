"""What an agent the hub refused says to do, by the reason the hub gave: the advice names
the machine that can do it, which for a new certificate is where the CA is kept, never a
server (docs/certificates.md: `ca.key` should never be copied to a server or a node), and
it is the command to run there, with this agent's own node id and address."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent.refusal_advice import NodeClaim, certificate_dates_note, refusal_advice

NODE = NodeClaim("gpu-07", "127.0.20.7")


@pytest.mark.parametrize(
    "reason",
    [
        "revoked: laptop stolen (by alice at 2026-12-06T00:43:48+00:00; certificate 5f1c)",
        "the client certificate expired",
        "certificate common name 'gpu-01' does not match node id 'gpu-07'",
    ],
    ids=["revoked", "expired", "another-node"],
)
def test_a_new_certificate_is_issued_where_the_ca_is_kept_not_on_a_server(reason: str) -> None:
    advice = refusal_advice(reason, NODE)

    assert "on the control plane" not in advice
    assert "where the llmgw CA is kept (`llmgw-cli cert node gpu-07`" in advice
    assert "never on a server), copy it here" in advice
    assert "<node-id>" not in advice


def test_a_revoked_certificate_is_told_once_that_a_new_one_is_needed() -> None:
    advice = refusal_advice("revoked: machine rebuilt (by alice at ...; node gpu-07)", NODE)

    assert advice.startswith(". This node needs a new certificate: issue a node certificate")


@pytest.mark.parametrize(
    ("address", "command"),
    [
        ("127.0.20.7", "`llmgw-cli cert node gpu-07 --ip 127.0.20.7`"),
        ("::1", "`llmgw-cli cert node gpu-07 --ip ::1`"),
        ("gpu-07.internal", "`llmgw-cli cert node gpu-07 --host gpu-07.internal`"),
    ],
    ids=["ipv4", "ipv6", "host-name"],
)
def test_an_address_the_certificate_does_not_name_gets_the_command_that_names_it(
    address: str, command: str
) -> None:
    reason = (
        f"advertised address {address!r} is neither named by the node's certificate (the "
        "certificate names no address) nor the address its connection comes from (127.0.0.9)"
    )

    advice = refusal_advice(reason, NodeClaim("gpu-07", address))

    assert advice.endswith(f"where the llmgw CA is kept: {command}")
    assert "<" not in advice


def test_an_address_outside_the_engine_networks_is_not_told_to_reissue_its_certificate() -> None:
    reason = (
        "advertised address '127.0.20.7' is outside the engine networks the gateway may "
        "contact (--engine-networks: 127.0.30.0/24)"
    )

    advice = refusal_advice(reason, NODE)

    assert "llmgw-cli cert node" not in advice
    assert "--engine-networks" in advice
    assert "Set --address" in advice


VALID_FROM = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
VALID_UNTIL = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
DATED = NodeClaim("gpu-07", certificate_validity=(VALID_FROM, VALID_UNTIL))


def test_an_expired_certificate_is_named_with_its_end() -> None:
    note = certificate_dates_note(DATED, VALID_UNTIL)

    assert note == "this node's certificate expired on 2026-06-01 12:00:00 UTC. "


def test_a_certificate_not_valid_yet_by_this_clock_points_at_the_clocks() -> None:
    note = certificate_dates_note(DATED, VALID_FROM - timedelta(seconds=1))

    assert "not valid until 2026-03-01 12:00:00 UTC by this machine's clock" in note
    assert "check the clocks" in note


def test_dates_in_order_or_unknown_add_nothing() -> None:
    assert certificate_dates_note(DATED, VALID_FROM) == ""
    assert certificate_dates_note(NodeClaim("gpu-07"), VALID_UNTIL) == ""
