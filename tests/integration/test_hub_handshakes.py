"""A cap on agent TLS handshakes in progress per address, at a real hub over real TCP.

One address that opens TCP connections and never starts (or never finishes) their TLS
handshakes holds the hub's handshake slots and CPU. Given eight such connections from
127.0.0.1, the ninth from there is closed before any TLS, counted and logged once, while an
agent from another address (127.0.0.2, the same host) connects as usual; once the silent
ones go, an agent from 127.0.0.1 connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import pytest
from structlog.testing import capture_logs

from agent.connection import Failure, classify_failure
from app.hub.gate import DEFAULT_PER_ADDRESS
from app.hub.hub import AgentHub
from tests.support.hub import LOOPBACK, Pki, RunHub, dial, greet, hub, new_node_id, pki, run_hub
from tests.support.waiting import wait_until

__all__ = ["hub", "pki", "run_hub"]  # fixtures

pytestmark = pytest.mark.timeout(60)

AT_ONCE_S = 5.0
"""Far below the hub's TLS handshake timeout (60 s): a close within it is the cap's."""
ANOTHER_ADDRESS = "127.0.0.2"


async def closes_at_once(reader: asyncio.StreamReader) -> bool:
    """Whether the hub closes a connection that says nothing within ``AT_ONCE_S``."""
    try:
        async with asyncio.timeout(AT_ONCE_S):
            return await reader.read(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def closed_at_once(port: int) -> bool:
    """Whether a new connection from 127.0.0.1 that says nothing is closed at once."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        return await closes_at_once(reader)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_an_address_with_its_handshakes_in_progress_gets_no_more_and_others_do(
    hub: AgentHub, pki: Pki
) -> None:
    with capture_logs() as logs:
        silent = [
            await asyncio.open_connection(LOOPBACK, hub.port) for _ in range(DEFAULT_PER_ADDRESS)
        ]
        try:
            await wait_until(
                lambda: hub.connections_opening() == DEFAULT_PER_ADDRESS, what="eight opening"
            )

            assert await closed_at_once(hub.port), "the ninth from 127.0.0.1"
            assert await closed_at_once(hub.port), "the tenth"
            node_id = new_node_id()
            async with dial(hub, pki.node(node_id), source=ANOTHER_ADDRESS) as agent:
                await greet(agent, node_id)
            assert hub.connections_opening() == DEFAULT_PER_ADDRESS, "no refused one counted"
        finally:
            for _, writer in silent:
                writer.close()
        await wait_until(lambda: hub.connections_opening() == 0, what="the silent ones gone")

        node_id = new_node_id()
        async with dial(hub, pki.node(node_id)) as agent:
            await greet(agent, node_id)

    assert hub.handshakes_refused() == 2
    over_cap = [line for line in logs if line["event"] == "agent_handshake_over_cap"]
    assert [(line["address"], line["cap"]) for line in over_cap] == [
        (LOOPBACK, DEFAULT_PER_ADDRESS)
    ], "one line for the address, not one per connection"


async def test_an_agent_refused_at_the_cap_takes_it_as_a_failure_to_retry(
    hub: AgentHub, pki: Pki
) -> None:
    """Not as its certificate refused: an agent behind a busy NAT address dials again
    rather than exit."""
    silent = [await asyncio.open_connection(LOOPBACK, hub.port) for _ in range(DEFAULT_PER_ADDRESS)]
    try:
        await wait_until(
            lambda: hub.connections_opening() == DEFAULT_PER_ADDRESS, what="eight opening"
        )
        with pytest.raises((ConnectionError, ssl.SSLError)) as refused:  # a reset, seen by TLS
            async with dial(hub, pki.node(new_node_id())):
                pass
    finally:
        for _, writer in silent:
            writer.close()

    assert classify_failure(refused.value) is Failure.RETRYABLE, repr(refused.value)


async def test_the_cap_is_the_hubs_setting(run_hub: RunHub, pki: Pki) -> None:
    async with run_hub(handshakes_per_address=1) as hub:
        _, writer = await asyncio.open_connection(LOOPBACK, hub.port)
        try:
            await wait_until(lambda: hub.connections_opening() == 1, what="one opening")

            assert await closed_at_once(hub.port)
        finally:
            writer.close()
        await wait_until(lambda: hub.connections_opening() == 0, what="the silent one gone")
        node_id = new_node_id()
        async with dial(hub, pki.node(node_id)) as agent:
            await greet(agent, node_id)
        assert hub.handshakes_refused() == 1


async def test_a_hub_that_stops_closes_the_handshakes_in_progress(run_hub: RunHub) -> None:
    async with run_hub() as hub:
        reader, writer = await asyncio.open_connection(LOOPBACK, hub.port)
        await wait_until(lambda: hub.connections_opening() == 1, what="one opening")
    try:
        assert await closes_at_once(reader)
    finally:
        writer.close()


async def request_sent_with_the_handshakes_end(
    port: int, context: ssl.SSLContext, request: bytes
) -> bytes:
    """Do a TLS handshake by hand and send ``request`` in the same write as the handshake's
    last message, as a client may (so the hub reads both at once); the answer's head."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=LOOPBACK)
    try:
        async with asyncio.timeout(AT_ONCE_S):
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    writer.write(outgoing.read())
                    incoming.write(await reader.read(65536))
            tls.write(request)  # behind the client's Finished, still unsent
            writer.write(outgoing.read())
            answer = b""
            while b"\r\n\r\n" not in answer:
                data = await reader.read(65536)
                assert data, f"closed after {answer!r}"
                incoming.write(data)
                with contextlib.suppress(ssl.SSLWantReadError):
                    answer += tls.read()
        return answer
    finally:
        writer.close()


async def test_a_request_sent_with_the_last_handshake_message_is_answered(
    hub: AgentHub, pki: Pki
) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: hub\r\n\r\n"

    answer = await request_sent_with_the_handshakes_end(hub.port, pki.node(new_node_id()), request)

    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
