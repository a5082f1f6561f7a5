"""Passive health on real sockets: a gateway (in a thread) in front of simulator engines.

A replica whose engine is gone is ejected after three refused connections, its probes
fail while the engine stays away (each ejecting it again, for longer), and the first probe
after the engine is back returns it to rotation; the clients see 200s throughout (each
failed attempt was retried on the other replica). An engine answering 503 is ejected
likewise; a client's own bad requests (4xx) eject nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from structlog.testing import capture_logs

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.gateway.ejection import EjectedReplica, EjectionPolicy
from app.gateway.server import StaticSource
from app.gateway.table import Route
from tests.support.bad_engine import BadEngine, sse_answer
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

MODEL = "probe"
POLICY = EjectionPolicy(consecutive_failures=3, base_cool_off_s=0.3, max_cool_off_s=0.6)


def engine(*flags: str, port: int | None = None) -> SimulatorProcess:
    simulator = start_simulator("--model", MODEL, "--instant", *flags, port=port)
    if "--never-ready" not in flags:
        simulator.wait_healthy()
    return simulator


def route(replica_id: str, simulator: SimulatorProcess) -> Route:
    return Route(replica_id=replica_id, model=MODEL, url=simulator.base_url)


@pytest.fixture
def healthy() -> Iterator[SimulatorProcess]:
    with engine() as simulator:
        yield simulator


def chat(http: httpx.Client, **extra: object) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return http.post("/chat/completions", json={**body, **extra}).status_code


def ejected(gateway: GatewayThread) -> list[EjectedReplica]:
    return gateway.call(gateway.gateway.router.ejector.ejected)


async def test_a_dead_replica_is_ejected_probed_and_returned_once_its_engine_is_back(
    healthy: SimulatorProcess,
) -> None:
    port = free_port()
    flaky = engine(port=port)
    key, record = new_key()
    source = StaticSource(snapshot_of([route("a", flaky), route("b", healthy)], [record]))
    with (
        capture_logs() as logs,
        GatewayThread(source, ejection=POLICY) as gateway,
        httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {key}"}) as http,
    ):
        assert [chat(http) for _ in range(4)] == [200] * 4
        flaky.stop()

        def out_for(ejections: int) -> bool:
            assert chat(http) == 200  # every attempt at a is retried on b
            return [(e.replica_id, e.ejections) for e in ejected(gateway)] == [("a", ejections)]

        await wait_until(lambda: out_for(1), within_s=20.0, what="the first ejection")
        await wait_until(
            lambda: out_for(2), within_s=20.0, what="a failed probe, and a longer cool-off"
        )
        with engine(port=port):

            def returned() -> bool:
                assert chat(http) == 200
                return ejected(gateway) == []

            await wait_until(returned, within_s=20.0, what="the probe that returns it")
            assert gateway.in_flight() == {"a": 0, "b": 0}
    events = [e for e in logs if e["event"] in {"replica_ejected", "replica_returned"}]
    assert [e["event"] for e in events][:2] == ["replica_ejected", "replica_ejected"]
    assert events[-1]["event"] == "replica_returned"
    first, second = events[0], events[1]
    assert (first["failures"], first["cool_off_s"], first["reason"]) == (3, 0.3, "unreachable")
    assert (second["failures"], second["cool_off_s"]) == (1, 0.6)


async def test_5xx_answers_eject_and_a_clients_4xx_do_not(healthy: SimulatorProcess) -> None:
    key, record = new_key()
    with engine() as other, engine("--never-ready") as unready:
        source = StaticSource(snapshot_of([route("a", other), route("b", healthy)], [record]))
        with (
            GatewayThread(source, ejection=POLICY) as gateway,
            httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {key}"}) as http,
        ):
            for _ in range(20):  # the engines refuse these with 400: the client's doing
                assert chat(http, max_tokens=-1) == 400
            assert ejected(gateway) == []

            gateway.publish(snapshot_of([route("unready", unready), route("b", healthy)], [record]))

            def unready_is_out() -> bool:
                assert chat(http) == 200  # its 503 is retried on b
                return [e.replica_id for e in ejected(gateway)] == ["unready"]

            await wait_until(unready_is_out, within_s=20.0, what="the 503s' ejection")


FAILING_STREAM_EVENT = (
    b'{"error": {"object": "error", "message": "EngineCore encountered an issue.",'
    b' "type": "InternalServerError", "param": null, "code": 500}}'
)
"""vLLM's error event for an engine that failed mid-stream (``create_streaming_error_
response`` with status 500), after its 200 head."""
FIRST_CHUNK = (
    b'{"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0,'
    b' "delta": {"content": "a"}, "finish_reason": null}]}'
)
REFUSING_STREAM_EVENT = (
    b'{"error": {"object": "error", "message": "This model\'s maximum context length is 64'
    b' tokens.", "type": "BadRequestError", "param": null, "code": 400}}'
)


async def test_streams_answered_with_5xx_error_events_eject_and_count_as_errors(
    healthy: SimulatorProcess,
) -> None:
    """An engine that answers every stream 200 and then a 5xx error event is as unhealthy
    as one answering 500s: before, each such stream counted as answered, and the replica
    stayed in rotation with no error in its figures. A 4xx error event is the client's
    doing, as a 4xx answer is."""
    key, record = new_key()
    stream = {"stream": True}
    with (
        BadEngine(lambda request: [sse_answer(FAILING_STREAM_EVENT)]) as failing,
        BadEngine(lambda request: [sse_answer(REFUSING_STREAM_EVENT)]) as refusing,
    ):
        routes = [
            Route(replica_id="failing", model=MODEL, url=failing.url),
            Route(replica_id="refusing", model=MODEL, url=refusing.url),
            route("b", healthy),
        ]
        source = StaticSource(snapshot_of(routes, [record]))
        with (
            GatewayThread(source, ejection=POLICY) as gateway,
            httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {key}"}) as http,
        ):

            def failing_is_out() -> bool:
                assert chat(http, **stream) == 200  # the head went out before the event
                return [e.replica_id for e in ejected(gateway)] == ["failing"]

            await wait_until(failing_is_out, within_s=20.0, what="the 5xx events' ejection")
            while len(refusing.posts) < POLICY.consecutive_failures:
                assert chat(http, **stream) == 200
            report = gateway.call(gateway.gateway.traffic_report).replicas

    assert report["failing"].errors == report["failing"].requests >= 3
    assert report["refusing"].errors == 0 < report["refusing"].requests


async def test_a_stream_ended_by_an_error_event_gives_no_latency(
    healthy: SimulatorProcess,
) -> None:
    """A stream the engine ended with a 4xx error event is a request answered, as a 4xx
    answer is, and like it no 2xx answer to time: before, its latency and TPOT were
    sampled as if it had been served."""
    key, record = new_key()
    with BadEngine(
        lambda request: [sse_answer(FIRST_CHUNK, FIRST_CHUNK, REFUSING_STREAM_EVENT)]
    ) as refusing:
        source = StaticSource(
            snapshot_of([Route(replica_id="refusing", model=MODEL, url=refusing.url)], [record])
        )
        with (
            GatewayThread(source, ejection=POLICY) as gateway,
            httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {key}"}) as http,
        ):
            assert [chat(http, stream=True) for _ in range(3)] == [200] * 3
            report = gateway.call(gateway.gateway.traffic_report).replicas

    assert (report["refusing"].requests, report["refusing"].errors) == (3, 0)
    assert report["refusing"].latency == {}
    assert report["refusing"].tpot == {}
