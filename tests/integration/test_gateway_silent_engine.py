"""A silent engine behind a real gateway: one that takes the request and never answers, and
one that goes quiet in the middle of a stream.

The engines write exactly the bytes each story needs (``tests.support.bad_engine``); the
gateway is real (its own loop, server and engine client), with bounds of half a second.
The client gets 504 in OpenAI's shape for an answer that never came, or the error event
that ends a broken stream; the engine's connection is closed, the replica's slot is free
again, and the bound is counted on ``/metrics`` and logged with the replica; an answer
that never came is the replica's failure, toward its ejection.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import httpx
import pytest
from structlog.testing import capture_logs

from app.gateway.ejection import EjectionPolicy
from app.gateway.engine_bounds import EngineTimeouts
from app.gateway.server import StaticSource
from app.gateway.table import Route
from tests.support.bad_engine import BadEngine
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.waiting import wait_until_blocking

pytestmark = pytest.mark.timeout(60)

MODEL = "silent-engine-model"
BOUND_S = 0.5
TIMEOUTS = EngineTimeouts(head_s=BOUND_S, idle_s=BOUND_S)


def chat(*, stream: bool = False) -> bytes:
    fields: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({**fields, "stream": stream}).encode()


def silent(request: bytes) -> Iterable[bytes]:
    return []


def stream_head_then_silent(request: bytes) -> Iterable[bytes]:
    """A wedged engine: it answers a stream's head at once, as engines do before they
    generate anything, and then nothing."""
    yield b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    yield b"transfer-encoding: chunked\r\n\r\n"


def one_event_then_silent(request: bytes) -> Iterable[bytes]:
    event = b"data: {}\n\n"
    yield b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    yield b"transfer-encoding: chunked\r\n\r\n"
    yield b"%x\r\n%s\r\n" % (len(event), event)


def ask(gateway: GatewayThread, key: str, *, stream: bool = False) -> httpx.Response:
    """One chat completion through the gateway, as a client with ``key``."""
    return httpx.post(
        f"{gateway.url}/chat/completions",
        content=chat(stream=stream),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        timeout=15,
    )


def ejected(gateway: GatewayThread) -> list[str]:
    """The replicas the gateway keeps out of its rotation now."""
    return [replica.replica_id for replica in gateway.call(gateway.gateway.router.ejector.ejected)]


def timeouts_counted(gateway: GatewayThread, bound: str) -> float:
    page = httpx.get(gateway.metrics_url).text
    line = f'llmgw_gateway_engine_timeouts_total{{bound="{bound}"}} '
    return next(
        (float(row.removeprefix(line)) for row in page.splitlines() if row.startswith(line)), 0
    )


def test_an_engine_that_never_answers_is_a_504_not_retried_and_its_slot_is_freed() -> None:
    # Before the bound the request waited for as long as the client did (the `openai` SDK:
    # 600 s), holding the replica's slot, and the replica was never counted as failing.
    key, record = new_key()
    with BadEngine(silent) as first, BadEngine(silent) as second:
        routes = [
            Route(replica_id="silent-1", model=MODEL, url=first.url),
            Route(replica_id="silent-2", model=MODEL, url=second.url),
        ]
        source = StaticSource(snapshot_of(routes, [record]))
        with (
            GatewayThread(
                source,
                metrics_port=0,
                engine_timeouts=TIMEOUTS,
                ejection=EjectionPolicy(consecutive_failures=1),
            ) as gateway,
            capture_logs() as logs,
        ):
            answer = ask(gateway, key)

            assert answer.status_code == 504, answer.text
            error = answer.json()["error"]
            assert (error["type"], error["code"]) == ("server_error", "upstream_timeout")
            assert f"did not answer within {BOUND_S:g} s" in error["message"]
            # Not sent again: the engine that had it may have worked on it.
            assert len(first.posts) + len(second.posts) == 1
            engine = first if first.posts else second
            engine.wait_closed_after_post()
            wait_until_blocking(
                lambda: not any(gateway.in_flight().values()), what="the replica's slot freed"
            )
            assert timeouts_counted(gateway, "head") == 1
            # A failure of the replica, as a refused connection is: ejected at the first here.
            assert ejected(gateway) == ["silent-1" if engine is first else "silent-2"]
        timed_out = [line for line in logs if line["event"] == "engine_timed_out"]
        assert [(line["replica_id"], line["bound"]) for line in timed_out] == [
            ("silent-1" if engine is first else "silent-2", "head")
        ]


def test_a_stream_that_goes_silent_ends_with_an_error_event_and_frees_its_slot() -> None:
    key, record = new_key()
    with BadEngine(one_event_then_silent) as engine:
        route = Route(replica_id="quiet-1", model=MODEL, url=engine.url)
        source = StaticSource(snapshot_of([route], [record]))
        with (
            GatewayThread(source, metrics_port=0, engine_timeouts=TIMEOUTS) as gateway,
            capture_logs() as logs,
        ):
            answer = ask(gateway, key, stream=True)

            assert answer.status_code == 200
            events = [line for line in answer.text.split("\n\n") if line]
            assert events[0] == "data: {}"
            assert events[-1] == "data: [DONE]"
            error = json.loads(events[-2].removeprefix("data: "))["error"]
            assert error["code"] == "upstream_disconnected"
            assert f"sent nothing for {BOUND_S:g} s" in error["message"]
            engine.wait_closed_after_post()
            wait_until_blocking(
                lambda: not any(gateway.in_flight().values()), what="the replica's slot freed"
            )
            assert timeouts_counted(gateway, "idle") == 1
        timed_out = [line for line in logs if line["event"] == "engine_timed_out"]
        assert [(line["replica_id"], line["bound"], line["timeout_s"]) for line in timed_out] == [
            ("quiet-1", "idle", BOUND_S)
        ]


def test_a_stream_whose_head_came_but_nothing_after_is_the_replicas_failure() -> None:
    # Before, the head alone counted as the replica's success: a wedged engine that answers
    # every stream's head and then nothing was never ejected, and kept drawing its share of
    # streams, each cut off only at the bound.
    key, record = new_key()
    with BadEngine(stream_head_then_silent) as first, BadEngine(stream_head_then_silent) as second:
        routes = [
            Route(replica_id="wedged-1", model=MODEL, url=first.url),
            Route(replica_id="wedged-2", model=MODEL, url=second.url),
        ]
        source = StaticSource(snapshot_of(routes, [record]))
        with GatewayThread(
            source,
            metrics_port=0,
            engine_timeouts=TIMEOUTS,
            ejection=EjectionPolicy(consecutive_failures=1),
        ) as gateway:
            answer = ask(gateway, key, stream=True)

            assert answer.status_code == 200
            events = [line for line in answer.text.split("\n\n") if line]
            assert events[-1] == "data: [DONE]"
            assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == (
                "upstream_disconnected"
            )
            assert len(first.posts) + len(second.posts) == 1
            engine = first if first.posts else second
            assert ejected(gateway) == ["wedged-1" if engine is first else "wedged-2"]


def test_a_stream_that_goes_silent_after_its_first_piece_is_the_replicas_failure() -> None:
    # Before, its first piece counted as the replica's success and the silence after it as
    # nothing: an engine that hangs mid-generation (a stuck GPU collective) stalled every
    # stream it held and stayed in rotation, until new streams had each waited out the far
    # longer head bound.
    key, record = new_key()
    with BadEngine(one_event_then_silent) as first, BadEngine(one_event_then_silent) as second:
        routes = [
            Route(replica_id="hung-1", model=MODEL, url=first.url),
            Route(replica_id="hung-2", model=MODEL, url=second.url),
        ]
        source = StaticSource(snapshot_of(routes, [record]))
        with GatewayThread(
            source,
            metrics_port=0,
            engine_timeouts=TIMEOUTS,
            ejection=EjectionPolicy(consecutive_failures=1),
        ) as gateway:
            answer = ask(gateway, key, stream=True)

            events = [line for line in answer.text.split("\n\n") if line]
            assert (events[0], events[-1]) == ("data: {}", "data: [DONE]")
            assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == (
                "upstream_disconnected"
            )
            engine = first if first.posts else second
            assert ejected(gateway) == ["hung-1" if engine is first else "hung-2"]
