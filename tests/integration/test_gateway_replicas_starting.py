"""A model whose replicas are still starting, through a real ``llmgw-server gateway`` process
reading PostgreSQL.

Given a model just declared with two replicas, the log showing one placed and one whose
engine is starting (loading its weights) and none serving: a request for it is answered
503 at once, saying that 2 of its replicas are starting, with its own code and
``Retry-After``, and its request line is at info with a note saying so (a deploy going
fine is no fault). A declared model with no replica at all is answered and logged as
before: 503 ``no_serving_replica`` without ``Retry-After``, at error.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.services.operations import Caller, Operations
from app.store.postgres import PostgresEventStore
from tests.support.gateway_process import gateway_process
from tests.support.ports import free_port
from tests.support.routing import connect_node, declare_model, start_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

STARTED_WITHIN_S = 20.0
LOGGED_WITHIN_S = 5.0


def request_lines(log: Path, model: str) -> list[dict[str, Any]]:
    """The gateway's request lines for ``model`` so far (its log is one JSON object a line)."""
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("event") == "gateway_request" and entry.get("model") == model:
            lines.append(entry)
    return lines


async def test_a_model_whose_replicas_are_starting_is_told_so_and_logged_at_info(
    pg_store: PostgresEventStore, database_url: str, tmp_path: Path
) -> None:
    loading, idle = f"loading-{secrets.token_hex(3)}", f"idle-{secrets.token_hex(3)}"
    node = f"gpu-{secrets.token_hex(3)}"
    await connect_node(pg_store, node, "127.0.0.1")
    await declare_model(pg_store, loading, replicas=2)
    await declare_model(pg_store, idle)
    await start_replica(pg_store, loading, 1, node, 21001, shard_started=False)
    await start_replica(pg_store, loading, 2, node, 21002)
    created = await Operations(pg_store).create_key(
        Caller(actor="alice"), f"ci-{loading}", [loading, idle]
    )
    log = tmp_path / "gateway.log"
    port = free_port()

    with gateway_process(database_url, gateway_id=f"gw-{secrets.token_hex(4)}", port=port, log=log):
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers={"authorization": f"Bearer {created.key}"},
            timeout=30.0,
        ) as http:

            async def ready() -> bool:
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_until(ready, within_s=STARTED_WITHIN_S, what="the gateway ready")
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            starting = await http.post("/v1/chat/completions", json={"model": loading, **body})
            nothing = await http.post("/v1/chat/completions", json={"model": idle, **body})

            await wait_until(
                lambda: bool(request_lines(log, loading) and request_lines(log, idle)),
                within_s=LOGGED_WITHIN_S,
                what="both request lines logged",
            )

    assert starting.status_code == 503, starting.text
    assert starting.headers["retry-after"] == "5"
    assert starting.json()["error"] == {
        "message": (
            f"The model `{loading}` has no serving replica yet: 2 of its replicas are "
            "starting; retry in a few seconds."
        ),
        "type": "server_error",
        "param": None,
        "code": "replicas_starting",
    }
    [line] = request_lines(log, loading)
    assert (line["level"], line["status"]) == ("info", 503)
    assert line["note"] == "the model's replicas are starting: 2 not serving yet"

    assert nothing.status_code == 503, nothing.text
    assert "retry-after" not in nothing.headers
    assert nothing.json()["error"]["code"] == "no_serving_replica"
    [line] = request_lines(log, idle)
    assert (line["level"], line["status"]) == ("error", 503)
