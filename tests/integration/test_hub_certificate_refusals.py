"""Node certificates over time, at the agent hub over real TLS.

Those its TLS handshake refuses are said on the server: one that expired, one not valid yet
by the hub's clock (a clock minutes off), one issued by another CA with the same name. The
agent is told nothing (asyncio closes without a TLS alert), so before, a node whose
certificate expired dropped off the fleet with no line on any server. And the soonest end
of the connected agents' certificates is kept for ``/metrics``, so that an end is seen
weeks ahead.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography import x509
from structlog.testing import capture_logs
from websockets.exceptions import InvalidMessage

from app.hub.hub import AgentHub
from app.pki.builders import issue, issue_node
from app.pki.keys import PrivateKey
from app.pki.model import CLOCK_SKEW, CertificateAuthority, CertificateKind, Usage, Validity
from tests.support.hub import (
    ENGINE_ADDRESS,
    Pki,
    RunHub,
    dial,
    greet,
    hub,
    new_node_id,
    pki,
    run_hub,
)

__all__ = ["hub", "pki", "run_hub"]  # fixtures

pytestmark = pytest.mark.timeout(60)

Build = Callable[[PrivateKey], x509.Certificate]


def node_certificate(
    ca: CertificateAuthority, not_before: datetime, not_after: datetime, node_id: str = ""
) -> Build:
    """A node certificate with these dates exactly, as the CA signs it."""

    def build(key: PrivateKey) -> x509.Certificate:
        return issue(
            ca,
            key,
            common_name=node_id or new_node_id(),
            unit=CertificateKind.NODE,
            usages=(Usage.CLIENT_AUTH,),
            validity=Validity(not_before=not_before, not_after=not_after),
            ip_addresses=(ipaddress.ip_address(ENGINE_ADDRESS),),
        )

    return build


def certificate_refusals(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] == "agent_certificate_refused"]


async def dial_refused(hub: AgentHub, pki: Pki, build: Build) -> None:
    """Dial with the certificate ``build`` makes: the hub hangs up after the handshake."""
    with pytest.raises(InvalidMessage):
        async with dial(hub, pki.client(build)):
            pass


async def test_an_expired_node_certificate_is_logged_with_what_fixes_it(
    run_hub: RunHub, pki: Pki
) -> None:
    now = datetime.now(UTC)
    expired = node_certificate(pki.ca, now - timedelta(days=2), now - timedelta(hours=1))
    async with run_hub() as hub:
        with capture_logs() as logs:
            await dial_refused(hub, pki, expired)
            await dial_refused(hub, pki, expired)

        [line] = certificate_refusals(logs)  # the second within the minute: counted, not logged
        assert line["address"] == "127.0.0.1"
        assert line["reason"].startswith("the node certificate has expired")
        assert "llmgw-cli cert node <node-id> --force" in line["reason"]
        assert hub.certificates_refused() == 2


async def test_a_node_certificate_not_valid_yet_by_the_hubs_clock_names_the_clocks(
    hub: AgentHub, pki: Pki
) -> None:
    """Issued on a machine whose clock is ten minutes ahead: the CA's five minutes of
    backdating do not cover it."""
    ahead = datetime.now(UTC) + timedelta(minutes=10)
    early = node_certificate(pki.ca, ahead - CLOCK_SKEW, ahead + timedelta(days=1))
    with capture_logs() as logs:
        await dial_refused(hub, pki, early)

    [line] = certificate_refusals(logs)
    assert "not valid yet by this server's clock" in line["reason"]
    assert "ahead by more than 5 minutes" in line["reason"]


async def test_a_node_certificate_of_another_ca_with_the_same_name_is_logged(
    hub: AgentHub, pki: Pki
) -> None:
    assert pki.stranger.certificate.subject == pki.ca.certificate.subject
    node_id = new_node_id()
    with capture_logs() as logs:
        await dial_refused(hub, pki, lambda key: issue_node(pki.stranger, key, node_id, pki.now, 1))

    [line] = certificate_refusals(logs)
    assert "not issued by the CA this server trusts" in line["reason"]


async def test_the_soonest_end_of_the_connected_agents_certificates_is_kept(
    run_hub: RunHub, pki: Pki
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    soon, later = new_node_id(), new_node_id()
    ends = {soon: now + timedelta(days=3), later: now + timedelta(days=300)}
    async with run_hub() as hub:
        assert hub.earliest_certificate_end() is None
        async with (
            dial(hub, pki.client(node_certificate(pki.ca, now, ends[soon], soon))) as first,
            dial(hub, pki.client(node_certificate(pki.ca, now, ends[later], later))) as second,
        ):
            await greet(first, soon)
            await greet(second, later)
            assert hub.earliest_certificate_end() == ends[soon]
