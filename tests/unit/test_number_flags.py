"""Every flag that takes a whole number, in every program, refuses a value that is not one
(``2.5``, ``1e3``, ``0x10``, ``1_0``, non-ASCII digits) with exit 2 and one line naming the
flag and the value; cyclopts' own reading of an ``int`` rounds ``2.5`` to 2, and Python's
``int`` takes ``1_0`` for 10. Every flag that takes a number of seconds or a rate refuses
one that is not finite (``nan``, ``inf``, ``1e400``), or not written in decimal, the same
way.

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
from agent.config_sources import settings_from_env
from agent.config_values import ConfigError
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
NOT_FINITE = ("nan", "inf", "-inf", "1e400", "1_0", "\u0663", "0x10", "")
"""What cyclopts' ``float`` takes but no timeout or rate is (the last three it refuses)."""


@dataclass(frozen=True)
class NumberFlag:
    """One number argument or option of one command, and the others of that command."""

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
    return "1" if _number_hint(argument.hint, int) else "x"


def _number_hint(hint: object, kind: type) -> bool:
    """``kind`` or ``kind | None``."""
    if get_origin(hint) in (Union, types.UnionType):
        return [arg for arg in get_args(hint) if arg is not type(None)] == [kind]
    return hint is kind


def _holds_numbers(hint: object) -> bool:
    """A container of numbers (``list[int]``, ``tuple[float, ...]``), optional or not."""
    if get_origin(hint) in (Union, types.UnionType):
        return any(_holds_numbers(arg) for arg in get_args(hint))
    args = get_args(hint)
    return get_origin(hint) in (list, tuple, set) and (int in args or float in args)


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


def number_flags(kind: type) -> list[NumberFlag]:
    return [
        NumberFlag(program, chain, argument, others)
        for program in PROGRAMS.values()
        for chain, argument, others in _arguments(program)
        if _number_hint(argument.hint, kind)
    ]


INT_FLAGS = number_flags(int)
FLOAT_FLAGS = number_flags(float)


def test_every_program_has_whole_number_flags_to_walk() -> None:
    """The walk finds the flags it is meant to hold: none of the programs is skipped."""
    walked = {flag.root.name[0] for flag in INT_FLAGS}
    assert walked == set(PROGRAMS)
    names = {repr(flag) for flag in INT_FLAGS}
    assert "llmgw-server serve --agent-connect-burst" in names
    assert "llmgw-agent --liveness-failures" in names
    assert {flag.root.name[0] for flag in FLOAT_FLAGS} == {
        "llmgw-server",
        "llmgw-agent",
        "llmgw-cli",
    }


def test_no_flag_takes_several_numbers_unchecked() -> None:
    """A flag given several numbers needs its converter to check each; none exists yet, so
    a new one is told to add it (and to walk it here) rather than be missed."""
    several = [
        f"{program.name[0]} {' '.join(chain)} {argument.names[0]}"
        for program in PROGRAMS.values()
        for chain, argument, _ in _arguments(program)
        if _holds_numbers(argument.hint)
    ]
    assert several == []


@pytest.mark.parametrize("flag", INT_FLAGS, ids=repr)
@pytest.mark.parametrize("value", WALKED)
def test_a_value_that_is_not_a_whole_number_is_refused_naming_the_flag(
    flag: NumberFlag, value: str, capsys: pytest.CaptureFixture[str]
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
def test_a_whole_number_is_taken(flag: NumberFlag) -> None:
    command, _, _ = flag.root.parse_args(flag.command_line("3"))

    assert command is not None


@pytest.mark.parametrize("flag", FLOAT_FLAGS, ids=repr)
@pytest.mark.parametrize("value", NOT_FINITE)
def test_a_value_that_is_not_a_finite_number_is_refused_naming_the_flag(
    flag: NumberFlag, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        flag.root.parse_args(flag.command_line(value))

    line = capsys.readouterr().err
    assert exited.value.code == 2
    assert line.count("\n") == 1
    assert line.startswith(" ".join((flag.root.name[0], *flag.chain)) + ": ")
    assert f"{flag.name} " in line
    assert value in line


@pytest.mark.parametrize("flag", FLOAT_FLAGS, ids=repr)
@pytest.mark.parametrize("value", ["0.5", ".5", "1e-1", " 0.25 "])
def test_a_decimal_number_is_taken(flag: NumberFlag, value: str) -> None:
    command, _, _ = flag.root.parse_args(flag.command_line(value))

    assert command is not None


FROM_VARIABLES = [
    *((flag, "2.5") for flag in INT_FLAGS if flag.argument.parameter.env_var),
    *((flag, "inf") for flag in FLOAT_FLAGS if flag.argument.parameter.env_var),
]


@pytest.mark.parametrize(("flag", "value"), FROM_VARIABLES, ids=repr)
def test_a_variable_that_is_not_a_number_the_flag_takes_is_refused_naming_it(
    flag: NumberFlag,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    variable = next(iter(flag.argument.parameter.env_var or ()))
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exited:
        flag.root.parse_args(flag.command_line(None))

    line = capsys.readouterr().err
    assert exited.value.code == 2
    assert f"{variable} {value!r}: expected a " in line


SIMULATOR_INT_FLAGS = [
    flag for flag in FLAGS if flag.read is not None and type(flag.read("7")) is int
]


SIMULATOR_FLOAT_FLAGS = [
    flag for flag in FLAGS if flag.read is not None and type(flag.read("7")) is float
]


def test_the_simulator_has_number_flags_to_walk() -> None:
    assert "--port" in [flag.names[0] for flag in SIMULATOR_INT_FLAGS]
    assert "--exit-after" in [flag.names[0] for flag in SIMULATOR_FLOAT_FLAGS]


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


@pytest.mark.parametrize("flag", SIMULATOR_FLOAT_FLAGS, ids=lambda flag: flag.names[0])
@pytest.mark.parametrize("value", NOT_FINITE)
def test_the_simulator_refuses_a_value_that_is_not_a_finite_number(flag: Flag, value: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_simulator_flags([f"{flag.names[0]}={value}"], {})

    assert str(refused.value).startswith(f"{flag.names[0]} {value!r}: expected a number of ")


@pytest.mark.parametrize(
    "variable",
    [
        "LLMGW_AGENT_RECONNECT_MAX_DELAY",
        "LLMGW_AGENT_CONNECT_TIMEOUT",
        "LLMGW_AGENT_OPEN_TIMEOUT",
        "LLMGW_AGENT_NEXT_SERVER_AFTER",
        "LLMGW_AGENT_LIVENESS_INTERVAL",
    ],
)
@pytest.mark.parametrize("value", ["1_0", "\u0663", "nan"])
def test_the_agent_refuses_a_seconds_variable_that_is_not_a_decimal_number(
    variable: str, value: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        settings_from_env({variable: value})

    assert str(refused.value).startswith(f"{variable} ")
    assert "expected a " in str(refused.value)


@pytest.mark.parametrize("value", ["1_0", "\u0663", "2.5"])
def test_the_agent_refuses_a_count_variable_that_is_not_a_whole_number(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        settings_from_env({"LLMGW_AGENT_LIVENESS_FAILURES": value})

    assert str(refused.value) == f"LLMGW_AGENT_LIVENESS_FAILURES {value!r}: expected a whole number"
