"""Real TLS handshakes on 127.0.0.1 with the llmgw CA's certificates.

The listener stands in for the agent hub: it upgrades each connection with
`server_ssl_context`, asks `peer_identity` who is there (node certificates only)
and greets the node by name. A refused client never hears the greeting.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from app.pki.builders import build_ca, issue, issue_node, issue_operator, issue_server
from app.pki.errors import CertificateRejected
from app.pki.explain import explain_tls_failure
from app.pki.files import load_certificate, write_ca, write_issued
from app.pki.keys import PrivateKey, generate_key
from app.pki.model import CLOCK_SKEW, CertificateKind, Usage, Validity
from app.pki.tls import (
    PeerIdentity,
    client_ssl_context,
    fetch_presented_certificate,
    peer_identity,
    server_ssl_context,
)

LOOPBACK = "127.0.0.1"
DEADLINE_S = 10.0

Outcome = PeerIdentity | ssl.SSLError | CertificateRejected | OSError


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One CA and every certificate the stories below need, written as the CLI would."""
    directory = tmp_path_factory.mktemp("pki")
    now = datetime.now(UTC)
    ca = build_ca(generate_key(), "llmgw CA", now, 30)
    write_ca(directory, ca, force=False)
    stranger = build_ca(generate_key(), "llmgw CA", now, 30)
    write_ca(directory / "stranger", stranger, force=False)
    past = Validity(not_before=now - timedelta(days=10), not_after=now - timedelta(days=1))
    loopback = ipaddress.ip_address(LOOPBACK)
    elsewhere = ipaddress.ip_address("127.0.0.2")

    def write(stem: str, build: Callable[[PrivateKey], x509.Certificate]) -> None:
        key = generate_key()
        write_issued(directory, stem, build(key), key, force=False)

    def node(key: PrivateKey, usage: Usage, validity: Validity) -> x509.Certificate:
        return issue(ca, key, common_name="gpu-07", unit="node", usages=(usage,), validity=validity)

    def expired_server(key: PrivateKey) -> x509.Certificate:
        return issue(
            ca,
            key,
            common_name=LOOPBACK,
            unit="server",
            usages=(Usage.SERVER_AUTH,),
            validity=past,
            ip_addresses=[loopback],
        )

    write("server", lambda key: issue_server(ca, key, ["localhost"], [loopback], now, 1))
    write("server-elsewhere", lambda key: issue_server(ca, key, [], [elsewhere], now, 1))
    write("server-expired", expired_server)
    write("node", lambda key: issue_node(ca, key, "gpu-07", now, 1))
    write("operator", lambda key: issue_operator(ca, key, "alice", now, 1))
    write("node-stranger", lambda key: issue_node(stranger, key, "gpu-07", now, 1))
    write("node-expired", lambda key: node(key, Usage.CLIENT_AUTH, past))
    write("node-server-auth", lambda key: node(key, Usage.SERVER_AUTH, Validity.starting(now, 1)))
    return directory


@dataclass
class Listener:
    port: int
    outcomes: asyncio.Queue[Outcome]

    async def next_outcome(self) -> Outcome:
        return await asyncio.wait_for(self.outcomes.get(), DEADLINE_S)


@asynccontextmanager
async def hub(
    pki: Path, server: str = "server", require_client_cert: bool = True
) -> AsyncIterator[Listener]:
    if server in OUT_OF_PLACE:
        context = built_elsewhere(ssl.PROTOCOL_TLS_SERVER, pki, server)
    else:
        context = server_ssl_context(
            pki / f"{server}.crt", pki / f"{server}.key", pki / "ca.crt", require_client_cert
        )
    outcomes: asyncio.Queue[Outcome] = asyncio.Queue()

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await writer.start_tls(context)
            identity = peer_identity(writer.get_extra_info("ssl_object"), CertificateKind.NODE)
        except (ssl.SSLError, CertificateRejected, OSError) as exc:
            outcomes.put_nowait(exc)
        else:
            outcomes.put_nowait(identity)
            writer.write(f"welcome {identity.common_name}\n".encode())
            await writer.drain()
        finally:
            writer.close()

    server_socket = await asyncio.start_server(greet, LOOPBACK, 0)
    try:
        yield Listener(port=server_socket.sockets[0].getsockname()[1], outcomes=outcomes)
    finally:
        server_socket.close()
        await server_socket.wait_closed()


OUT_OF_PLACE = ("server-expired", "node-expired", "node-server-auth")
"""Certificates llmgw's own contexts refuse to start with (out of date, or for the other
end): a peer that presents one anyway is built elsewhere (``built_elsewhere``)."""


def built_elsewhere(protocol: ssl._SSLMethod, pki: Path, name: str) -> ssl.SSLContext:
    """A context as ours are, but for the checks of its own certificate at start: a peer
    whose clock or whose files are wrong, or that is not llmgw."""
    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = protocol == ssl.PROTOCOL_TLS_CLIENT
    context.load_verify_locations(cafile=pki / "ca.crt")
    context.load_cert_chain(certfile=pki / f"{name}.crt", keyfile=pki / f"{name}.key")
    return context


def agent_context(pki: Path, client: str | None, trusted_ca: str = "ca.crt") -> ssl.SSLContext:
    if client in OUT_OF_PLACE:
        return built_elsewhere(ssl.PROTOCOL_TLS_CLIENT, pki, client)
    if client is None:
        return client_ssl_context(pki / trusted_ca)
    return client_ssl_context(pki / trusted_ca, pki / f"{client}.crt", pki / f"{client}.key")


async def greeting(port: int, context: ssl.SSLContext, server_hostname: str = LOOPBACK) -> bytes:
    """What the hub says after the handshake; b"" when it hangs up instead."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(LOOPBACK, port, ssl=context, server_hostname=server_hostname),
            DEADLINE_S,
        )
    except (ssl.SSLError, ConnectionError):
        return b""
    try:
        return await asyncio.wait_for(reader.readline(), DEADLINE_S)
    except (ssl.SSLError, ConnectionError):
        return b""
    finally:
        writer.close()


async def handshake_error(port: int, context: ssl.SSLContext) -> ssl.SSLError:
    with pytest.raises(ssl.SSLError) as refused:
        await asyncio.wait_for(asyncio.open_connection(LOOPBACK, port, ssl=context), DEADLINE_S)
    return refused.value


async def test_a_node_with_its_certificate_is_accepted_and_identified(pki: Path) -> None:
    async with hub(pki) as listener:
        said = await greeting(listener.port, agent_context(pki, "node"))

        assert said == b"welcome gpu-07\n"
        presented = load_certificate(pki / "node.crt")
        assert await listener.next_outcome() == PeerIdentity(
            common_name="gpu-07",
            kind=CertificateKind.NODE,
            subject="O=llmgw,OU=node,CN=gpu-07",
            serial=format(presented.serial_number, "x"),
            issued_at=presented.not_valid_before_utc + CLOCK_SKEW,
            expires_at=presented.not_valid_after_utc,
        )


async def test_the_server_is_verified_by_host_name_too(pki: Path) -> None:
    async with hub(pki) as listener:
        said = await greeting(listener.port, agent_context(pki, "node"), "localhost")

        assert said == b"welcome gpu-07\n"


async def test_a_client_without_a_certificate_is_refused(pki: Path) -> None:
    async with hub(pki) as listener:
        said = await greeting(listener.port, agent_context(pki, None))

        assert said == b""
        refusal = await listener.next_outcome()
        assert isinstance(refusal, ssl.SSLError)
        assert refusal.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE"


@pytest.mark.parametrize(
    ("client", "verify_message"),
    [
        ("node-stranger", "unable to get local issuer certificate"),
        ("node-expired", "certificate has expired"),
        ("node-server-auth", "unsuitable certificate purpose"),
    ],
    ids=["another CA", "expired", "no clientAuth"],
)
async def test_a_bad_client_certificate_is_refused_at_the_handshake(
    pki: Path, client: str, verify_message: str
) -> None:
    async with hub(pki) as listener:
        said = await greeting(listener.port, agent_context(pki, client))

        assert said == b""
        refusal = await listener.next_outcome()
        assert isinstance(refusal, ssl.SSLCertVerificationError)
        assert refusal.verify_message == verify_message


async def test_an_operator_certificate_passes_tls_but_the_hub_refuses_it(pki: Path) -> None:
    async with hub(pki) as listener:
        said = await greeting(listener.port, agent_context(pki, "operator"))

        assert said == b""
        refusal = await listener.next_outcome()
        assert isinstance(refusal, CertificateRejected)
        assert "only node certificates are accepted" in str(refusal)


async def test_with_client_certificates_optional_an_anonymous_peer_has_no_identity(
    pki: Path,
) -> None:
    async with hub(pki, require_client_cert=False) as listener:
        said = await greeting(listener.port, agent_context(pki, None))

        assert said == b""
        refusal = await listener.next_outcome()
        assert isinstance(refusal, CertificateRejected)
        assert "presented no certificate" in str(refusal)


async def test_a_server_certificate_without_the_dialled_ip_is_refused_and_explained(
    pki: Path,
) -> None:
    async with hub(pki, server="server-elsewhere") as listener:
        refusal = await handshake_error(listener.port, agent_context(pki, "node"))
        presented = await asyncio.to_thread(fetch_presented_certificate, LOOPBACK, listener.port)

    assert isinstance(refusal, ssl.SSLCertVerificationError)
    message = explain_tls_failure(refusal, LOOPBACK, presented)
    assert "not valid for 127.0.0.1: that IP address is not among its subject alternative" in (
        message
    )
    assert "(it has IP:127.0.0.2)" in message
    assert "`llmgw-cli cert server --ip 127.0.0.2 --ip 127.0.0.1 --force`" in message


async def test_an_expired_server_certificate_is_refused_and_explained(pki: Path) -> None:
    async with hub(pki, server="server-expired") as listener:
        refusal = await handshake_error(listener.port, agent_context(pki, "node"))
        presented = await asyncio.to_thread(fetch_presented_certificate, LOOPBACK, listener.port)

    message = explain_tls_failure(refusal, LOOPBACK, presented)
    assert message.startswith("the server certificate of 127.0.0.1 expired on ")
    assert "llmgw-cli cert server --ip 127.0.0.1 --force" in message


async def test_a_server_from_another_ca_is_refused_and_explained(pki: Path) -> None:
    async with hub(pki) as listener:
        context = agent_context(pki, "node-stranger", trusted_ca="stranger/ca.crt")
        refusal = await handshake_error(listener.port, context)

    assert isinstance(refusal, ssl.SSLCertVerificationError)
    message = explain_tls_failure(refusal, LOOPBACK)
    assert "not issued by the CA this side trusts" in message
    assert refusal.verify_message in message
