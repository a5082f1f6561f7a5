"""A client that goes away cancels its request in the engine, wherever the request was.

Given a slow simulator behind a real gateway, a client disconnects mid-stream, before the
first chunk of a stream, while a whole answer is being generated, and while queued for a
replica; each time the simulator counts an aborted request (its own
``llmgw_sim:requests_aborted_total``) or never sees the request, and the gateway's
in-flight count falls back to zero. And a request that waits for a replica longer than the
queue timeout is refused with a retryable 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import msgspec
import openai
import pytest

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.gateway.server import StaticSource
from app.gateway.table import Route, RoutePolicy
from app.listeners.limits import ListenerLimits
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

MODEL = f"slow-{uuid.uuid4().hex[:8]}"
REPLICA = f"{MODEL}-1"
SLOW = (
    "--max-num-seqs", "1",
    "--prefill-ms-per-token", "40",
    "--decode-base-ms", "40",
    "--decode-per-seq-ms", "0",
)  # fmt: skip
"""One request at a time, 40 ms per prompt token and per output token."""
LONG_PROMPT = " ".join(["word"] * 100)
"""About 4 s before the first token."""
SHORT_PROMPT = "hi"
TPM = 1_000_000
LIMITED_KEY, LIMITED_RECORD = new_key(tpm=TPM)
"""A key with a tokens-per-minute limit, which the gateway charges what each answer used."""


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with start_simulator("--model", MODEL, *SLOW, port=free_port()) as process:
        process.wait_healthy()
        yield process


@pytest.fixture(scope="module")
def key_and_gateway(sim: SimulatorProcess) -> Iterator[tuple[str, GatewayThread]]:
    key, record = new_key()
    # target_waiting 1: while the one slot is busy the replica takes nothing more, so a
    # second request waits in the gateway's queue.
    route = Route(replica_id=REPLICA, model=MODEL, url=sim.base_url, target_waiting=1)
    source = StaticSource(snapshot_of([route], [record, LIMITED_RECORD]))
    with GatewayThread(source, scrape_interval_s=0.05, queue_timeout_s=30) as gateway:
        yield key, gateway


@pytest.fixture
def key(key_and_gateway: tuple[str, GatewayThread]) -> str:
    return key_and_gateway[0]


@pytest.fixture
def gateway(key_and_gateway: tuple[str, GatewayThread]) -> GatewayThread:
    return key_and_gateway[1]


class Counts(msgspec.Struct, frozen=True):
    aborted: float
    succeeded: float
    running: float
    waiting: float


async def counts(sim: SimulatorProcess) -> Counts:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{sim.base_url}/metrics")).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name = series.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(value)
    return Counts(
        aborted=values["llmgw_sim:requests_aborted_total"],
        succeeded=values["vllm:request_success_total"],
        running=values["vllm:num_requests_running"],
        waiting=values["vllm:num_requests_waiting"],
    )


@pytest.fixture
async def idle(sim: SimulatorProcess, gateway: GatewayThread) -> AsyncIterator[Counts]:
    """The simulator and the gateway have nothing in flight, before and after the test."""

    async def quiet() -> bool:
        now = await counts(sim)
        return now.running == 0 and now.waiting == 0 and gateway.in_flight()[REPLICA] == 0

    await wait_until(quiet, what="an idle simulator and gateway")
    yield await counts(sim)
    await wait_until(quiet, what="nothing left in flight after the test")


async def aborted_once(sim: SimulatorProcess, before: Counts) -> None:
    async def aborted() -> bool:
        return (await counts(sim)).aborted == before.aborted + 1

    await wait_until(aborted, within_s=10, what="the simulator aborting the request")
    assert (await counts(sim)).succeeded == before.succeeded


async def engine_has_it(sim: SimulatorProcess) -> None:
    async def busy() -> bool:
        now = await counts(sim)
        return now.running + now.waiting >= 1

    await wait_until(busy, what="the request reaching the engine")


def chat_body(prompt: str, *, stream: bool, max_tokens: int = 200, model: str = MODEL) -> bytes:
    return msgspec.json.encode(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    )


def chat_request(key: str, body: bytes) -> bytes:
    """A whole chat completions request with ``body``, as a client writes it."""
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (key.encode(), len(body), body)
    )


class RawRequest:
    """One request on a connection of our own, so the test decides when it drops."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self._writer = writer

    @classmethod
    async def send(cls, gateway: GatewayThread, key: str, body: bytes) -> RawRequest:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.gateway.port)
        writer.write(chat_request(key, body))
        await writer.drain()
        return cls(reader, writer)

    async def hang_up(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


async def test_a_client_leaving_mid_stream_aborts_the_engine_request(
    sim: SimulatorProcess, gateway: GatewayThread, key: str, idle: Counts
) -> None:
    async with openai.AsyncOpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": SHORT_PROMPT}],
            max_tokens=200,
            stream=True,
        )
        seen = 0
        async for chunk in stream:
            seen += bool(chunk.choices and chunk.choices[0].delta.content)
            if seen == 2:
                break
        await stream.close()
    await aborted_once(sim, idle)


async def test_the_tokens_a_stream_sent_before_its_client_left_are_charged_to_the_key(
    sim: SimulatorProcess, gateway: GatewayThread, idle: Counts
) -> None:
    async with openai.AsyncOpenAI(
        base_url=gateway.url, api_key=LIMITED_KEY, max_retries=0
    ) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": SHORT_PROMPT}],
            max_tokens=200,
            stream=True,
        )
        seen = 0
        async for chunk in stream:
            seen += bool(chunk.choices and chunk.choices[0].delta.content)
            if seen == 20:
                break
        await stream.close()
        await aborted_once(sim, idle)
        await wait_until(lambda: gateway.in_flight()[REPLICA] == 0, what="the stream ended")

        # Leaving before the end must not make the tokens free: a client could read every
        # answer but its last event and never be charged.
        answer = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": SHORT_PROMPT}], max_tokens=1
        )
    remaining = int(answer.headers["x-ratelimit-remaining-tokens"])
    # One token per event sent (the stream had no usage chunk yet); the minute slides, so
    # a little of the charge may have aged out since.
    assert remaining <= TPM - seen * 3 // 4


async def test_a_client_leaving_before_the_first_chunk_aborts_the_engine_request(
    sim: SimulatorProcess, gateway: GatewayThread, key: str, idle: Counts
) -> None:
    request = await RawRequest.send(gateway, key, chat_body(LONG_PROMPT, stream=True))
    head = await request.reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    await engine_has_it(sim)
    assert (await counts(sim)).succeeded == idle.succeeded
    await request.hang_up()
    await aborted_once(sim, idle)


async def test_a_client_leaving_a_whole_answer_aborts_the_engine_request(
    sim: SimulatorProcess, gateway: GatewayThread, key: str, idle: Counts
) -> None:
    request = await RawRequest.send(gateway, key, chat_body(SHORT_PROMPT, stream=False))
    await engine_has_it(sim)
    await request.hang_up()
    await aborted_once(sim, idle)


@contextlib.contextmanager
def one_at_a_time(gateway: GatewayThread) -> Iterator[None]:
    """The replica takes one request at a time from this gateway whatever its signals say
    (``routing.max_in_flight: 1``): admission alone would let a second request through to
    the engine whenever a scrape comes late, as on a busy machine."""
    before = gateway.source.current()
    gateway.publish(msgspec.structs.replace(before, policies={MODEL: RoutePolicy(max_in_flight=1)}))
    try:
        yield
    finally:
        gateway.publish(before)


async def test_a_client_leaving_the_queue_never_reaches_the_engine(
    sim: SimulatorProcess, gateway: GatewayThread, key: str, idle: Counts
) -> None:
    with one_at_a_time(gateway):
        await leave_the_queue(sim, gateway, key, idle)


async def leave_the_queue(
    sim: SimulatorProcess, gateway: GatewayThread, key: str, idle: Counts
) -> None:
    holder = await RawRequest.send(gateway, key, chat_body(SHORT_PROMPT, stream=False))
    await engine_has_it(sim)
    queued = await RawRequest.send(gateway, key, chat_body(SHORT_PROMPT, stream=False))
    await wait_until(
        lambda: gateway.call(gateway.gateway.router.queued).get(MODEL) == 1,
        what="the second request queued in the gateway",
    )
    await queued.hang_up()
    await wait_until(
        lambda: not gateway.call(gateway.gateway.router.queued),
        what="the queue emptied",
    )
    await holder.hang_up()
    await aborted_once(sim, idle)
    await wait_until(lambda: gateway.in_flight()[REPLICA] == 0, what="the holder released")
    final = await counts(sim)
    assert (final.aborted, final.succeeded) == (idle.aborted + 1, idle.succeeded)


async def test_a_request_that_waits_too_long_for_a_replica_gets_429(
    sim: SimulatorProcess, gateway: GatewayThread, key: str, idle: Counts
) -> None:
    # Two requests through the first gateway: one runs in the engine's only slot, one
    # waits, which puts the replica at its target_waiting of 1 for any gateway.
    running = await RawRequest.send(gateway, key, chat_body(SHORT_PROMPT, stream=False))
    await engine_has_it(sim)
    waiting = await RawRequest.send(gateway, key, chat_body(SHORT_PROMPT, stream=False))

    async def one_running_one_waiting() -> bool:
        now = await counts(sim)
        return (now.running, now.waiting) == (1, 1)

    await wait_until(one_running_one_waiting, what="both requests in the engine")
    impatient_key, record = new_key()
    route = Route(replica_id=REPLICA, model=MODEL, url=sim.base_url, target_waiting=1)
    source = StaticSource(snapshot_of([route], [record]))
    try:
        with GatewayThread(source, scrape_interval_s=0.05, queue_timeout_s=0.3) as impatient:

            def sees_a_full_replica() -> bool:
                views = impatient.call(impatient.gateway.router.replica_views)
                return any(not v.stale and (v.waiting or 0) >= 1 for v in views)

            await wait_until(sees_a_full_replica, what="the second gateway seeing a full queue")
            async with openai.AsyncOpenAI(
                base_url=impatient.url, api_key=impatient_key, max_retries=0
            ) as client:
                with pytest.raises(openai.RateLimitError) as raised:
                    await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": SHORT_PROMPT}]
                    )
    finally:
        await waiting.hang_up()
        await running.hang_up()
    error = raised.value
    assert error.status_code == 429
    assert isinstance(error.body, dict)
    assert error.body["code"] == "engine_overloaded"
    assert int(error.response.headers["retry-after"]) >= 1
    assert "x-should-retry" not in error.response.headers

    async def both_aborted() -> bool:
        return (await counts(sim)).aborted == idle.aborted + 2

    await wait_until(both_aborted, what="the simulator aborting both held requests")


async def test_a_client_that_reads_nothing_of_its_stream_is_dropped_and_frees_its_replica(
    sim: SimulatorProcess,
) -> None:
    """A client that stops taking in its stream would otherwise hold its replica's slot
    for as long as it keeps the connection open: after the send timeout it is dropped, its
    request aborted in the engine, and the gateway's in-flight count falls back to zero."""
    key, record = new_key()
    fast = f"fast-{uuid.uuid4().hex[:8]}"
    fastest = ("--decode-base-ms", "0", "--decode-per-seq-ms", "0")
    with start_simulator("--model", fast, *fastest, port=free_port()) as engine:
        engine.wait_healthy()
        route = Route(replica_id=f"{fast}-1", model=fast, url=engine.base_url)
        limits = ListenerLimits(send_timeout_s=0.5)
        with GatewayThread(StaticSource(snapshot_of([route], [record])), limits=limits) as gw:
            # Megabytes of events, within the engine's cache.
            body = chat_body(SHORT_PROMPT, stream=True, max_tokens=30_000, model=fast)
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_connect(sock, ("127.0.0.1", gw.gateway.port))
            await loop.sock_sendall(sock, chat_request(key, body))
            await wait_until(lambda: gw.in_flight().get(f"{fast}-1") == 1, what="in flight")

            await wait_until(
                lambda: gw.in_flight().get(f"{fast}-1") == 0,
                within_s=20,
                what="the stalled client's request ended",
            )
            sock.close()
