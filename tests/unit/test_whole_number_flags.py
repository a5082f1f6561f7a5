"""Every flag that takes a whole number, in every program, refuses a value that is not one
(``2.5``, ``1e3``, ``0x10``, ``1_0``, non-ASCII digits) with exit 2 and one line naming the
flag and the value; cyclopts' own reading of an ``int`` rounds ``2.5`` to 2, and Python's
``int`` takes ``1_0`` for 10.

The cyclopts programs are walked through their ``App`` objects, so a flag added later is
held to the rule without being listed here; the engine simulator, whose flags are its own
argparse table, through that table.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Union, get_args, get_origin

import pytest
from cyclopts import App
from cyclopts.argument import Argument

import agent.main
import app.main
import cli.main
import devcluster.main
from agent.config import ConfigError, settings_from_env
from agent.simulator.flags import FLAGS, Flag, UsageError
from agent.simulator.flags import parse as parse_simulator_flags

PROGRAMS = {
    "llmgw-server": app.main.app,
    "llmgw-agent": agent.main.app,
    "llmgw-dev": devcluster.main.app,
    "llmgw-cli": cli.main.app,
}
NOT_WHOLE = ("2.5", "0.6", "1e3", "0x10", "1_0", "\u0663", "\uff13", "", "2,5")
"""cyclopts rounds the first two, reads ``0x10`` and ``1_0`` as 16 and 10, and the
non-ASCII digits as their value."""
WALKED = ("2.5", "0x10", "1_0", "\u0663")
"""What is given to every cyclopts flag: one of each way cyclopts misreads a count."""


@dataclass(frozen=True)
class IntFlag:
    """One ``int`` argument or option of one command, and the others of that command."""

    root: App
    chain: tuple[str, ...]
    argument: Argument
    others: list[Argument]

    @property
    def name(self) -> str:
        return self.argument.names[0]

    def command_line(self, value: str | None) -> list[str]:
        """The command with its required arguments filled in and ``value`` given to this
        one; None leaves this one out (an option: its variable may give it)."""
        chosen = {id(self.argument): value or ""}
        positional = sorted(
            (o for o in self.others if o.index is not None and (o.required or o is self.argument)),
            key=lambda o: o.index or 0,
        )
        options = [o for o in self.others if o.index is None and (o.required or o is self.argument)]
        if value is None:
            options.remove(self.argument)
        return [
            *self.chain,
            *(chosen.get(id(o), _filler(o)) for o in positional),
            *(word for o in options for word in (o.names[0], chosen.get(id(o), _filler(o)))),
        ]

    def __repr__(self) -> str:
        return " ".join((self.root.name[0], *self.chain, self.name))


def _filler(argument: Argument) -> str:
    return "1" if _whole_number_hint(argument.hint) else "x"


def _whole_number_hint(hint: object) -> bool:
    """``int`` or ``int | None``."""
    if get_origin(hint) in (Union, types.UnionType):
        return [arg for arg in get_args(hint) if arg is not type(None)] == [int]
    return hint is int


def _holds_whole_numbers(hint: object) -> bool:
    """A container of ``int`` (``list[int]``, ``tuple[int, ...]``), optional or not."""
    if get_origin(hint) in (Union, types.UnionType):
        return any(_holds_whole_numbers(arg) for arg in get_args(hint))
    return get_origin(hint) in (list, tuple, set) and int in get_args(hint)


def _commands(root: App, chain: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], App]]:
    for name in root:
        if not name.startswith("-"):
            yield from _commands(root[name], (*chain, name))
    if root.default_command is not None:
        yield chain, root


def _arguments(program: App) -> Iterator[tuple[tuple[str, ...], Argument, list[Argument]]]:
    for chain, command in _commands(program):
        arguments = [
            argument
            for argument in command.assemble_argument_collection()
            if argument.parse and not argument.children  # a settings struct: its fields are
        ]
        for argument in arguments:
            yield chain, argument, arguments


def int_flags() -> list[IntFlag]:
    return [
        IntFlag(program, chain, argument, others)
        for program in PROGRAMS.values()
        for chain, argument, others in _arguments(program)
        if _whole_number_hint(argument.hint)
    ]


INT_FLAGS = int_flags()


def test_every_program_has_whole_number_flags_to_walk() -> None:
    """The walk finds the flags it is meant to hold: none of the programs is skipped."""
    walked = {flag.root.name[0] for flag in INT_FLAGS}
    assert walked == set(PROGRAMS)
    names = {repr(flag) for flag in INT_FLAGS}
    assert "llmgw-server serve --agent-connect-burst" in names
    assert "llmgw-agent --liveness-failures" in names


def test_no_flag_takes_several_whole_numbers_unchecked() -> None:
    """A flag given several whole numbers needs its converter to check each; none exists
    yet, so a new one is told to add it (and to walk it here) rather than be missed."""
    several = [
        f"{program.name[0]} {' '.join(chain)} {argument.names[0]}"
        for program in PROGRAMS.values()
        for chain, argument, _ in _arguments(program)
        if _holds_whole_numbers(argument.hint)
    ]
    assert several == []


@pytest.mark.parametrize("flag", INT_FLAGS, ids=repr)
@pytest.mark.parametrize("value", WALKED)
def test_a_value_that_is_not_a_whole_number_is_refused_naming_the_flag(
    flag: IntFlag, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        flag.root.parse_args(flag.command_line(value))

    line = capsys.readouterr().err
    assert exited.value.code == 2
    assert line.count("\n") == 1
    assert line.startswith(" ".join((flag.root.name[0], *flag.chain)) + ": ")
    assert f"{flag.name} " in line
    assert value in line
    assert "whole number" in line


@pytest.mark.parametrize("flag", INT_FLAGS, ids=repr)
def test_a_whole_number_is_taken(flag: IntFlag) -> None:
    command, _, _ = flag.root.parse_args(flag.command_line("3"))

    assert command is not None


ENV_INT_FLAGS = [flag for flag in INT_FLAGS if flag.argument.parameter.env_var]


@pytest.mark.parametrize("flag", ENV_INT_FLAGS, ids=repr)
def test_a_variable_that_is_not_a_whole_number_is_refused_naming_it(
    flag: IntFlag, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    variable = flag.argument.parameter.env_var[0]
    monkeypatch.setenv(variable, "2.5")
    with pytest.raises(SystemExit) as exited:
        flag.root.parse_args(flag.command_line(None))

    line = capsys.readouterr().err
    assert exited.value.code == 2
    assert f"{variable} '2.5'" in line


SIMULATOR_INT_FLAGS = [
    flag for flag in FLAGS if flag.read is not None and type(flag.read("7")) is int
]


def test_the_simulator_has_whole_number_flags_to_walk() -> None:
    assert "--port" in [flag.names[0] for flag in SIMULATOR_INT_FLAGS]


@pytest.mark.parametrize("flag", SIMULATOR_INT_FLAGS, ids=lambda flag: flag.names[0])
@pytest.mark.parametrize("value", NOT_WHOLE)
def test_the_simulator_refuses_a_value_that_is_not_a_whole_number(flag: Flag, value: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_simulator_flags([f"{flag.names[0]}={value}"], {})

    assert str(refused.value) == f"{flag.names[0]} {value!r}: expected a whole number"


@pytest.mark.parametrize("flag", SIMULATOR_INT_FLAGS, ids=lambda flag: flag.names[0])
def test_the_simulator_refuses_a_variable_that_is_not_a_whole_number(flag: Flag) -> None:
    variable = flag.variables[0]

    with pytest.raises(UsageError) as refused:
        parse_simulator_flags([], {variable: "1_0"})

    assert str(refused.value) == f"{variable}='1_0': expected a whole number"


@pytest.mark.parametrize("value", ["1_0", "\u0663", "2.5"])
def test_the_agent_refuses_a_count_variable_that_is_not_a_whole_number(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        settings_from_env({"LLMGW_AGENT_LIVENESS_FAILURES": value})

    assert str(refused.value) == f"LLMGW_AGENT_LIVENESS_FAILURES {value!r}: expected a whole number"
