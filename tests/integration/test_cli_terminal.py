"""What nodes, engines and other operators wrote reaches the operator's terminal escaped.

A node names its GPUs and labels, an engine writes its log, an agent reports an error, an
admin token is named by whoever configured it: none of it may drive the terminal that
``llmgw-cli`` prints it on. Here each carries escape sequences that would set the window
title, clear the screen, move the cursor back over a line or reverse the text that
follows; every command shows them as visible escapes (``\\x1b``), and ``--output json``
keeps every value intact for scripts without a raw control character in it.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from pathlib import Path

import pytest

from app.domain.events import (
    GpuInfo,
    GpuMarkedUnhealthy,
    ModelUnplaceable,
    NodeConnected,
    NodeRegistered,
    ReplicaPlaced,
    ShardFailed,
    ShardPlacement,
)
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import record
from tests.support.operator_cli import OnTerminal, Operator
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

TITLE = "\x1b]0;owned\x07"
"""OSC 0: sets the terminal window's title."""
CLEAR = "\x1b[2J\x1b[H"
"""Clears the screen and moves the cursor home."""
C1_CSI = "\x9b31m"
"""CSI as one C1 character: red text on terminals that read 8-bit controls."""
REVERSE = "\u202e"
"""RIGHT-TO-LEFT OVERRIDE: what follows reads backwards."""
BACK = "\r"
"""Back to the start of the line, to print something else over it."""


def shown(text: str) -> str:
    """``text`` as llmgw-cli shows it: each control character as a visible escape."""
    return (
        text.replace("\x1b", "\\x1b")
        .replace("\x07", "\\x07")
        .replace("\x9b", "\\x9b")
        .replace("\u202e", "\\u202e")
        .replace("\r", "\\r")
    )


def controls(output: str) -> set[str]:
    """Every character of ``output`` a terminal would act on or not show, but newlines."""
    return {c for c in output if not c.isprintable() and c != "\n"}


def an_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


async def a_hostile_node(store: PostgresEventStore) -> tuple[str, str, str]:
    """A node whose GPU name, label and GPU health reason hold escape sequences; its id,
    the GPU's name and the reason."""
    node = an_id("gpu")
    gpu_name = f"H100{TITLE}"
    labels = {"zone": f"a{REVERSE}b"}
    inventory = (GpuInfo(index=0, uuid="GPU-0", name=gpu_name, memory_total_mib=81559),)
    await record(
        store,
        f"agent:{node}",
        NodeRegistered(node_id=node, address="127.0.0.7", gpus=inventory, labels=labels),
        NodeConnected(node_id=node, address="127.0.0.7", gpus=inventory, labels=labels),
    )
    reason = f"XID 79{CLEAR}all good"
    await record(
        store, f"agent:{node}", GpuMarkedUnhealthy(node_id=node, gpu_index=0, reason=reason)
    )
    return node, gpu_name, reason


async def test_what_a_node_reports_is_shown_escaped_in_nodes_node_and_history(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node, gpu_name, reason = await a_hostile_node(pg_store)

    listed, one, history, as_json = await asyncio.gather(
        operator.run("nodes"),
        operator.run("node", node),
        operator.run("history", "node", node),
        operator.run("node", node, "--output", "json"),
    )

    for result in (listed, one, history):
        assert result.code == 0, result.stderr
        assert controls(result.stdout) == set(), result.stdout
    assert shown(f"zone=a{REVERSE}b") in listed.stdout
    assert shown(gpu_name) in one.stdout
    assert shown(reason) in history.stdout
    assert controls(as_json.stdout) == set()
    [gpu] = as_json.json()["gpus"]
    assert gpu["name"] == gpu_name


async def test_an_engines_error_and_log_and_an_unplaceable_reason_are_shown_escaped(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node, _, _ = await a_hostile_node(pg_store)
    model = an_id("qwen")
    declared = await operator.run("models", "apply", str(await spec_file(operator, model)))
    assert declared.code == 0, declared.stderr
    replica = f"{model}-1"
    shard = ShardPlacement(index=0, node_id=node, gpus=(0,), port=20001)
    await record(
        pg_store,
        "reconciler",
        ReplicaPlaced(replica_id=replica, model=model, number=1, shards=(shard,)),
        ModelUnplaceable(model=model, reason=f"no node fits{CLEAR}"),
    )
    log_tail = (f"{CLEAR}$ ", f"loading{BACK}all fine", f"{C1_CSI}red")
    error = f"exited{TITLE}"
    await record(
        pg_store,
        f"agent:{node}",
        ShardFailed(
            replica_id=replica, shard_index=0, node_id=node, error=error, log_tail=log_tail
        ),
    )

    one, models, described = await asyncio.gather(
        operator.run("replica", replica),
        operator.run("models"),
        operator.run("model", model),
    )

    for result in (one, models, described):
        assert result.code == 0, result.stderr
        assert controls(result.stdout) == set(), result.stdout
    assert shown(error) in one.stdout
    for line in log_tail:
        assert f"  {shown(line)}\n" in one.stdout
    assert shown(f"no node fits{CLEAR}") in described.stdout


async def test_an_actor_and_a_summary_are_shown_escaped_in_events_and_events_follow(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node = an_id("gpu")
    actor = f"mallory{TITLE}"
    await record(pg_store, actor, NodeRegistered(node_id=node, address="127.0.0.7"))
    start = await pg_store.last_position() - 1

    table, page_json = await asyncio.gather(
        operator.run("events", "--since", str(start)),
        operator.run("events", "--since", str(start), "--output", "json"),
    )
    follower = await operator.start("events", "--follow", "--since", str(start))
    try:
        assert follower.stdout is not None
        line = (await asyncio.wait_for(follower.stdout.readline(), 30)).decode()
    finally:
        follower.kill()
        await follower.wait()

    assert table.code == 0, table.stderr
    assert controls(table.stdout) == set(), table.stdout
    assert shown(actor) in table.stdout
    assert controls(line.removesuffix("\n")) == set(), line
    assert shown(actor) in line
    assert controls(page_json.stdout) == set()
    assert [e["actor"] for e in page_json.json()] == [actor]


async def test_json_keeps_every_value_but_writes_c1_controls_and_bidi_overrides_as_escapes(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    # JSON escapes C0 controls (ESC is \u001b) but not C1 controls or bidi overrides,
    # which reach the terminal of an operator who reads --output json as it is.
    node = an_id("gpu")
    labels = {"zone": f"{C1_CSI}{REVERSE}"}
    await record(
        pg_store,
        f"agent:{node}",
        NodeRegistered(node_id=node, address="127.0.0.7", labels=labels),
    )

    answer = await operator.run("node", node, "--output", "json")

    assert controls(answer.stdout) == set()
    assert "\\u009b31m\\u202e" in answer.stdout
    assert answer.json()["labels"] == labels


async def spec_file(operator: Operator, model: str) -> Path:
    path = operator.home / f"{model}.yaml"
    path.write_text(f"name: {model}\ncommand: vllm serve x --port {{port}}\nreplicas: 1\n")
    return path


async def test_on_a_terminal_nothing_but_llmgw_clis_own_colours_reaches_it(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node, gpu_name, reason = await a_hostile_node(pg_store)

    watcher = OnTerminal.start(operator, "node", node)
    try:
        assert await watcher.exit_code() == 0
    finally:
        watcher.kill()
    raw = watcher.raw()

    # Colours and bold (SGR: ESC [ ... m) are llmgw-cli's own; anything else is not.
    assert re.sub(r"\x1b\[[0-9;]*m", "", raw).count("\x1b") == 0, raw
    assert "\x07" not in raw
    await wait_until(lambda: shown(gpu_name) in watcher.text(), what="the GPU's name escaped")
    assert shown(reason) in watcher.text()
