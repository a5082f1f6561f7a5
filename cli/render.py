"""Everything llmgw-cli writes goes out through here: tables and lines for people (rich),
JSON for scripts, one-line errors on stderr.

Much of what it shows was written by others: GPU names and UUIDs, labels and reasons that nodes
report, engines' logs and errors, actors, the server's error messages. A terminal acts on
control characters in it: ``ESC ] 0 ;`` sets its title, ``ESC [ 2 J`` clears the screen,
``CR`` goes back over a line, U+202E reverses what follows. So every character a terminal
would act on or not show is written as a visible escape (``escape_controls``) before it is
laid out (``say``, ``text``, ``styled``, ``print_table``...), and the consoles made here
(``make_console``) escape whatever still holds one when it is written. JSON is written with
such characters as ``\\u`` escapes: the same values to any reader of JSON.
``tests/unit/test_cli_terminal.py`` fails on a ``print(``, a use of ``sys.stdout`` or
``sys.stderr``, or a ``Console(`` or ``Text(`` made anywhere else in ``cli/``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, TextIO

import msgspec
from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from app.usage_errors import OutputConsole

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

EVENT_TYPE_WIDTH = 26
"""The event type's column in a line per event (``events --follow``, ``drain --wait`` off
a terminal): as wide as the widest type the server records, ``rollout_hold_ejection_seen``
(the CLI knows no list of them: it never imports the domain; the tests compare)."""


# -- what reaches the terminal ---------------------------------------------------------


def escape_controls(text: str, *, keep: str = "") -> str:
    """``text`` with every character a terminal would act on or not show written as a
    visible escape, as Python writes it in a string literal: C0 controls and DEL
    (``\\x1b``, ``\\r``, ``\\x08``, ``\\n``, ``\\t``), C1 controls (``\\x9b``),
    bidirectional overrides and isolates (``\\u202e``), zero-width and other format
    characters, line and paragraph separators, surrogates, unassigned code points. Only the
    characters in ``keep`` (``"\\n"`` where a block of lines is meant) are left as they
    are. A backslash is left as it is, so ``\\x1b`` may also be those four characters."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else _escaped(c) for c in text)


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(character: str) -> str:
    short = _SHORT_ESCAPES.get(character)
    if short is not None:
        return short
    code = ord(character)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def json_for_terminal(text: str) -> str:
    """JSON text with every character a terminal would act on or not show written as a
    JSON escape (``\\u009b``, ``\\u202e``; a pair of surrogates past U+FFFF): the same
    values to any reader of JSON. JSON itself escapes only U+0000 to U+001F; newlines,
    the only whitespace a formatted document holds outside its strings, are kept."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\n" else _json_escaped(c) for c in text)


def _json_escaped(character: str) -> str:
    code = ord(character)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


class _EscapingConsole(OutputConsole):
    """A rich console that writes no control character but its own, and whose closed
    output ends the program quietly (``OutputConsole``). What is laid out is
    escaped beforehand (``text``, ``styled``, ``print_table``); anything that still holds
    one when it is rendered (a ``Text`` made elsewhere) is escaped then, after its layout,
    which may misalign a column but never reaches the terminal. Cursor moves and colours
    are segments of rich's own (``control``, ``style``), left alone."""

    whole_tables = False
    """Whether tables are laid out whole, as ``--output wide`` lays them out: set for
    stdout when it is no terminal and no width is asked for (``make_console``)."""

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterator[Segment]:
        for segment in super().render(renderable, options):
            text = segment.text
            if segment.control or text.isprintable() or text == "\n":
                yield segment
            else:
                yield Segment(escape_controls(text, keep="\n"), segment.style, segment.control)


def make_console(
    *,
    stderr: bool = False,
    width: int | None = None,
    soft_wrap: bool = False,
    file: TextIO | None = None,
    force_terminal: bool | None = None,
) -> Console:
    """A console for people's output (stdout, ``stderr``, or ``file``) that escapes what it
    is given and reads nothing in it as markup or emoji codes: ``[red]`` and ``:smile:`` in
    a label are printed as they are.

    Stdout that is no terminal (a pipe, a file: a script's ``| grep``, cron's mail, a CI
    log) has no width to fit: rich would lay everything out for 80 columns, or for the
    width of whatever terminal stdin or stderr is, leaving columns out and folding values
    over lines that a ``grep`` then finds in pieces. There, unless ``$COLUMNS`` asks for a
    width, tables are laid out whole (``lays_out_whole``). Other lines keep rich's own
    folding: soft wrapping them all would crop what rich lays out in boxes of the
    console's width (``--help``'s examples)."""
    whole = (
        file is None
        and not stderr
        and width is None
        and force_terminal is None
        and stdout_has_no_width()
    )
    console = _EscapingConsole(
        stderr=stderr,
        file=file,
        force_terminal=force_terminal,
        width=width,
        soft_wrap=soft_wrap,
        highlight=False,
        markup=False,
        emoji=False,
    )
    console.whole_tables = whole
    return console


def stdout_has_no_width(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether stdout is no terminal and ``$COLUMNS`` gives no width either."""
    columns = environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit() and int(columns) > 0:
        return False
    try:
        return not os.isatty(sys.stdout.fileno())
    except (OSError, ValueError):  # closed, or replaced by something with no descriptor
        return True


def lays_out_whole(console: Console) -> bool:
    """Whether ``console`` wants its tables whole, every column as wide as it needs
    (``make_console``): as ``--output wide``."""
    return isinstance(console, _EscapingConsole) and console.whole_tables


def text(value: str, style: str = "") -> Text:
    """``value`` escaped, as rich text in ``style``."""
    return Text(escape_controls(value), style=style)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Rich text of ``parts``, each escaped: a string, or a string and its style
    (``styled(("node:", "bold"), " ", node_id)``)."""
    return Text.assemble(
        *(
            escape_controls(part) if isinstance(part, str) else (escape_controls(part[0]), part[1])
            for part in parts
        )
    )


def say(line: str = "") -> None:
    """One line on stdout, escaped, written at once."""
    _write(sys.stdout, escape_controls(line) + "\n")


def warn(line: str) -> None:
    """One line on stderr, escaped, written at once."""
    _write(sys.stderr, escape_controls(line) + "\n")


def print_block(block: str) -> None:
    """Lines as they are (a shell completion script) on stdout, every character escaped but
    newlines and tabs."""
    _write(sys.stdout, escape_controls(block, keep="\n\t"))


def print_json(raw: bytes) -> None:
    """One JSON value, re-indented, with ``json_for_terminal``'s escapes."""
    formatted = msgspec.json.format(raw, indent=2).decode()
    _write(sys.stdout, json_for_terminal(formatted) + "\n")


def print_json_line(raw: bytes) -> None:
    """One JSON value on one line (a JSON-lines stream), with ``json_for_terminal``'s
    escapes; ``msgspec.DecodeError`` when ``raw`` is not JSON."""
    formatted = msgspec.json.format(raw, indent=0).decode()
    _write(sys.stdout, json_for_terminal(formatted) + "\n")


def _write(stream: TextIO, written: str) -> None:
    stream.write(written)
    stream.flush()


WRAPPED_MIN_WIDTH = 16
"""The narrowest a wrapping column gets before columns are dropped instead."""
BORDER_PER_COLUMN = 3
"""``│ x `` around each cell, and one more ``│`` at the end of a row."""
CELL_PADDING = 1
"""The space either side of a value in its cell."""


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
    instead). ``wide``: every column, each as wide as it needs. Cells are plain text,
    escaped (``escape_controls``): brackets in values are printed, never read as markup."""
    console = console or make_console()
    wide = wide or lays_out_whole(console)
    cells = [[escape_controls(value or "") for value in row] for row in rows]
    shown = list(range(len(columns)))
    if wide:
        console = _widened(console, max(console.width, _natural(columns, cells, shown)))
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
        console = _widened(console, total)
    console.print(
        _Grid(
            title=None if title is None else text(title),
            columns=[columns[i] for i in shown],
            widths=[widths[i] for i in shown],
            rows=[[row[i] for i in shown] for row in cells],
        )
    )
    left_out = [columns[i].header for i in range(len(columns)) if i not in shown]
    if left_out:
        console.print(
            f"(left out to fit: {', '.join(left_out)}; --output wide shows them)", soft_wrap=True
        )


@dataclass(frozen=True)
class _Grid:
    """A table laid out as rich's ``Table`` lays one out (heavy head box, a space either
    side of each cell, bold headers, values folded within their column) with the columns'
    widths already settled by ``print_table``. A ``Table`` lays out every cell through
    rich's general machinery (padding, wrapping, cropping: some 50 µs a cell, seconds for
    a few thousand rows); here a value that fits its column on one line, nearly every one,
    is written as it is, padded, and only the others go through that machinery, as the
    headers do. ``tests/unit/test_cli_table_layout.py`` holds the two to the same output."""

    title: Text | None
    columns: Sequence[Column]
    widths: Sequence[int]
    """Each column's width inside its cells' padding."""
    rows: Sequence[Sequence[str]]
    """Escaped values, one per column."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        widths = [width + 2 * CELL_PADDING for width in self.widths]
        options = options.update(width=1 + sum(w + 1 for w in widths), height=None)
        options = options.update(highlight=False)
        if self.title is not None:
            yield from console.render(self.title, options.update(justify="left"))
        frame = box.HEAVY_HEAD.substitute(options, safe=console.safe_box)
        line = Segment.line()
        yield Segment(frame.get_top(widths))
        yield line
        bold = console.get_style("bold")
        headers = [
            self._laid_out(console, options, column.header, column, width, bold)
            for column, width in zip(self.columns, widths, strict=True)
        ]
        sides = (frame.head_left, frame.head_vertical, frame.head_right)
        yield from self._row(headers, widths, sides, bold, bottom=True)
        yield Segment(frame.get_row(widths, "head", edge=True))
        yield line
        for index, row in enumerate(self.rows):
            if index == len(self.rows) - 1:
                sides = (frame.foot_left, frame.foot_vertical, frame.foot_right)
            else:
                sides = (frame.mid_left, frame.mid_vertical, frame.mid_right)
            cells = [
                self._cell(console, options, value, column, width)
                for value, column, width in zip(row, self.columns, widths, strict=True)
            ]
            yield from self._row(cells, widths, sides, Style.null(), bottom=False)
        yield Segment(frame.get_bottom(widths))
        yield line

    @staticmethod
    def _cell(
        console: Console, options: ConsoleOptions, value: str, column: Column, width: int
    ) -> list[list[Segment]]:
        room = width - 2 * CELL_PADDING - cell_len(value)
        # What rich would lay out differently: a value it must fold, or one it strips
        # trailing spaces off before justifying.
        if room < 0 or value[-1:].isspace():
            return _Grid._laid_out(console, options, Text(value), column, width, Style.null())
        pad = " " * CELL_PADDING
        if column.justify == "right":
            return [[Segment(f"{pad}{' ' * room}{value}{pad}")]]
        return [[Segment(f"{pad}{value}{' ' * room}{pad}")]]

    @staticmethod
    def _laid_out(
        console: Console,
        options: ConsoleOptions,
        value: str | Text,
        column: Column,
        width: int,
        style: Style,
    ) -> list[list[Segment]]:
        """``value`` laid out by rich as a ``Table`` lays out a cell of ``column``."""
        cell_options = options.update(
            width=width, justify=column.justify, no_wrap=False, overflow="fold", height=None
        )
        padded = Padding(value, (0, CELL_PADDING))
        return console.render_lines(padded, cell_options, style=style)

    @staticmethod
    def _row(
        cells: list[list[list[Segment]]],
        widths: Sequence[int],
        sides: tuple[str, str, str],
        style: Style,
        *,
        bottom: bool,
    ) -> Iterator[Segment]:
        """One row of cells side by side, each as high as the highest (in ``style``): a
        header's lines at the bottom of its cell, a value's at the top."""
        height = max(len(cell) for cell in cells)
        align = Segment.align_bottom if bottom else Segment.align_top
        shaped = [
            align(cell, width, height, style) if len(cell) < height else cell
            for cell, width in zip(cells, widths, strict=True)
        ]
        left, divider, right = (Segment(side) for side in sides)
        for line_no in range(height):
            yield left
            for index, cell in enumerate(shaped):
                if index:
                    yield divider
                yield from cell[line_no]
            yield right
            yield Segment.line()


def _widened(console: Console, width: int) -> Console:
    """A console like ``console`` (same file, same colours) ``width`` columns wide."""
    return _EscapingConsole(
        file=console.file,
        width=width,
        no_color=console.no_color,
        highlight=False,
        markup=False,
        emoji=False,
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
    print_json(b"[" + b",".join(bytes(item) for item in items) + b"]")


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless there is exactly one: "1 node", "3 nodes"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def utc_seconds(moment: datetime) -> str:
    """``2026-03-05 16:00:00``: UTC, to the second (the column header says UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def print_error(command: str, message: str) -> None:
    """``llmgw-cli COMMAND: MESSAGE``, one line on stderr, escaped."""
    warn(f"llmgw-cli {command}: {message}")
