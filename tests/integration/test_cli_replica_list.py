"""`llmgw-cli replicas` against a live admin API over a fleet whose history outgrew the
fold: the replicas that exist by default, saying on stderr that ended ones are not shown
where the filters match some; every replica with --all, the forgotten ones too; an ended
--phase lists those."""

from __future__ import annotations

import pytest

from app.domain.state import ENDED_KEPT_PER_MODEL
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import seed_node
from tests.support.operator_cli import Operator
from tests.support.replica_history import declared, ended, record_at_once, serving

pytestmark = pytest.mark.timeout(120)

K = ENDED_KEPT_PER_MODEL
LAST = K + 4
"""llama-1 and llama-LAST serve; the K + 2 between them ended, 2 more than the fold keeps."""


def listed(table: str) -> list[str]:
    """The replica ids of a table's body rows."""
    ids = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0] and cells[0] != "replica":
            ids.append(cells[0])
    return ids


async def test_replicas_lists_those_that_exist_unless_all_or_an_ended_phase_is_asked(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    await seed_node(pg_store, "gpu-1")
    events = [declared("llama"), *serving("llama", 1, "gpu-1")]
    for number in range(2, LAST):
        events += ended("llama", number, "gpu-1")
    await record_at_once(pg_store, [*events, *serving("llama", LAST, "gpu-1")])
    assert "llama-2" not in pg_store.state.replicas, "forgotten by the fold"

    default = await operator.run("replicas")
    every = await operator.run("replicas", "--all", "--output", "json")
    stopped = await operator.run("replicas", "--phase", "stopped")
    existing = await operator.run("replicas", "--model", "llama", "--output", "json")

    assert default.code == 0, default.stderr
    assert listed(default.stdout) == ["llama-1", f"llama-{LAST}"]
    assert default.stderr == "(ended replicas not shown: --all lists them too)\n"
    assert [r["id"] for r in every.json()] == [f"llama-{n}" for n in range(1, LAST + 1)]
    assert every.stderr == ""
    assert stopped.code == 0, stopped.stderr
    assert listed(stopped.stdout) == [f"llama-{n}" for n in range(2, LAST, 2)]
    assert stopped.stderr == ""
    assert [r["id"] for r in existing.json()] == ["llama-1", f"llama-{LAST}"]


async def test_replicas_says_ended_ones_are_not_shown_only_where_some_were_left_out(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    # llama ended a replica on gpu-2, the one qwen serves on; qwen never ended one.
    await seed_node(pg_store, "gpu-1")
    await seed_node(pg_store, "gpu-2")
    events = [declared("llama"), *serving("llama", 1, "gpu-1"), *ended("llama", 2, "gpu-2")]
    events += [declared("qwen"), *serving("qwen", 1, "gpu-2")]
    await record_at_once(pg_store, events)

    qwen = await operator.run("replicas", "--model", "qwen")
    llama = await operator.run("replicas", "--model", "llama")
    on_gpu_1 = await operator.run("replicas", "--node", "gpu-1")
    on_gpu_2 = await operator.run("replicas", "--node", "gpu-2")

    assert (qwen.code, listed(qwen.stdout), qwen.stderr) == (0, ["qwen-1"], "")
    assert listed(llama.stdout) == ["llama-1"]
    assert llama.stderr == "(ended replicas not shown: --all lists them too)\n"
    assert (listed(on_gpu_1.stdout), on_gpu_1.stderr) == (["llama-1"], "")
    assert listed(on_gpu_2.stdout) == ["qwen-1"]
    assert on_gpu_2.stderr == "(ended replicas not shown: --all lists them too)\n"
