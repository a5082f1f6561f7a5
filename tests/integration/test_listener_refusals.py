"""What a listener refuses by itself is seen by its operator, over real sockets.

Given a gateway whose client listener holds as many connections as it may, each connection
more is answered 503 with ``Retry-After``, counted on ``/metrics`` under
``reason="connections"``, and logged once as a warning however many come. Every other
refusal the listener answers before the app sees a request (a late head, an oversized
one, one HTTP cannot parse, one a proxy could frame otherwise, a body announced over the
limit) is counted and logged under a reason of its own. The admin API's listener (uvicorn
with the same limits) does the same, and uvicorn's own warning for each request it cannot
parse is left out of the log.

A connection that sends nothing at all (a load balancer's connection opened ahead of use, a
TCP health check) is no refusal: at its header timeout it is closed without an answer,
counted under ``..._listener_idle_closed_total`` and not logged, while one that began a
head and stalled is still answered 408 and counted as ``header_timeout``. Nor is one that
sends only empty lines, which begin no request: however many it sends, it is closed at the
same time, and a request after them is served. A kept-alive connection closed at the idle
time between requests is counted too, under ``..._listener_keepalive_closed_total``, and
empty lines do not keep it open longer; the admin API's keep-alive time is its own setting,
and one shorter than a second is kept to within a quarter of it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator

import httpx
import pytest
from structlog.testing import capture_logs

from app.admin.tls import DEFAULT_ADMIN_KEEP_ALIVE_S
from app.gateway.server import StaticSource
from app.listeners.limits import ListenerLimits
from app.store.postgres import PostgresEventStore
from tests.integration.test_listener_limits import HEAD, admin_listener, status_of, trickle
from tests.support.admin_server import serving_admin
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

REFUSED_EVENT = "listener_refused"
REASONS = {
    "connections",
    "header_timeout",
    "body_timeout",
    "header_size",
    "body_size",
    "malformed",
    "framing",
}
"""The metric's ``reason`` label takes these values and no other (docs/operations.md)."""
GATEWAY_IDLE_CLOSED = "llmgw_gateway_listener_idle_closed"
CAP = 4
CAPPED = ListenerLimits(header_timeout_s=30.0, body_timeout_s=30.0, max_connections=CAP)
QUICK = ListenerLimits(header_timeout_s=1.0, body_timeout_s=30.0, max_connections=64)


@pytest.fixture
def capped() -> Iterator[GatewayThread]:
    _, record = new_key()
    source = StaticSource(snapshot_of([], [record]))
    with GatewayThread(source, limits=CAPPED, metrics_port=0) as gateway:
        yield gateway


async def refusals_of(gateway: GatewayThread, listener: str = "client") -> dict[str, float]:
    """``llmgw_gateway_listener_refusals_total`` of ``listener``, by reason, from
    ``/metrics``."""
    return await refusals_on(gateway.metrics_url, "llmgw_gateway_listener_refusals", listener)


async def refusals_on(metrics_url: str, metric: str, listener: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=10) as client:
        page = (await client.get(metrics_url)).text
    series = f'{metric}_total{{listener="{listener}",reason="'
    pattern = "^" + re.escape(series) + r'([a-z_]+)"\} (\S+)$'
    return {reason: float(value) for reason, value in re.findall(pattern, page, re.MULTILINE)}


async def idle_closed_on(metrics_url: str, metric: str) -> dict[str, float]:
    """``{metric}_total`` (a counter labelled by listener alone), by listener."""
    async with httpx.AsyncClient(timeout=10) as client:
        page = (await client.get(metrics_url)).text
    pattern = "^" + re.escape(f'{metric}_total{{listener="') + r'([a-z]+)"\} (\S+)$'
    return {listener: float(value) for listener, value in re.findall(pattern, page, re.M)}


async def answer_to(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_a_gateway_at_its_connection_limit_says_so_to_client_metrics_and_log(
    capped: GatewayThread,
) -> None:
    port = capped.gateway.port
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(CAP)]
    try:
        with capture_logs() as logs:
            answers = [await answer_to(port, HEAD) for _ in range(3)]
    finally:
        for _, writer in held:
            writer.close()

    for answer in answers:
        assert status_of(answer) == 503
        assert b"\r\nretry-after: 1\r\n" in answer.lower()
    counted = await refusals_of(capped)
    assert counted["connections"] == 3
    assert set(counted) == REASONS
    [line] = [entry for entry in logs if entry["event"] == REFUSED_EVENT]
    assert line["log_level"] == "warning"
    assert line["listener"] == "client"  # as the metric labels it
    assert line["reason"] == "connections"
    assert line["status"] == 503
    assert line["limit"] == CAP
    assert line["client"] == "127.0.0.1"
    assert line["refused_unlogged"] == 0


async def test_a_hostile_crowd_at_the_limit_adds_to_a_count_not_to_the_log_or_the_series(
    capped: GatewayThread,
) -> None:
    port = capped.gateway.port
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(CAP)]
    try:
        with capture_logs() as logs:
            answers = await asyncio.gather(*(answer_to(port, HEAD) for _ in range(200)))
    finally:
        for _, writer in held:
            writer.close()

    assert {status_of(answer) for answer in answers} == {503}
    counted = await refusals_of(capped)
    assert counted["connections"] == 200
    assert set(counted) == REASONS
    assert len([entry for entry in logs if entry["event"] == REFUSED_EVENT]) == 1


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


REFUSED = {
    "header_size": (431, b"GET /healthz HTTP/1.1\r\nHost: llmgw\r\nX-Padding: " + b"a" * 100_000),
    "malformed": (400, b"GET /healthz HTTP/1.1\r\nHost: llm\x01gw\r\n\r\n"),
    "framing": (400, head("GET /healthz HTTP/1.1", "Host: a", "Host: b")),
    "body_size": (
        413,
        head("POST /v1/completions HTTP/1.1", "Host: llmgw", "Content-Length: 999999999999"),
    ),
    "header_timeout": (408, b"GET /healthz HTTP/1.1\r\nHost: llmgw\r\n"),
}


async def test_every_refusal_before_the_app_is_counted_and_logged_by_its_reason() -> None:
    _, record = new_key()
    source = StaticSource(snapshot_of([], [record]))
    with GatewayThread(source, limits=QUICK, metrics_port=0) as gateway:
        with capture_logs() as logs:
            for reason, (status, request) in REFUSED.items():
                answer = await answer_to(gateway.gateway.port, request)
                assert status_of(answer) == status, reason
                assert b"retry-after" not in answer.lower()

            async def all_logged() -> bool:
                return len([e for e in logs if e["event"] == REFUSED_EVENT]) == len(REFUSED)

            await wait_until(all_logged, what="a line for each refusal")
        counted = await refusals_of(gateway)

    assert {reason: counted[reason] for reason in REFUSED} == dict.fromkeys(REFUSED, 1.0)
    assert counted["connections"] == counted["body_timeout"] == 0
    lines = {entry["reason"]: entry for entry in logs if entry["event"] == REFUSED_EVENT}
    assert set(lines) == set(REFUSED)
    assert {entry["log_level"] for entry in lines.values()} == {"warning"}
    assert {reason: entry["status"] for reason, entry in lines.items()} == {
        reason: status for reason, (status, _) in REFUSED.items()
    }
    assert lines["header_timeout"]["limit"] == 1.0
    assert lines["body_size"]["limit"] == gateway.gateway.limits.max_body_bytes


# -- the admin API (uvicorn, with the same limits) ----------------------------------------

ADMIN_REFUSALS = "llmgw_admin_listener_refusals"
ADMIN_IDLE_CLOSED = "llmgw_admin_listener_idle_closed"


async def test_the_admin_api_at_its_connection_limit_says_so_to_client_metrics_and_log(
    pg_store: PostgresEventStore,
) -> None:
    async with admin_listener(pg_store, CAPPED) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(CAP)]
        try:
            with capture_logs() as logs:
                answers = [await answer_to(port, HEAD) for _ in range(3)]
        finally:
            for _, writer in held:
                writer.close()

        async def counted() -> bool:
            url = f"http://127.0.0.1:{port}/metrics"
            try:
                return (await refusals_on(url, ADMIN_REFUSALS, "admin")).get("connections") == 3
            except httpx.HTTPError:
                return False  # still at the limit: the held connections are closing

        await wait_until(counted, what="the refusals on the admin API's /metrics")
        page = await refusals_on(f"http://127.0.0.1:{port}/metrics", ADMIN_REFUSALS, "admin")

    for answer in answers:
        assert status_of(answer) == 503
        assert b"\r\nretry-after: 1\r\n" in answer.lower()
    assert set(page) == REASONS
    [line] = [entry for entry in logs if entry["event"] == REFUSED_EVENT]
    assert line["log_level"] == "warning"
    assert line["listener"] == "admin"  # as the metric labels it
    assert line["reason"] == "connections"
    assert line["limit"] == CAP
    assert line["refused_unlogged"] == 0


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def test_requests_the_admin_api_cannot_parse_are_counted_and_logged_once(
    pg_store: PostgresEventStore,
) -> None:
    uvicorn_lines = Records()
    uvicorn_log = logging.getLogger("uvicorn")
    uvicorn_log.addHandler(uvicorn_lines)
    try:
        async with admin_listener(pg_store, CAPPED) as port:
            with capture_logs() as logs:
                answers = [await answer_to(port, REFUSED["malformed"][1]) for _ in range(3)]
            page = await refusals_on(f"http://127.0.0.1:{port}/metrics", ADMIN_REFUSALS, "admin")
    finally:
        uvicorn_log.removeHandler(uvicorn_lines)

    assert [status_of(answer) for answer in answers] == [400] * 3
    assert page["malformed"] == 3
    [line] = [entry for entry in logs if entry["event"] == REFUSED_EVENT]
    assert (line["reason"], line["log_level"], line["status"]) == ("malformed", "warning", 400)
    assert "Invalid HTTP request received." not in uvicorn_lines.messages


# -- a kept-alive connection idle between requests is no refusal --------------------------


async def idle_between_requests(port: int) -> tuple[int, int]:
    """One request answered on a kept-alive connection, which then idles until a late head
    on another connection, opened after that answer, is refused 408 (so the head timeout
    has passed for the idle one too); then a second request on the idle connection. The
    statuses of the late head and of the second request."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(HEAD)
        await writer.drain()
        assert status_of(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)) == 200
        late = await answer_to(port, REFUSED["header_timeout"][1])
        writer.write(HEAD)
        await writer.drain()
        again = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        return status_of(late), status_of(again)
    finally:
        writer.close()


async def test_a_gateway_connection_idle_between_requests_is_not_refused() -> None:
    _, record = new_key()
    source = StaticSource(snapshot_of([], [record]))
    with GatewayThread(source, limits=QUICK, metrics_port=0) as gateway:
        with capture_logs() as logs:
            assert await idle_between_requests(gateway.gateway.port) == (408, 200)
        counted = await refusals_of(gateway)

    assert counted["header_timeout"] == 1
    assert [e["reason"] for e in logs if e["event"] == REFUSED_EVENT] == ["header_timeout"]


async def test_an_admin_api_connection_idle_between_requests_is_not_refused(
    pg_store: PostgresEventStore,
) -> None:
    async with admin_listener(pg_store, QUICK) as port:
        with capture_logs() as logs:
            assert await idle_between_requests(port) == (408, 200)
        page = await refusals_on(f"http://127.0.0.1:{port}/metrics", ADMIN_REFUSALS, "admin")

    assert page["header_timeout"] == 1
    assert [e["reason"] for e in logs if e["event"] == REFUSED_EVENT] == ["header_timeout"]


# -- a connection that never sends a byte is closed quietly, not refused ------------------

SILENT_WITHIN = ListenerLimits(header_timeout_s=0.3, body_timeout_s=30.0, max_connections=64)
STALLED_HEAD = b"GET / HTTP/1.1\r\n"
WARNING_OR_ABOVE = {"warning", "error", "critical"}


async def test_a_gateway_closes_a_silent_connection_unanswered_and_counts_it_apart() -> None:
    _, record = new_key()
    source = StaticSource(snapshot_of([], [record]))
    with GatewayThread(source, limits=SILENT_WITHIN, metrics_port=0) as gateway:
        before = await idle_closed_on(gateway.metrics_url, GATEWAY_IDLE_CLOSED)
        with capture_logs() as logs:
            silent = await answer_to(gateway.gateway.port, b"")
            quiet_lines = [e for e in logs if e["log_level"] in WARNING_OR_ABOVE]
            stalled = await answer_to(gateway.gateway.port, STALLED_HEAD)
        after = await idle_closed_on(gateway.metrics_url, GATEWAY_IDLE_CLOSED)
        counted = await refusals_of(gateway)

    assert silent == b""
    assert quiet_lines == []
    assert before == {"client": 0, "metrics": 0}
    assert after == {"client": 1, "metrics": 0}
    assert status_of(stalled) == 408
    assert counted["header_timeout"] == 1
    assert sum(counted.values()) == 1
    [line] = [e for e in logs if e["event"] == REFUSED_EVENT]
    assert (line["reason"], line["status"]) == ("header_timeout", 408)


async def test_the_admin_api_closes_a_silent_connection_unanswered_and_counts_it_apart(
    pg_store: PostgresEventStore,
) -> None:
    async with admin_listener(pg_store, SILENT_WITHIN) as port:
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        before = await idle_closed_on(metrics_url, ADMIN_IDLE_CLOSED)
        with capture_logs() as logs:
            silent = await answer_to(port, b"")
            quiet_lines = [e for e in logs if e["log_level"] in WARNING_OR_ABOVE]
            stalled = await answer_to(port, STALLED_HEAD)
        after = await idle_closed_on(metrics_url, ADMIN_IDLE_CLOSED)
        counted = await refusals_on(metrics_url, ADMIN_REFUSALS, "admin")

    assert silent == b""
    assert quiet_lines == []
    assert before == {"admin": 0}
    assert after == {"admin": 1}
    assert status_of(stalled) == 408
    assert counted["header_timeout"] == 1
    assert sum(counted.values()) == 1
    [line] = [e for e in logs if e["event"] == REFUSED_EVENT]
    assert (line["reason"], line["status"]) == ("header_timeout", 408)


# -- empty lines before a request are no request (RFC 9112, 2.2) --------------------------

EMPTY_LINES = b"\r\n\r\n"
"""What some clients and load balancers send between requests, or as a keep-alive probe."""
MANY_EMPTY_LINES = b"\r\n" * (50 * 1024)
"""100 KiB of empty lines, sent at once: more than a head may hold (64 KiB), and no head."""
EMPTY_LINES_SENT = pytest.mark.parametrize(
    "lines", [EMPTY_LINES, MANY_EMPTY_LINES], ids=["two", "100KiB"]
)
"""Empty lines are no request however many come: none counts towards a head."""
LAST_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: llmgw\r\nConnection: close\r\n\r\n"


@EMPTY_LINES_SENT
async def test_a_gateway_closes_a_connection_of_empty_lines_quietly_as_an_idle_one(
    lines: bytes,
) -> None:
    _, record = new_key()
    source = StaticSource(snapshot_of([], [record]))
    with GatewayThread(source, limits=SILENT_WITHIN, metrics_port=0) as gateway:
        port = gateway.gateway.port
        with capture_logs() as logs:
            empty = await answer_to(port, lines)
            served = await answer_to(port, lines + LAST_REQUEST)
        idle = await idle_closed_on(gateway.metrics_url, GATEWAY_IDLE_CLOSED)
        counted = await refusals_of(gateway)

    assert empty == b""
    assert status_of(served) == 200
    assert idle == {"client": 1, "metrics": 0}
    assert sum(counted.values()) == 0
    assert [e for e in logs if e["log_level"] in WARNING_OR_ABOVE] == []


@EMPTY_LINES_SENT
async def test_the_admin_api_closes_a_connection_of_empty_lines_quietly_as_an_idle_one(
    pg_store: PostgresEventStore, lines: bytes
) -> None:
    async with admin_listener(pg_store, SILENT_WITHIN) as port:
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        with capture_logs() as logs:
            empty = await answer_to(port, lines)
            served = await answer_to(port, lines + LAST_REQUEST)
        idle = await idle_closed_on(metrics_url, ADMIN_IDLE_CLOSED)
        counted = await refusals_on(metrics_url, ADMIN_REFUSALS, "admin")

    assert empty == b""
    assert status_of(served) == 200
    assert idle == {"admin": 1}
    assert sum(counted.values()) == 0
    assert [e for e in logs if e["log_level"] in WARNING_OR_ABOVE] == []


ENDLESS_EMPTY_LINES = b"\r\n" * 100
"""Sent a byte at a time (``trickle``): seconds of them, far past ``SILENT_WITHIN``'s."""


async def test_a_gateway_connection_sending_empty_lines_without_end_is_closed_in_time() -> None:
    _, record = new_key()
    source = StaticSource(snapshot_of([], [record]))
    with GatewayThread(source, limits=SILENT_WITHIN, metrics_port=0) as gateway:
        cut = await trickle(gateway.gateway.port, ENDLESS_EMPTY_LINES)
        idle = await idle_closed_on(gateway.metrics_url, GATEWAY_IDLE_CLOSED)
        counted = await refusals_of(gateway)

    assert cut.sent < len(ENDLESS_EMPTY_LINES)
    assert cut.answer == b""
    assert idle["client"] == 1
    assert sum(counted.values()) == 0


async def test_an_admin_api_connection_sending_empty_lines_without_end_is_closed_in_time(
    pg_store: PostgresEventStore,
) -> None:
    async with admin_listener(pg_store, SILENT_WITHIN) as port:
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        cut = await trickle(port, ENDLESS_EMPTY_LINES)
        idle = await idle_closed_on(metrics_url, ADMIN_IDLE_CLOSED)
        counted = await refusals_on(metrics_url, ADMIN_REFUSALS, "admin")

    assert cut.sent < len(ENDLESS_EMPTY_LINES)
    assert cut.answer == b""
    assert idle == {"admin": 1}
    assert sum(counted.values()) == 0


# -- a kept-alive connection closed at the idle time is counted apart -------------------

ADMIN_KEEPALIVE_CLOSED = "llmgw_admin_listener_keepalive_closed"
KEEP_ALIVE_S = 0.5


async def test_the_admin_api_counts_a_kept_alive_connection_it_closed_when_idle(
    pg_store: PostgresEventStore,
) -> None:
    async with serving_admin(pg_store, limits=QUICK, keep_alive_s=KEEP_ALIVE_S) as url:
        port = int(url.rsplit(":", 1)[1])
        metrics_url = f"{url}/metrics"
        before = await idle_closed_on(metrics_url, ADMIN_KEEPALIVE_CLOSED)
        with capture_logs() as logs:
            answer = await answer_to(port, HEAD)
        after = await idle_closed_on(metrics_url, ADMIN_KEEPALIVE_CLOSED)
        silent = await idle_closed_on(metrics_url, ADMIN_IDLE_CLOSED)
        counted = await refusals_on(metrics_url, ADMIN_REFUSALS, "admin")

    assert status_of(answer) == 200
    assert before == {"admin": 0}
    assert after == {"admin": 1}
    assert silent == {"admin": 0}
    assert sum(counted.values()) == 0
    assert [e for e in logs if e["log_level"] in WARNING_OR_ABOVE] == []


async def test_empty_lines_do_not_keep_an_idle_admin_api_connection_open(
    pg_store: PostgresEventStore,
) -> None:
    """uvicorn restarts a kept-alive connection's idle time at every byte it reads; empty
    lines begin no request, so they must not: the connection is closed at the idle time
    from its last answer however many come."""
    async with serving_admin(pg_store, limits=QUICK, keep_alive_s=KEEP_ALIVE_S) as url:
        port = int(url.rsplit(":", 1)[1])
        cut = await trickle(port, ENDLESS_EMPTY_LINES, quickly=HEAD)
        closed = await idle_closed_on(f"{url}/metrics", ADMIN_KEEPALIVE_CLOSED)

    assert cut.sent < len(ENDLESS_EMPTY_LINES)
    assert status_of(cut.answer) == 200
    assert cut.answer.count(b"HTTP/1.1 ") == 1
    assert closed == {"admin": 1}


async def test_an_admin_api_connection_whose_body_came_after_its_answer_is_closed_when_idle(
    pg_store: PostgresEventStore,
) -> None:
    """An answer that needs no body (no such path) goes before the body has come; the body
    then comes, and the connection is idle: the idle time holds for it as for any other,
    or a client could keep connections open for ever at no cost."""
    async with serving_admin(pg_store, limits=QUICK, keep_alive_s=KEEP_ALIVE_S) as url:
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head("POST /no-such-path HTTP/1.1", "Host: llmgw", "Content-Length: 5"))
            await writer.drain()
            answered = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            writer.write(b"hello")
            await writer.drain()
            rest = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        closed = await idle_closed_on(f"{url}/metrics", ADMIN_KEEPALIVE_CLOSED)

    assert status_of(answered) == 404
    assert b"HTTP/1.1 " not in rest
    assert closed == {"admin": 1}


SLOW_SWEEP = ListenerLimits(header_timeout_s=10.0, body_timeout_s=60.0, max_connections=64)
"""Timeouts for which the sweep alone would run once a second."""
SHORT_KEEP_ALIVE_S = 0.2


async def test_a_short_admin_keep_alive_time_closes_an_idle_connection_after_it(
    pg_store: PostgresEventStore,
) -> None:
    """A kept-alive connection idle past the listener's keep-alive time is closed and
    counted, at that time, not at uvicorn's 5 s; how late after it at most is the sweep's
    period (tests/unit/test_listener_sweep.py), which a busy machine's clock would blur
    here."""
    async with serving_admin(pg_store, limits=SLOW_SWEEP, keep_alive_s=SHORT_KEEP_ALIVE_S) as url:
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(HEAD)
            await writer.drain()
            answered = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            answered_at = time.monotonic()
            await asyncio.wait_for(reader.read(), 10)
            idle_s = time.monotonic() - answered_at
        finally:
            writer.close()
        closed = await idle_closed_on(f"{url}/metrics", ADMIN_KEEPALIVE_CLOSED)

    assert status_of(answered) == 200
    assert closed == {"admin": 1}
    assert idle_s < DEFAULT_ADMIN_KEEP_ALIVE_S / 2
