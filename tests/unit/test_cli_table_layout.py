"""`print_table` lays a table out as rich's ``Table`` does, character for character and
style for style, without sending every cell through rich's layout: a listing of thousands
of rows (``keys list``) takes tens of milliseconds to lay out, not seconds."""

from __future__ import annotations

import io
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

import cli.render
from cli.keys import COLUMNS as KEY_COLUMNS
from cli.render import Column, print_table

WORDS = (
    "", "a", "llama-3-8b", "x" * 30, "two words here", "  leading", "trailing ", "é",
    "日本語テキスト", "[red]not markup[/]", "k-" + "f" * 40, "2026-12-01 09:00:00",
)  # fmt: skip


def as_rich_table(
    *,
    title: Text | None,
    columns: Sequence[Column],
    widths: Sequence[int],
    rows: Sequence[Sequence[str]],
) -> Table:
    """The same table as rich's own ``Table`` lays it out: what ``print_table`` drew
    before it laid out its cells itself."""
    table = Table(title=title, title_justify="left", header_style="bold", expand=False)
    for column, width in zip(columns, widths, strict=True):
        table.add_column(column.header, justify=column.justify, overflow="fold", width=width)
    for row in rows:
        table.add_row(*(Text(value) for value in row))
    return table


def rendered(
    rows: Sequence[Sequence[str]], width: int, *, wide: bool = False, terminal: bool = False
) -> str:
    output = io.StringIO()
    console = Console(
        file=output,
        width=width,
        highlight=False,
        force_terminal=terminal,
        color_system="truecolor" if terminal else None,
    )
    print_table(KEY_COLUMNS, rows, title="keys [b]", console=console, wide=wide)
    return output.getvalue()


rows_of_words = st.lists(
    st.tuples(*(st.sampled_from(WORDS) for _ in KEY_COLUMNS)).map(
        lambda row: tuple(value + row[0] for value in row)
    ),
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(
    rows=rows_of_words,
    width=st.sampled_from([40, 80, 200]),
    wide=st.booleans(),
    terminal=st.booleans(),
)
def test_a_table_is_drawn_as_richs_table_draws_it(
    rows: list[tuple[str, ...]], width: int, wide: bool, terminal: bool
) -> None:
    drawn = rendered(rows, width, wide=wide, terminal=terminal)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli.render, "_Grid", as_rich_table)
        by_rich = rendered(rows, width, wide=wide, terminal=terminal)

    assert drawn == by_rich


def test_thousands_of_one_line_rows_are_laid_out_without_richs_cell_layout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    laid_out: list[object] = []
    lay_out = Console.render_lines

    def counted(self: Console, renderable: object, *args: object, **kwargs: object) -> object:
        if isinstance(renderable, Padding):  # a cell (its content is laid out within)
            laid_out.append(renderable)
        return lay_out(self, renderable, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Console, "render_lines", counted)
    rows = [
        (f"{i:08x}", f"key-{i}", "live", "llama-3-8b", "60", "-", "never",
         "2026-12-01 09:00:00", "alice", "", "", f"k-{i:08x}")
        for i in range(2_000)
    ]  # fmt: skip

    text = rendered(rows, 200)

    assert text.count("│ live ") == 2_000
    assert len(laid_out) <= len(KEY_COLUMNS), "only the headers go through rich's layout"
