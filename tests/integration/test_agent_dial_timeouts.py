"""The agent's dial timeouts, on real sockets: a server whose TCP connect never completes is
left after the short connect timeout; a server that accepts TCP but never finishes its TLS
handshake (a control plane deep in a reconnect storm) is given the long open timeout before
the agent dials it again; and when there is another server, the agent dials that one too
once the handshake has been slow for ``--next-server-after``, so a frozen control plane
costs it seconds rather than the whole open timeout; and an agent the hub refuses for
connecting too often (4004) waits its longest delay before it dials again."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from agent.config import DEFAULT_OPEN_TIMEOUT_S
from agent.config_values import parse_server
from agent.connection import Backoff, DialTimeouts, stay_connected, tcp_connect
from agent.refusal_advice import NodeClaim
from app.domain.reports import AgentConnected, AgentReport
from app.hub.hub import AgentHub
from app.hub.reconnects import ConnectLimits
from tests.support.hub import LOOPBACK, Pki, dial, greet, new_node_id, pki
from tests.support.ports import free_port
from tests.support.waiting import in_background, wait_until
from wire.messages import Welcome

__all__ = ["pki"]  # the fixture, from tests.support.hub

CONNECT_S = 0.3
OPEN_S = 1.5


@contextlib.contextmanager
def unanswered_port() -> Iterator[int]:
    """A port whose TCP connects hang: a listener that never accepts, its queue full, so
    the kernel drops further SYNs (as a black-holed or overloaded server does)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


@contextlib.asynccontextmanager
async def silent_after_tcp() -> AsyncIterator[tuple[int, list[float]]]:
    """A server that accepts TCP and never speaks TLS; how long each peer stayed."""
    held: list[float] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted = time.monotonic()
        with contextlib.suppress(ConnectionError):
            while await reader.read(4096):
                pass
        held.append(time.monotonic() - accepted)
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], held
    finally:
        server.close()


async def never_served(_: ClientConnection) -> bool:
    raise AssertionError("no connection should open")


async def test_a_tcp_connect_that_hangs_gives_up_after_the_connect_timeout() -> None:
    with unanswered_port() as port:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=f"timed out after {CONNECT_S:g}s"):
            await tcp_connect("127.0.0.1", port, CONNECT_S)
        assert CONNECT_S <= time.monotonic() - started < OPEN_S


async def test_the_agent_skips_a_dead_server_fast_and_waits_long_for_a_slow_handshake() -> None:
    with unanswered_port() as dead_port:
        async with silent_after_tcp() as (slow_port, held):
            servers = [
                parse_server(f"wss://127.0.0.1:{dead_port}"),
                parse_server(f"wss://127.0.0.1:{slow_port}"),
            ]
            with capture_logs() as logs:
                async with in_background(
                    stay_connected(
                        servers,
                        ssl.create_default_context(),
                        never_served,
                        node=NodeClaim("gpu-dial"),
                        backoff=Backoff(initial_s=0.01, cap_s=0.01),
                        timeouts=DialTimeouts(connect_s=CONNECT_S, open_s=OPEN_S),
                    )
                ):
                    await wait_until(lambda: len(held) >= 2, within_s=4 * (OPEN_S + CONNECT_S))

    assert all(OPEN_S - 0.1 <= stay < OPEN_S + 1.0 for stay in held), held
    failures = [entry for entry in logs if entry["event"] == "connect_failed"]
    dead = [f for f in failures if f["server"] == servers[0].uri]
    assert dead, failures
    assert all(f"timed out after {CONNECT_S:g}s" in f["reason"] for f in dead)


async def test_dialling_the_next_server_too_never_cuts_a_slow_handshake_short() -> None:
    async with (
        silent_after_tcp() as (first_port, first),
        silent_after_tcp() as (
            second_port,
            second,
        ),
    ):
        servers = [
            parse_server(f"wss://127.0.0.1:{first_port}"),
            parse_server(f"wss://127.0.0.1:{second_port}"),
        ]
        async with in_background(
            stay_connected(
                servers,
                ssl.create_default_context(),
                never_served,
                node=NodeClaim("gpu-dial"),
                backoff=Backoff(initial_s=0.01, cap_s=0.01),
                timeouts=DialTimeouts(connect_s=CONNECT_S, open_s=OPEN_S, next_server_after_s=0.3),
            )
        ):
            await wait_until(
                lambda: len(first) >= 2 and len(second) >= 2, within_s=8 * (OPEN_S + CONNECT_S)
            )
            stays = first[:2] + second[:2]  # not the dials the test's end cuts short

    # Each server, dialled first or beside the other, kept every dial for the open timeout.
    assert all(OPEN_S - 0.1 <= stay < OPEN_S + 1.0 for stay in stays), (first, second)


class Reports:
    """What a hub hands on: every report, in order."""

    def __init__(self) -> None:
        self.seen: list[AgentReport] = []

    async def handle(self, report: AgentReport) -> None:
        self.seen.append(report)


@contextlib.asynccontextmanager
async def a_hub(
    pki: Pki, port: int = 0, connects: ConnectLimits | None = None
) -> AsyncIterator[tuple[AgentHub, Reports]]:
    reports = Reports()
    hub = AgentHub(
        reports,
        pki.server_context(),
        heartbeat_interval_s=1.0,
        server_id="second",
        connects=connects,
    )
    await hub.start(LOOPBACK, port)
    try:
        yield hub, reports
    finally:
        await hub.stop()


async def test_a_frozen_server_is_passed_over_for_the_next_one_in_seconds(pki: Pki) -> None:
    node_id = new_node_id()
    welcomed: list[tuple[Welcome, float]] = []

    async def say_hello(websocket: ClientConnection) -> bool:
        welcomed.append((await greet(websocket, node_id), time.monotonic()))
        await websocket.wait_closed()
        return True

    async with a_hub(pki) as (hub, reports), silent_after_tcp() as (frozen_port, held):
        servers = [
            parse_server(f"wss://{LOOPBACK}:{frozen_port}"),
            parse_server(f"wss://{LOOPBACK}:{hub.port}"),
        ]
        with capture_logs() as logs:
            started = time.monotonic()
            async with in_background(
                stay_connected(
                    servers,
                    pki.node(node_id),
                    say_hello,
                    node=NodeClaim(node_id),
                    timeouts=DialTimeouts(),
                )
            ):
                await wait_until(
                    lambda: bool(welcomed),
                    within_s=DEFAULT_OPEN_TIMEOUT_S / 2,
                    what="the agent welcomed by the second server",
                )
                await wait_until(lambda: len(held) == 1, what="the frozen server's dial given up")

    welcome, at = welcomed[0]
    assert welcome.server_id == "second"
    assert [r.node_id for r in reports.seen if isinstance(r, AgentConnected)] == [node_id]
    assert DialTimeouts().next_server_after_s - 0.1 <= at - started, "the first was dialled first"
    assert [(e["event"], e["server"]) for e in logs if e["event"] == "dialling_next_server"] == [
        ("dialling_next_server", servers[1].uri)
    ]


async def test_a_standby_that_refuses_at_first_is_dialled_again_while_the_frozen_dial_goes_on(
    pki: Pki,
) -> None:
    node_id = new_node_id()
    standby_port = free_port()  # claimed, so nothing listens there until the hub does
    welcomed: list[Welcome] = []

    async def say_hello(websocket: ClientConnection) -> bool:
        welcomed.append(await greet(websocket, node_id))
        await websocket.wait_closed()
        return True

    async with silent_after_tcp() as (frozen_port, held):
        servers = [
            parse_server(f"wss://{LOOPBACK}:{frozen_port}"),
            parse_server(f"wss://{LOOPBACK}:{standby_port}"),
        ]
        with capture_logs() as logs:
            async with in_background(
                stay_connected(
                    servers,
                    pki.node(node_id),
                    say_hello,
                    node=NodeClaim(node_id),
                    timeouts=DialTimeouts(next_server_after_s=1.0),
                )
            ):
                await wait_until(
                    lambda: any(
                        e["event"] == "connect_failed" and e["server"] == servers[1].uri
                        for e in logs
                    ),
                    what="the standby refusing the dial made beside the frozen one",
                )
                async with a_hub(pki, standby_port):  # the standby leads now
                    await wait_until(
                        lambda: bool(welcomed),
                        within_s=DEFAULT_OPEN_TIMEOUT_S / 2,
                        what="the agent welcomed by the new leader",
                    )
                    await wait_until(lambda: len(held) == 1, what="the frozen dial given up")

    refused = next(e for e in logs if e["event"] == "connect_failed")
    assert refused["still_dialling"] == [servers[0].uri]


async def test_an_agent_told_it_connects_too_often_waits_its_longest_delay_and_comes_back(
    pki: Pki,
) -> None:
    """An agent whose connections end at once (here: right after its welcome) reconnects
    at its backoff's first steps; the hub, allowing two connections at once, refuses the
    third with 4004. Before, 4004 was one more retryable close: the agent dialled again at
    the next step, a fraction of a second later, to be refused again."""
    node_id = new_node_id()
    welcomed: list[Welcome] = []

    async def hello_then_leave(websocket: ClientConnection) -> bool:
        try:
            welcomed.append(await greet(websocket, node_id))
        except ConnectionClosed:
            return False
        await websocket.close()
        return True

    limits = ConnectLimits(burst=2, per_minute=60)
    async with a_hub(pki, connects=limits) as (hub, _):
        with capture_logs() as logs:
            async with in_background(
                stay_connected(
                    [parse_server(f"wss://{LOOPBACK}:{hub.port}")],
                    pki.node(node_id),
                    hello_then_leave,
                    node=NodeClaim(node_id),
                    backoff=Backoff(initial_s=0.01, cap_s=2.0),
                )
            ):
                await wait_until(lambda: len(welcomed) >= 3, what="welcomed again after 4004")

    endings = [(e["reason"], e["retry_in_s"]) for e in logs if e["event"] == "disconnected"]
    refused = [delay for reason, delay in endings if "4004" in reason]
    assert refused, endings
    assert all(delay >= 1.0 for delay in refused), endings  # half the cap, at the least
    assert all(delay < 0.1 for reason, delay in endings[:2]), endings  # the first steps
    assert "too often" in next(reason for reason, _ in endings if "4004" in reason)


async def test_an_agent_told_another_agent_is_its_node_says_so_and_retries_at_its_slowest_pace(
    pki: Pki,
) -> None:
    """Another agent with this node's certificate is connected and answers: the hub refuses
    this one with 4005. It says why, waits its longest delay, and keeps trying (it does not
    exit: the other may be stopped)."""
    node_id = new_node_id()

    async def say_hello(websocket: ClientConnection) -> bool:
        await greet(websocket, node_id)
        await websocket.wait_closed()
        return True

    async with a_hub(pki) as (hub, _), dial(hub, pki.node(node_id)) as other:
        await greet(other, node_id)
        await wait_until(lambda: hub.connected_nodes() == [node_id])
        with capture_logs() as logs:
            async with in_background(
                stay_connected(
                    [parse_server(f"wss://{LOOPBACK}:{hub.port}")],
                    pki.node(node_id),
                    say_hello,
                    node=NodeClaim(node_id),
                    backoff=Backoff(initial_s=0.01, cap_s=2.0),
                )
            ) as dialling:
                await wait_until(
                    lambda: sum(e["event"] == "node_connected_elsewhere" for e in logs) >= 2,
                    what="refused twice, still trying",
                )
                assert not dialling.done()

    told = [e for e in logs if e["event"] == "node_connected_elsewhere"]
    assert all(e["retry_in_s"] >= 1.0 for e in told), told  # half the cap, at the least
    assert f"another agent runs with node {node_id}'s certificate" in told[0]["advice"]
    assert "4005" in told[0]["reason"]
