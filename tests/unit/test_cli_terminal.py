"""What llmgw-cli writes for people holds no character a terminal would act on but its own
colours: every other control character is shown as a visible escape, and every write goes
through ``cli/render.py``, so that new code cannot print around it."""

from __future__ import annotations

import ast
import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.text import Text

from cli.render import (
    Column,
    escape_controls,
    json_for_terminal,
    make_console,
    print_block,
    print_error,
    print_json,
    print_json_line,
    print_table,
    say,
)

CLI = Path(__file__).resolve().parents[2] / "cli"
OUTPUT_MODULE = CLI / "render.py"
SGR = re.compile(r"\x1b\[[0-9;]*m")
"""Colours and bold: the only sequences llmgw-cli writes of its own."""


# -- escape_controls ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # OSC: the window's title
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clear the screen, cursor home
        ("ok\rnot ok", "ok\\rnot ok"),  # back over the line
        ("abc\x08\x08\x08xyz", "abc\\x08\\x08\\x08xyz"),  # backspaces
        ("two\nlines\tand a tab", "two\\nlines\\tand a tab"),
        ("\x00\x7f", "\\x00\\x7f"),
        ("\x9b31m\x90\x9d", "\\x9b31m\\x90\\x9d"),  # C1: CSI, DCS, OSC in one character
        ("\u202eevil\u202c", "\\u202eevil\\u202c"),  # bidi override and pop
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),  # bidi isolates
        ("a\u200bb\ufeff", "a\\u200bb\\ufeff"),  # zero-width space, BOM
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("\U000e0041", "\\U000e0041"),  # a tag character
    ],
)
def test_each_control_character_is_shown_as_an_escape(text: str, shown: str) -> None:
    assert escape_controls(text) == shown


@pytest.mark.parametrize(
    "text",
    ["gpu-07", "H100 80GB HBM3", "zone=us-east-1a", "模型 ünïcödé ✓", "C:\\models\\x1b", ""],
)
def test_printable_text_is_left_as_it_is(text: str) -> None:
    assert escape_controls(text) is text


def test_newlines_and_tabs_are_kept_only_where_asked() -> None:
    assert escape_controls("a\n\tb\x1b", keep="\n\t") == "a\n\tb\\x1b"


@given(st.text())
def test_nothing_escaped_holds_a_character_a_terminal_acts_on(text: str) -> None:
    assert escape_controls(text).isprintable()


@given(st.recursive(st.text() | st.integers(), lambda inner: st.lists(inner, max_size=3)))
def test_json_for_the_terminal_reads_back_as_the_same_values(value: object) -> None:
    encoded = json.dumps(value, ensure_ascii=False, indent=2)

    escaped = json_for_terminal(encoded)

    assert json.loads(escaped) == value
    assert escaped.replace("\n", "").isprintable()


# -- what commands print ---------------------------------------------------------------------


def test_lines_errors_and_json_are_written_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    say("node gpu-1\x1b]0;owned\x07: cordoned")
    print_error("node", "no node 'x' is known\r\x1b[2K")
    print_json(b'{"name": "\\u001b[31m\xc2\x9b\xe2\x80\xae"}')
    print_json_line(b'{"a": ["\xe2\x80\xae"]}')
    print_block("complete -F _llmgw\tllmgw-cli\n\x1b[2J\n")

    out, err = capsys.readouterr()

    assert out == (
        "node gpu-1\\x1b]0;owned\\x07: cordoned\n"
        '{\n  "name": "\\u001b[31m\\u009b\\u202e"\n}\n'
        '{"a": ["\\u202e"]}\n'
        "complete -F _llmgw\tllmgw-cli\n\\x1b[2J\n"
    )
    assert err == "llmgw-cli node: no node 'x' is known\\r\\x1b[2K\n"


def test_a_table_shows_hostile_cells_escaped_and_keeps_its_columns_aligned() -> None:
    written = io.StringIO()
    console = make_console(file=written, width=120, force_terminal=True)

    print_table(
        (Column("node", key=True), Column("GPU"), Column("labels", wrap=True)),
        [("gpu-1", "H100\x1b]0;owned\x07", "zone=a\u202eb\nfake=row"), ("gpu-2", "H100", "")],
        title="nodes\x1b[2J",
        console=console,
    )

    plain = SGR.sub("", written.getvalue())
    assert "\x1b" not in plain
    assert "H100\\x1b]0;owned\\x07" in plain
    assert "zone=a\\u202eb\\nfake=row" in plain
    assert "nodes\\x1b[2J" in plain
    widths = {len(line) for line in plain.splitlines()[1:]}
    assert len(widths) == 1, plain


def test_text_made_without_escaping_is_still_escaped_when_written() -> None:
    # The last resort: a Text built elsewhere, with the sequence in it, reaches the
    # console's render and is escaped there.
    written = io.StringIO()
    console = make_console(file=written, width=80, force_terminal=True)

    console.print(Text("a\x1b]0;owned\x07b\x9bc", style="bold"))
    console.print("[red]not markup[/] :smile:")

    shown = written.getvalue()
    # rich drops BEL, CR and backspaces from a Text itself; the rest is escaped.
    assert SGR.sub("", shown) == "a\\x1b]0;ownedb\\x9bc\n[red]not markup[/] :smile:\n"
    assert SGR.search(shown)  # its own bold is kept


# -- nothing prints around cli/render.py ----------------------------------------------------


def bypasses(source: str) -> list[str]:
    """Each place in ``source`` that writes for people other than through cli/render.py:
    ``print(``, ``sys.stdout``/``sys.stderr`` (but their ``fileno()``), ``os.write(``,
    rich's ``print``, a ``Console(`` or ``Text(`` made directly."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Call):
            called = node.func
            name = called.id if isinstance(called, ast.Name) else None
            attribute = called.attr if isinstance(called, ast.Attribute) else None
            owner = called.value if isinstance(called, ast.Attribute) else None
            if name in {"print", "pprint", "Console", "Text"}:
                what = f"{name}("
            elif attribute == "Console" or (
                isinstance(owner, ast.Name) and owner.id == "Text" and attribute != "__name__"
            ):
                what = f"{ast.unparse(called)}("
            elif attribute == "write" and isinstance(owner, ast.Name) and owner.id == "os":
                what = "os.write("
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
            and node.attr in {"stdout", "stderr", "__stdout__", "__stderr__"}
        ):
            used = parents.get(node)
            if not (isinstance(used, ast.Attribute) and used.attr == "fileno"):
                what = f"sys.{node.attr}"
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module in {"rich", "pprint"}
            and any(alias.name in {"print", "pprint"} for alias in node.names)
        ):
            what = f"from {node.module} import print"
        if what is not None:
            found.append(f"{node.lineno}: {what}")
    return found


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("print('x')", ["1: print("]),
        ("import sys\nsys.stdout.write('x')", ["2: sys.stdout"]),
        ("import sys\nout = sys.stderr", ["2: sys.stderr"]),
        ("import sys\nsys.stdout.buffer.write(b'x')", ["2: sys.stdout"]),
        ("import os\nos.write(1, b'x')", ["2: os.write("]),
        ("from rich import print\nprint('x')", ["1: from rich import print", "2: print("]),
        ("from rich.console import Console\nConsole().print('x')", ["2: Console("]),
        ("import rich.console\nrich.console.Console()", ["2: rich.console.Console("]),
        ("from rich.text import Text\nText('x')", ["2: Text("]),
        ("from rich.text import Text\nText.assemble('x')", ["2: Text.assemble("]),
        ("import sys\nsys.stdout.fileno()", []),
        ("from cli.render import say\nsay('x')", []),
    ],
)
def test_the_check_finds_every_way_around_the_output_module(source: str, found: list[str]) -> None:
    assert sorted(bypasses(source)) == sorted(found)


def test_nothing_in_cli_writes_for_people_but_through_the_output_module() -> None:
    found = [
        f"{path.relative_to(CLI.parent)}:{place}"
        for path in sorted(CLI.rglob("*.py"))
        if path != OUTPUT_MODULE
        for place in bypasses(path.read_text())
    ]

    assert found == [], "write through cli/render.py (say, warn, print_error, print_json, ...)"
    assert bypasses(OUTPUT_MODULE.read_text())  # the one place that does
