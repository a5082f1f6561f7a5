"""The main tables at 80 columns (a common terminal, or COLUMNS=80 when piped) and at 200:
ids are never cut, columns are dropped in their stated order before anything is, and
``--output wide`` shows every column."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from cli.history import COLUMNS as HISTORY_COLUMNS
from cli.keys import COLUMNS as KEY_COLUMNS
from cli.models import MODEL_COLUMNS
from cli.nodes import DISCONNECTED_COLUMN, GPU_COLUMNS, NODE_COLUMNS
from cli.placement import CANDIDATE_COLUMNS, FAILURES_COLUMN
from cli.render import Column, print_table
from cli.replicas import REPLICA_COLUMNS

NODES = [
    ("dev-node-1", "ready", "2/2", "1", "1", "127.0.0.1", "zone=us-east-1a, gpu=h100-80gb-sxm5"),
    ("gpu-node-with-a-long-name-07", "cordoned", "8/8", "8", "0", "gpu-07.internal", ""),
]
NODES_AWAY = [
    (*NODES[0], ""),
    (
        "gpu-node-with-a-long-name-07", "lost", "8/8", "8", "0", "gpu-07.internal", "",
        "the client certificate expired; issue a new one for this node",
    ),
]  # fmt: skip
NODE_GPUS = [
    (
        "0", "GPU-84bba079-31db-9253-06a0-799dc6ebd718", "NVIDIA H100 80GB HBM3", "70000/81559",
        "yes", "llama-3-70b-0f3a", "used by replica llama-3-70b-0f3a",
    ),
    (
        "1", "GPU-5f7b8d39-bead-44fe-9f31-b6ca4e96b119", "NVIDIA H100 80GB HBM3", "0/81559",
        "no", "", "unhealthy: XID 79: GPU has fallen off the bus",
    ),
]  # fmt: skip
MODELS = [("llama-3-70b-instruct", "2 (1 old)", "2/2", "2 serving, 3 stopped", "4", "vllm", "")]
REPLICAS = [
    (
        "llama-70b-12",
        "llama-70b",
        "draining",
        "1 (current 2)",
        "gpu-07",
        "2026-12-01 09:00:00",
        "yes (ejected by 2 of 3 gateways)",
        "replaced by llama-70b-13 (drain drain-4e1c), serving since 09:01",
    )
]
CANDIDATES = [
    ("dev-node-2", "no", "0", "1", "", "cordoned: maintenance; 0 healthy free GPUs of 2"),
]
CANDIDATES_FAILED_ON = [
    ("dev-node-1", "yes", "2", "0", "GPUs 0, port 20000", "", "2"),
    ("dev-node-2", "no", "0", "1", "", "cordoned: maintenance; 0 healthy free GPUs of 2", "0"),
]
KEYS = [
    (
        "47ac7a37", "tour", "revoked", "demo", "60", "-", "2027-01-31 00:00:00",
        "2026-12-01 09:00:00", "alice", "2026-12-01 10:00:00", "bob", "k-47ac7a37-9a4e",
    )
]  # fmt: skip
HISTORY = [
    (
        "1234", "2026-12-01 09:00:00", "replica_drain_started", "reconciler",
        "replica demo-1 draining (drain drain-4e1c): node dev-node-1 drains", "drain-4e1c",
    )
]  # fmt: skip

TABLES = {
    "nodes": (NODE_COLUMNS, NODES),
    "nodes, one away": ((*NODE_COLUMNS, DISCONNECTED_COLUMN), NODES_AWAY),
    "node GPUs": (GPU_COLUMNS, NODE_GPUS),
    "models": (MODEL_COLUMNS, MODELS),
    "replicas": (REPLICA_COLUMNS, REPLICAS),
    "explain-placement": (CANDIDATE_COLUMNS, CANDIDATES),
    "explain-placement, failed here": ((*CANDIDATE_COLUMNS, FAILURES_COLUMN), CANDIDATES_FAILED_ON),
    "keys": (KEY_COLUMNS, KEYS),
    "history": (HISTORY_COLUMNS, HISTORY),
}


def left_out_of(text: str) -> list[str]:
    """The headers the footnote says were left out."""
    match = re.search(r"\(left out to fit: (.*); --output wide shows them\)", text)
    return match.group(1).split(", ") if match else []


def rendered(
    columns: tuple[Column, ...], rows: list[tuple[str, ...]], width: int, *, wide: bool = False
) -> str:
    output = io.StringIO()
    console = Console(file=output, width=width, highlight=False, color_system=None)
    print_table(columns, rows, console=console, wide=wide)
    return output.getvalue()


@pytest.mark.parametrize("table", sorted(TABLES))
@pytest.mark.parametrize("width", [80, 200])
def test_ids_are_whole_and_every_line_fits(table: str, width: int) -> None:
    columns, rows = TABLES[table]

    text = rendered(columns, rows, width)

    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    for row in rows:
        for column, value in zip(columns, row, strict=True):
            if column.key:
                assert value in text, f"{column.header} {value!r} cut:\n{text}"
    kept = [c for c in columns if c.header not in left_out_of(text)]
    assert all(word in text for c in kept for word in c.header.split()), text
    said_nothing = {c.header for i, c in enumerate(columns) if not any(r[i] for r in rows)}
    assert all(c in kept for c in columns if not c.drop and c.header not in said_nothing)
    assert "…" not in text


@pytest.mark.parametrize("table", sorted(TABLES))
def test_columns_are_left_out_in_their_stated_order_and_said_so(table: str) -> None:
    columns, rows = TABLES[table]

    narrow = rendered(columns, rows, 80)

    index = {c.header: i for i, c in enumerate(columns)}
    left_out = [c for c in columns if c.header in left_out_of(narrow)]
    empty = [c for c in left_out if not any(row[index[c.header]] for row in rows)]
    dropped = [c for c in left_out if c not in empty]
    assert all(c.drop for c in dropped), "only droppable or empty columns are left out"
    order = sorted(c.drop for c in columns if c.drop)
    assert sorted(c.drop for c in dropped) == order[: len(dropped)]


def test_a_column_empty_in_every_row_goes_before_one_that_says_something() -> None:
    models = [("demo", "1", "1/1", "1 serving, 2 stopped", "1", "llamacpp", "")]

    text = rendered(MODEL_COLUMNS, models, 80)

    assert "llamacpp" in text
    assert left_out_of(text) == ["below its count because"]


@pytest.mark.parametrize("table", sorted(TABLES))
def test_wide_shows_every_column_at_any_width(table: str) -> None:
    columns, rows = TABLES[table]

    text = rendered(columns, rows, 80, wide=True)

    assert all(c.header in text for c in columns), text
    assert "left out" not in text
    for row in rows:
        assert all(value in text for value in row if value), text


def test_at_200_columns_nothing_is_left_out() -> None:
    for columns, rows in TABLES.values():
        assert "left out" not in rendered(columns, rows, 200)


def test_ids_too_long_for_the_terminal_are_folded_never_cut() -> None:
    row = (
        "llama-3-70b-instruct-awq-int4-12", "llama-3-70b-instruct-awq-int4", "serving", "1",
        "gpu-node-with-a-long-name-07.rack-12.example", "2026-12-01 09:00:00", "yes", "",
    )  # fmt: skip

    text = rendered(REPLICA_COLUMNS, [row], 80)

    assert "…" not in text  # folded onto more lines, never cut short
    first_column = "".join(
        line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")
    )
    assert first_column == row[0]
