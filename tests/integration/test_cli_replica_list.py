"""`llmgw-cli replicas` against a live admin API over a fleet whose history outgrew the
fold: the replicas that exist by default, saying on stderr that ended ones are not shown;
every replica with --all, the forgotten ones too; an ended --phase lists those."""

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
