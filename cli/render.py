"""Output: tables for people (rich), JSON for scripts, one-line errors on stderr."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


@dataclass(frozen=True)
class Column:
    header: str
    wrap: bool = False
    """Whether long values wrap within the column; the others keep one line."""
    justify: Literal["left", "right"] = "left"


def print_table(
    columns: Sequence[Column],
    rows: Iterable[Sequence[str | None]],
    *,
    title: str | None = None,
    console: Console | None = None,
) -> None:
    """Cells are plain text: brackets in values are printed, never read as markup."""
    table = Table(title=title, title_justify="left", header_style="bold", expand=False)
    for column in columns:
        table.add_column(
            column.header,
            justify=column.justify,
            no_wrap=not column.wrap,
            overflow="fold" if column.wrap else "ellipsis",
        )
    for row in rows:
        table.add_row(*(Text(value or "") for value in row))
    (console or Console(highlight=False)).print(table)


def print_json_array(items: Iterable[msgspec.Raw]) -> None:
    """``items`` (JSON values, passed through unchanged but re-indented) as one JSON array."""
    array = b"[" + b",".join(bytes(item) for item in items) + b"]"
    sys.stdout.write(msgspec.json.format(array, indent=2).decode() + "\n")


def utc_seconds(moment: datetime) -> str:
    """``2026-03-05 16:00:00``: UTC, to the second (the column header says UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def print_error(command: str, message: str) -> None:
    print(f"llmgw-cli {command}: {message}", file=sys.stderr)
