"""Admission against real engines: two simulator processes, one batch slot each, so every
further request waits in the engine's own queue; the router scrapes their metrics and
real requests fill those queues. Replicas have target_waiting 2."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
import pytest_asyncio
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.gateway.lease import Lease
from app.gateway.route_refusals import Saturated
from app.gateway.router import Router
from app.gateway.signals import EngineReading, read_engine_signals
from app.gateway.table import GatewaySnapshot, Route
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

MODEL = "sim-model"
ONE_SLOT = (
    "--max-num-seqs", "1", "--decode-base-ms", "50", "--decode-per-seq-ms", "0",
    "--prefill-ms-per-token", "0",
)  # fmt: skip
LONG = 1000
"""Tokens: at 50 ms a token, a request holds its slot far longer than any test."""


@pytest.fixture(scope="module")
def simulators() -> Iterator[tuple[SimulatorProcess, SimulatorProcess]]:
    with (
        start_simulator(*ONE_SLOT, port=free_port()) as a,
        start_simulator(*ONE_SLOT, port=free_port()) as b,
    ):
        a.wait_healthy()
        b.wait_healthy()
        yield a, b


class Engines:
    """The two simulators, the requests a test keeps open on them, and a router."""

    def __init__(
        self, sims: tuple[SimulatorProcess, SimulatorProcess], session: aiohttp.ClientSession
    ) -> None:
        self.a, self.b = sims
        self.session = session
        self.requests: list[asyncio.Task[None]] = []
        self.router: Router | None = None

    def route(self, sim: SimulatorProcess, **settings: object) -> Route:
        replica_id = "a" if sim is self.a else "b"
        return Route(replica_id=replica_id, model=MODEL, url=sim.base_url, **settings)  # type: ignore[arg-type]

    async def start_router(self, *routes: Route, queue_timeout_s: float = 1.0) -> Router:
        router = Router(queue_timeout_s=queue_timeout_s)
        router.update(GatewaySnapshot(declared=frozenset({MODEL}), routes={MODEL: routes}))
        await router.start(self.session)
        self.router = router
        await wait_until(lambda: router.stale_replicas() == 0, what="first scrapes")
        return router

    def send(self, url: str, max_tokens: int = LONG, lease: Lease | None = None) -> None:
        """Keep a completion request open on the engine at ``url`` until the test ends."""

        async def request() -> None:
            body = {"model": MODEL, "prompt": uuid.uuid4().hex, "max_tokens": max_tokens}
            try:
                async with self.session.post(f"{url}/v1/completions", json=body) as resp:
                    await resp.read()
                    if lease is not None:
                        lease.first_byte()
            finally:
                if lease is not None:
                    lease.release()

        self.requests.append(asyncio.create_task(request()))

    async def reading(self, sim: SimulatorProcess) -> EngineReading:
        async with self.session.get(f"{sim.base_url}/metrics") as resp:
            reading = read_engine_signals(await resp.text())
        assert reading is not None
        return reading

    async def shows(self, sim: SimulatorProcess, *, running: int, waiting: int) -> None:
        async def check() -> bool:
            reading = await self.reading(sim)
            return (reading.running, reading.waiting) == (running, waiting)

        await wait_until(
            check, what=f"engine at {sim.base_url}: {running} running, {waiting} waiting"
        )

    def router_sees(self, replica_id: str, *, waiting: int) -> bool:
        assert self.router is not None
        view = next(v for v in self.router.replica_views() if v.replica_id == replica_id)
        return view.waiting == waiting and not view.stale

    async def finish(self) -> None:
        for task in self.requests:
            task.cancel()
        for task in self.requests:
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await task
        if self.router is not None:
            await self.router.close()
        # The engines abort what their clients abandoned; the next test starts from idle.
        await self.shows(self.a, running=0, waiting=0)
        await self.shows(self.b, running=0, waiting=0)


@pytest_asyncio.fixture
async def engines(
    simulators: tuple[SimulatorProcess, SimulatorProcess],
) -> AsyncIterator[Engines]:
    async with aiohttp.ClientSession() as session:
        engines = Engines(simulators, session)
        try:
            yield engines
        finally:
            await engines.finish()


def key() -> str:
    return f"key-{uuid.uuid4().hex[:8]}"


async def test_a_burst_is_spread_and_then_both_saturated_replicas_make_it_wait(
    engines: Engines,
) -> None:
    with capture_logs(processors=[merge_contextvars]) as logs:
        router = await engines.start_router(
            engines.route(engines.a, target_waiting=2), engines.route(engines.b, target_waiting=2)
        )
    found = [e for e in logs if e["event"] == "engine_metrics_found"]
    assert sorted(e["replica_id"] for e in found) == ["a", "b"]
    assert found[0]["names"] == [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    ]

    placed: list[str] = []

    async def client() -> None:
        lease = await router.acquire(MODEL, key())
        placed.append(lease.route.replica_id)
        engines.send(lease.route.url, lease=lease)

    # Six at once, before any scrape can show them: reservations spread them 2 and 2, the
    # last two wait until scrapes show one running and one waiting on each engine.
    clients = [asyncio.create_task(client()) for _ in range(6)]
    await wait_until(
        lambda: len(placed) == 4 and router.queued() == {MODEL: 2}, what="four sent, two queued"
    )
    assert Counter(placed) == {"a": 2, "b": 2}
    await asyncio.gather(*clients)
    assert Counter(placed) == {"a": 3, "b": 3}
    await engines.shows(engines.a, running=1, waiting=2)
    await engines.shows(engines.b, running=1, waiting=2)

    # Both at target_waiting: the next request waits for the queue timeout, then 429.
    started = time.monotonic()
    waiting = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the request queued")
    with pytest.raises(Saturated) as raised:
        await waiting
    assert time.monotonic() - started >= 1.0
    assert raised.value.retry_after_s >= 1.0
    assert router.in_flight() == {"a": 3, "b": 3}


async def test_a_saturated_replica_gets_nothing_new(engines: Engines) -> None:
    for _ in range(3):
        engines.send(engines.a.base_url)  # straight to the engine, past the router
    await engines.shows(engines.a, running=1, waiting=2)
    router = await engines.start_router(
        engines.route(engines.a, target_waiting=2), engines.route(engines.b, target_waiting=2)
    )
    await wait_until(lambda: engines.router_sees("a", waiting=2), what="a seen saturated")

    placed: list[str] = []
    for _ in range(3):
        lease = await router.acquire(MODEL, key())
        placed.append(lease.route.replica_id)
        engines.send(lease.route.url, lease=lease)
    assert placed == ["b", "b", "b"]
    await engines.shows(engines.b, running=1, waiting=2)
    assert (await engines.reading(engines.a)).waiting == 2


async def test_a_replica_at_its_kv_ceiling_gets_nothing_new(engines: Engines) -> None:
    # One request for 20,000 tokens holds 1,250 of the 2,048 KV blocks: 61 %.
    engines.send(engines.a.base_url, max_tokens=20_000)
    await engines.shows(engines.a, running=1, waiting=0)
    router = await engines.start_router(
        engines.route(engines.a, kv_ceiling=0.5), engines.route(engines.b, kv_ceiling=0.5)
    )
    views = {v.replica_id: v for v in router.replica_views()}
    assert views["a"].kv_usage is not None
    assert views["a"].kv_usage > 0.5
    for _ in range(3):
        lease = await router.acquire(MODEL, key())
        assert lease.route.replica_id == "b"
        lease.release()


async def test_a_replica_whose_metrics_stop_answering_is_routed_by_in_flight_alone(
    engines: Engines,
) -> None:
    for _ in range(3):
        engines.send(engines.a.base_url)
    await engines.shows(engines.a, running=1, waiting=2)
    router = await engines.start_router(
        engines.route(engines.a, target_waiting=2),
        engines.route(engines.b, target_waiting=2),
        queue_timeout_s=10.0,
    )
    await wait_until(lambda: engines.router_sees("a", waiting=2), what="a seen saturated")
    only_a = frozenset({"b"})
    waiting = asyncio.create_task(router.acquire(MODEL, key(), only_a))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the request queued")

    engines.a.process.send_signal(signal.SIGSTOP)  # hung: scrapes time out
    try:
        lease = await asyncio.wait_for(waiting, timeout=8.0)
        assert lease.route.replica_id == "a"
        assert router.stale_replicas() == 1
        assert next(v for v in router.replica_views() if v.replica_id == "a").stale
        lease.release()
    finally:
        engines.a.process.send_signal(signal.SIGCONT)
    await wait_until(lambda: engines.router_sees("a", waiting=2), what="a fresh and saturated")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(router.acquire(MODEL, key(), only_a), timeout=0.5)
    assert router.queued() == {}


class FrozenClock:
    """The router's clock, moved only by the test: a scrape's reading is as old as the
    test says, whenever it really came."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_scrape_answering_within_its_timeout_never_leaves_its_replica_stale(
    engines: Engines,
) -> None:
    # A busy engine's /metrics can take most of the scrape timeout to answer: the next
    # reading comes up to an interval and a timeout after the last one, and until then the
    # last one stands, instead of the replica flipping to the in-flight rule every scrape.
    clock = FrozenClock()
    router = Router(scrape_interval_s=0.25, scrape_timeout_s=1.0, clock=clock)
    router.update(
        GatewaySnapshot(declared=frozenset({MODEL}), routes={MODEL: (engines.route(engines.a),)})
    )
    await router.start(engines.session)
    engines.router = router
    await wait_until(lambda: router.stale_replicas() == 0, what="first scrape")

    clock.now += 0.25 + 0.9  # the next scrape, sent an interval later, still within its timeout
    assert router.stale_replicas() == 0
    clock.now += 0.2  # it timed out: no reading since the last one
    assert router.stale_replicas() == 1


def scraper_running(replica_id: str) -> bool:
    return any(task.get_name() == f"scrape {replica_id}" for task in asyncio.all_tasks())


async def test_route_updates_start_and_stop_scrapers_and_keep_counts(engines: Engines) -> None:
    route_a, route_b = engines.route(engines.a), engines.route(engines.b)
    router = await engines.start_router(route_a)
    lease = await router.acquire(MODEL, key())
    assert not scraper_running("b")

    router.update(GatewaySnapshot(declared=frozenset({MODEL}), routes={MODEL: (route_a, route_b)}))
    await wait_until(lambda: router.stale_replicas() == 0, what="b scraped")
    assert scraper_running("b")
    assert router.in_flight() == {"a": 1, "b": 0}

    router.update(GatewaySnapshot(declared=frozenset({MODEL}), routes={MODEL: (route_b,)}))
    await wait_until(lambda: not scraper_running("a"), what="a's scraper stopped")
    assert [v.replica_id for v in router.replica_views()] == ["b"]
    assert router.in_flight() == {"a": 1, "b": 0}
    lease.release()
    assert router.in_flight() == {"a": 0, "b": 0}
