"""A gateway closes its connections to an engine at the snapshot that stops routing to it,
and keeps those to an engine still routed, whichever models the snapshot changed: a
real gateway (its own loop, server and engine client) and two engines on loopback."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest

from app.gateway.server import StaticSource
from app.gateway.table import GatewaySnapshot, Route
from tests.support.bad_engine import BadEngine, json_answer
from tests.support.gateway import GatewayThread, new_key

pytestmark = pytest.mark.timeout(60)

ANSWER = json_answer(
    b'{"id": "c-1", "object": "chat.completion", "choices": [{"index": 0, "message": '
    b'{"role": "assistant", "content": "hi"}, "finish_reason": "stop"}], '
    b'"usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}'
)


def ask(gateway: GatewayThread, key: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(
        f"{gateway.url}/chat/completions",
        content=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        timeout=15,
    )


def test_an_engine_no_longer_routed_is_let_go_and_one_still_routed_is_kept() -> None:
    key, record = new_key()
    with BadEngine(lambda _: [ANSWER]) as leaving, BadEngine(lambda _: [ANSWER]) as staying:
        left = (Route(replica_id="left-1", model="left", url=leaving.url),)
        kept = (Route(replica_id="kept-1", model="kept", url=staying.url),)
        snapshot = GatewaySnapshot(
            declared=frozenset({"left", "kept"}),
            routes={"left": left, "kept": kept},
            keys={record.prefix: record},
        )
        with GatewayThread(StaticSource(snapshot), metrics_port=0) as gateway:
            assert ask(gateway, key, "left").status_code == 200
            assert ask(gateway, key, "kept").status_code == 200
            gateway.publish(snapshot)  # the pools are older than the last snapshot taken in

            # The model "kept" keeps its tuple, as a read that did not touch it keeps it;
            # then a new tuple for it, to the same engine.
            gateway.publish(msgspec.structs.replace(snapshot, routes={"kept": kept}))
            moved = (Route(replica_id="kept-2", model="kept", url=staying.url),)
            gateway.publish(msgspec.structs.replace(snapshot, routes={"kept": moved}))

            leaving.wait_closed_after_post()
            assert ask(gateway, key, "kept").status_code == 200
            assert staying.closed_after_post == 0
            assert len(staying.posts) == 2
