"""Every command of every program, and every command group, has ``--help`` with an example:
a line that runs it, as the README promises."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

import pytest
from cyclopts import App
from rich.console import Console

from agent.main import app as agent_app
from agent.simulator.flags import build_parser
from app.main import app as server_app
from cli.main import app as cli_app
from devcluster.main import app as dev_app

PROGRAMS = {"llmgw-cli": cli_app, "llmgw-server": server_app, "llmgw-agent": agent_app}


def commands(app: App, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name in app:
        if name.startswith("-"):
            continue
        yield (*path, name)
        yield from commands(app[name], (*path, name))


def help_text(app: App, path: tuple[str, ...]) -> str:
    shown = io.StringIO()
    app.help_print(list(path), console=Console(file=shown, width=200, force_terminal=False))
    return shown.getvalue()


# Every program's own --help shows an example too: llmgw-agent and llmgw-dev are commands
# themselves, llmgw-cli and llmgw-server groups of commands.
EVERY_COMMAND = [(program, path) for program, app in PROGRAMS.items() for path in commands(app)] + [
    ("llmgw-agent", ()),
    ("llmgw-dev", ()),
    ("llmgw-cli", ()),
    ("llmgw-server", ()),
]


@pytest.mark.parametrize(
    ("program", "path"), EVERY_COMMAND, ids=[" ".join((p, *c)) for p, c in EVERY_COMMAND]
)
def test_help_has_an_example(program: str, path: tuple[str, ...]) -> None:
    app = dev_app if program == "llmgw-dev" else PROGRAMS[program]
    shown = help_text(app, path)

    # An indented line that runs it (after any VAR=value, or in eval "$(...)"), or one
    # after "Example: "; never the Usage line.
    command = re.escape(" ".join((program, *path)))
    example = rf"^(\s+|.*Example: )(eval \"\$\(|\S+=\S+ )*{command}(\s|$)"
    assert re.search(example, shown, re.MULTILINE), shown


def test_the_simulators_help_has_an_example() -> None:
    """llmgw-sim-engine keeps argparse (docs/simulator.md): its help is argparse's."""
    shown = build_parser().format_help()

    assert re.search(r"^Example: llmgw-sim-engine\s", shown, re.MULTILINE), shown


def test_the_agents_help_says_where_else_its_settings_come_from() -> None:
    """Its flags are read from LLMGW_AGENT_* variables and a config file too, which its
    options do not show one by one as serve's do."""
    shown = " ".join(help_text(agent_app, ()).split())
    for named in ("LLMGW_AGENT_NODE_ID", "LLMGW_AGENT_SERVERS", "--config", "docs/agent.md"):
        assert named in shown, shown


def test_the_walk_reaches_nested_commands() -> None:
    assert ("history", "key") in list(commands(cli_app))
    assert ("projections", "rebuild") in list(commands(server_app))


@pytest.mark.parametrize("path", list(commands(cli_app)), ids=" ".join)
def test_every_output_choice_offered_is_described(path: tuple[str, ...]) -> None:
    """``--output`` lists its choices; its help says what each of them prints."""
    shown = " ".join(help_text(cli_app, path).split())
    choices = re.search(r"--output CHOICE (.*?)\[choices: ([a-z, ]+)\]", shown)
    if choices is None:
        return
    described, offered = choices.group(1), choices.group(2).split(", ")
    assert [choice for choice in offered if not re.search(rf"\b{choice}\b", described)] == []


@pytest.mark.parametrize("path", list(commands(cli_app)), ids=" ".join)
def test_every_option_says_what_it_does(path: tuple[str, ...]) -> None:
    """No option is shown with only its type and default."""
    bare = re.compile(r"^│\s+(\*\s+)?(-[\w-]+)(\s+[A-Z_.]+)?\s+(\[default|\[choices|│)")
    shown = help_text(cli_app, path).splitlines()
    assert [line.split()[1] for line in shown if bare.match(line)] == []


STARTING_COMMANDS = [
    ("llmgw-server", ("serve",)),
    ("llmgw-server", ("gateway",)),
    ("llmgw-server", ("migrate",)),
    ("llmgw-agent", ()),
    ("llmgw-dev", ()),
]


@pytest.mark.parametrize(
    ("program", "path"), STARTING_COMMANDS, ids=[" ".join((p, *c)) for p, c in STARTING_COMMANDS]
)
def test_help_of_a_program_that_starts_lists_its_exit_codes(
    program: str, path: tuple[str, ...]
) -> None:
    """What a supervisor (systemd's Restart=, a container's restart policy) acts on."""
    app = dev_app if program == "llmgw-dev" else PROGRAMS[program]
    shown = " ".join(help_text(app, path).split())

    assert re.search(r"Exit codes: 0 .*?[;,] 1 .*?[;,] 2 ", shown), shown
