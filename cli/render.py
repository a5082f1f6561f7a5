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


WRAPPED_MIN_WIDTH = 16
"""The narrowest a wrapping column gets before columns are dropped instead."""
BORDER_PER_COLUMN = 3
"""``│ x `` around each cell, and one more ``│`` at the end of a row."""


@dataclass(frozen=True)
class Column:
    header: str
    wrap: bool = False
    """Whether long values wrap within the column; the others keep one line."""
    justify: Literal["left", "right"] = "left"
    key: bool = False
    """The row's identity (a node, a replica): shown whole, and never dropped."""
    drop: int = 0
    """0: always shown; 1, 2, ...: when the terminal is too narrow, dropped in this order
    (1 first), before anything is cut."""


def print_table(
    columns: Sequence[Column],
    rows: Iterable[Sequence[str | None]],
    *,
    title: str | None = None,
    console: Console | None = None,
    wide: bool = False,
) -> None:
    """A table that fits the terminal: columns empty in every row go first, then droppable
    columns in their stated order, then columns narrow and their values wrap, widest
    first, key columns last and never below a third of the terminal; nothing is ever cut
    short (when nothing more can give, the table is a little wider than the terminal
    instead). ``wide``: every column, each as wide as it needs. Cells are plain text:
    brackets in values are printed, never read as markup."""
    console = console or Console(highlight=False)
    cells = [[value or "" for value in row] for row in rows]
    shown = list(range(len(columns)))
    if wide:
        width = max(console.width, _natural(columns, cells, shown))
        console = Console(
            file=console.file, width=width, highlight=False, no_color=console.no_color
        )
    else:
        # A column empty in every row goes before any that says something.
        empty = [
            i
            for i, c in enumerate(columns)
            if not c.key and not c.drop and not any(row[i] for row in cells)
        ]
        droppable = empty + sorted(
            (i for i, c in enumerate(columns) if c.drop), key=lambda i: columns[i].drop
        )
        for index in droppable:
            if _needed(columns, cells, shown) <= console.width:
                break
            shown.remove(index)
    widths = _allocate(columns, cells, shown, console.width)
    total = 1 + sum(w + BORDER_PER_COLUMN for w in widths.values())
    if total > console.width:
        # Nothing left to drop or fold: a table a little wider than the terminal, never a
        # column cropped off its right edge.
        console = Console(
            file=console.file, width=total, highlight=False, no_color=console.no_color
        )
    table = Table(title=title, title_justify="left", header_style="bold", expand=False)
    for index in shown:
        column = columns[index]
        table.add_column(
            column.header,
            justify=column.justify,
            overflow="fold",
            width=widths[index],
        )
    for row in cells:
        table.add_row(*(Text(row[index]) for index in shown))
    console.print(table)
    left_out = [columns[i].header for i in range(len(columns)) if i not in shown]
    if left_out:
        console.print(
            f"(left out to fit: {', '.join(left_out)}; --output wide shows them)", soft_wrap=True
        )


def _allocate(
    columns: Sequence[Column], cells: Sequence[Sequence[str]], shown: Sequence[int], width: int
) -> dict[int, int]:
    """Each shown column's width: its natural one, narrowed, widest first, while the table is
    wider than ``width``: other columns down to their narrowest readable, then key columns
    down to a third of the terminal."""
    widths = {i: _natural_width(columns[i], cells, i) for i in shown}
    floors = {i: _narrowest(columns[i], cells, i) for i in shown}
    for i in shown:
        if columns[i].key:
            floors[i] = min(widths[i], max(width // 3, 1))
    excess = 1 + sum(w + BORDER_PER_COLUMN for w in widths.values()) - width
    for keys in (False, True):
        while excess > 0:
            narrowable = [i for i in shown if columns[i].key is keys and widths[i] > floors[i]]
            if not narrowable:
                break
            widest = max(narrowable, key=lambda i: widths[i] - floors[i])
            widths[widest] -= 1
            excess -= 1
    return widths


def _natural_width(column: Column, cells: Sequence[Sequence[str]], index: int) -> int:
    return max([len(column.header), *(len(row[index]) for row in cells)])


def _needed(columns: Sequence[Column], cells: Sequence[Sequence[str]], shown: Sequence[int]) -> int:
    """The width the shown columns take at their narrowest readable: key columns whole,
    wrapping ones at ``WRAPPED_MIN_WIDTH``, the others no narrower than their longest
    word: more than that, and a droppable column goes."""
    return 1 + sum(_narrowest(columns[i], cells, i) + BORDER_PER_COLUMN for i in shown)


def _narrowest(column: Column, cells: Sequence[Sequence[str]], index: int) -> int:
    natural = _natural_width(column, cells, index)
    if column.key:
        return natural
    if column.wrap:
        return min(natural, WRAPPED_MIN_WIDTH)
    words = [column.header, *(row[index] for row in cells)]
    return max(len(word) for text in words for word in text.split() or [""])


def _natural(
    columns: Sequence[Column], cells: Sequence[Sequence[str]], shown: Sequence[int]
) -> int:
    return 1 + sum(_natural_width(columns[i], cells, i) + BORDER_PER_COLUMN for i in shown)


def print_json_array(items: Iterable[msgspec.Raw]) -> None:
    """``items`` (JSON values, passed through unchanged but re-indented) as one JSON array."""
    array = b"[" + b",".join(bytes(item) for item in items) + b"]"
    sys.stdout.write(msgspec.json.format(array, indent=2).decode() + "\n")


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless there is exactly one: "1 node", "3 nodes"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def utc_seconds(moment: datetime) -> str:
    """``2026-03-05 16:00:00``: UTC, to the second (the column header says UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def print_error(command: str, message: str) -> None:
    print(f"llmgw-cli {command}: {message}", file=sys.stderr)
