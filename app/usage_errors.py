"""A mistyped command line, told in one line on stderr (cyclopts then exits 2), the same
way by every program: ``llmgw-server serve: unknown option --nope; see llmgw-server serve
--help``.

cyclopts draws its errors in a panel wrapped to the terminal, which under systemd or in a
CI log is a box of broken lines no grep finds whole, and guesses the intended word with
difflib, which ranks `node` above `nodes` for `nodse`. Worse, an unknown option beside a
missing required one is reported as the missing one, with a guess taken from the unknown
option: `llmgw-cli keys create --model demo` said "Did you mean --name instead of
--model?", and `llmgw-server serve --nope` that --database-url requires an argument. Here
the unknown word is named first, and the guess is the one real name it begins, else the
name closest by edit distance (a swap of two neighbouring letters is one edit), the same
length winning a tie. What the command line held is shown with every character a
terminal would act on written as a visible escape (``\\x1b``), as Python writes it.

Each program hands its ``App`` ``error_formatter=one_line_usage_errors(PROGRAM)`` and
``error_console=usage_error_console()``, every ``int`` flag ``converter=whole_number_flag``
and every ``float`` flag ``converter=finite_number_flag``: a value that is not a whole
number, or not a finite one, is refused naming the flag, or the variable it came from
(``llmgw-server serve: --agent-connect-burst '2.5': expected a whole number``), where
cyclopts would round it or take ``inf``.

A command line that stops at a group of commands (``llmgw-cli keys``, ``llmgw-server
log``) is a usage error too (``missing_command``), told the same way, where cyclopts would
print the group's help and exit 0.

An error a command finds itself once its command line is parsed (a malformed --anchor, a
database it cannot reach, a port in use) is told the same way by ``print_command_error``:
``llmgw-server log verify: --anchor: an anchor is POSITION:HASH...``, with the exit code
the command chooses. A grep for the program's name finds both kinds.

A reader that stops reading (``llmgw-server log verify | head -1``) ends every program
the same way too: quietly, with exit code 141 (128 + SIGPIPE, as a shell reports a
program the signal stopped, and as ``git log | head`` ends), never a traceback. Each
program's ``main`` runs its command line through ``run_program``, which ends it so when
stdout's reader has gone, and hands its ``App`` ``console=output_console()``, whose closed
output ends the program there too, where rich's own would exit 1.
"""

from __future__ import annotations

import errno
import os
import select
import sys
from collections.abc import Callable, Sequence

from cyclopts import App, CycloptsError, Token
from cyclopts.exceptions import (
    CoercionError,
    MissingArgumentError,
    UnknownCommandError,
    UnknownOptionError,
    UnusedCliTokensError,
)
from rich.console import Console
from rich.text import Text

from app.usage_words import closest, finite_number, shown, whole_number

EXIT_OUTPUT_CLOSED = 141
"""Whoever read the output stopped reading (``| head``): 128 + SIGPIPE, as a shell
reports a program the signal stopped."""


EXIT_USAGE = 2


def run_program(command_line: Callable[[], object]) -> None:
    """Run the program's command line (its ``App``); if its stdout's reader has gone, end
    it with ``EXIT_OUTPUT_CLOSED`` and nothing on stderr. What is still buffered is
    written before the program exits, so a closed pipe is found here, not at exit (where
    Python would print that it could not flush stdout, and exit 120). A broken pipe that
    is not stdout's (a socket's) is the error it is. A command line that stops at a
    group of commands (``missing_command``) is a usage error, told in one line."""
    if isinstance(command_line, App):
        if not sys.argv[1:] or HELP_FLAGS.intersection(sys.argv[1:]):
            load_every_command(command_line)
        missing = missing_command(command_line, sys.argv[1:])
        if missing is not None:
            print_command_error(*missing)
            sys.exit(EXIT_USAGE)
    try:
        try:
            command_line()
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        # What is still buffered for stdout cannot be written either: flushing it at exit
        # would fail again, with a message.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        sys.exit(EXIT_OUTPUT_CLOSED)


HELP_FLAGS = frozenset({"--help", "-h"})


def load_every_command(program: App, loaded: set[int] | None = None) -> None:
    """Import every command registered lazily (``app.command("module:function")``) under
    ``program``: a program imports the module of the command it runs alone, but a help
    page lists each command with its summary, which only the command's module has."""
    loaded = loaded if loaded is not None else set()
    loaded.add(id(program))
    for command in program.resolved_commands().values():
        if id(command) not in loaded:
            load_every_command(command, loaded)


def missing_command(app: App, tokens: Sequence[str]) -> tuple[str, str] | None:
    """Where the command line ``tokens`` stops at a group of commands that does nothing
    by itself (``llmgw-cli keys``, ``llmgw-server log``): the program and group as typed,
    and what is wrong; None for any other command line. cyclopts would print the group's
    help on stdout and exit 0, so ``llmgw-cli keys $ACTION`` with ``$ACTION`` unset would
    look to a script like a command that worked."""
    try:
        chain, apps, unused = app.parse_commands(list(tokens))
    except CycloptsError:
        return None  # told as cyclopts finds it, when the command line is run
    group = apps[-1]
    if unused or group.default_command is not None:
        return None
    where = " ".join((*app.name[:1], *chain))
    commands = ", ".join(_commands(group))
    return where, f"a command is required: {commands}; see {where} --help"


def stdout_reader_gone(*, unknown: bool = True) -> bool:
    """Whether stdout is a pipe (or socket) nobody reads any more: polled, its write end
    reports an error. A program that may wait long without writing (``events --follow`` on
    a quiet log) asks it while it waits, as a write would not tell it until the next one.
    ``unknown``: the answer for a stdout closed or replaced by something with no file
    descriptor; after a broken pipe that is gone, while waiting it is only not known."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError):
        return unknown


class OutputConsole(Console):
    """A rich console whose closed output ends the program as ``run_program`` ends it (exit
    141, quietly), where rich's own exits 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the output's reader has gone")


def output_console() -> Console:
    """cyclopts' ``console`` (``--help``, ``--version``): ``OutputConsole``."""
    return OutputConsole()


class FlagValueRefused(ValueError):
    """A flag's value refused by a converter every program shares; the usage error line
    names the flag, or its variable, and follows it with this message."""


def whole_number_flag(_type: object, tokens: Sequence[Token]) -> int:
    """cyclopts' converter for an ``int`` flag: decimal digits (``usage_words.whole_number``),
    never ``2.5``, ``1e3``, ``0x10`` or ``1_0``."""
    number = whole_number(tokens[0].value)
    if number is None:
        raise FlagValueRefused(f"{tokens[0].value!r}: expected a whole number")
    return number


def finite_number_flag(_type: object, tokens: Sequence[Token]) -> float:
    """cyclopts' converter for a ``float`` flag: a decimal number (``usage_words.
    finite_number``), never ``nan``, ``inf``, ``1e400`` or ``1_0``."""
    number = finite_number(tokens[0].value)
    if number is None:
        raise FlagValueRefused(f"{tokens[0].value!r}: expected a finite number")
    return number


def usage_error_console() -> Console:
    """stderr, never wrapped: the error stays one line however narrow the terminal."""
    return Console(stderr=True, soft_wrap=True, highlight=False, markup=False, emoji=False)


def one_line_usage_errors(
    program: str, *, refusals: tuple[type[Exception], ...] = ()
) -> Callable[[CycloptsError], Text]:
    """cyclopts' ``error_formatter`` for ``program``: its usage errors as one line. A value
    a converter refused with ``FlagValueRefused`` or one of ``refusals`` is told as the
    option's name followed by the refusal's message (``--max must be a whole number, got
    2.5``)."""

    def formatter(error: CycloptsError) -> Text:
        return Text(usage_error_line(program, error, refusals=refusals))

    return formatter


def usage_error_line(
    program: str, error: CycloptsError, *, refusals: tuple[type[Exception], ...] = ()
) -> str:
    """``llmgw-cli keys create: unknown option --model; did you mean --models?``"""
    where = " ".join((program, *(error.command_chain or ())))
    return shown(f"{where}: {_what_is_wrong(error, where, refusals)}")


def print_command_error(command: str, message: str) -> None:
    """``llmgw-server migrate: cannot migrate: ...`` on stderr, written at once; ``command``
    is the program and its subcommands as typed (``llmgw-server log verify``). What the
    message holds (a path, a URL, a database's answer) is ``shown``."""
    print(shown(f"{command}: {message}"), file=sys.stderr, flush=True)


def _what_is_wrong(error: CycloptsError, where: str, refusals: tuple[type[Exception], ...]) -> str:
    if isinstance(error, UnknownCommandError) and error.unused_tokens and error.app:
        token = error.unused_tokens[0]
        if token.startswith("-"):
            # A group without a default command (``llmgw-cli keys``) takes its first word
            # for a command's name, an option given before any command included.
            return _unknown_option(token.split("=", 1)[0], _group_options(error.app), where)
        return _unknown_command(token, _commands(error.app), where)
    if isinstance(error, UnusedCliTokensError) and error.unused_tokens:
        # A word after a command that takes no more words: cyclopts says "Unused Tokens:
        # ['show', 'demo']". Where the command has commands of its own, it is one mistyped.
        token = error.unused_tokens[0]
        commands = _commands(error.app) if error.app else []
        if commands and not token.startswith("-"):
            return _unknown_command(token, commands, where)
        return f'unexpected argument "{token}"; see {where} --help'
    if isinstance(error, UnknownOptionError):
        token = error.token.keyword or error.token.value
        options = [name for argument in error.argument_collection for name in argument.names]
        return _unknown_option(token, options, where)
    if isinstance(error, CoercionError) and isinstance(
        error.__cause__, (FlagValueRefused, *refusals)
    ):
        name = error.token.keyword if error.token and error.token.keyword else None
        return f"{name or (error.argument.name if error.argument else 'a value')} {error.msg}"
    if type(error) is MissingArgumentError and error.argument is not None:
        options = _options(error.app)
        unknown = [
            token.split("=", 1)[0]
            for token in error.unused_tokens or ()
            if token.startswith("-") and token.split("=", 1)[0] not in options
        ]
        if unknown:
            return _unknown_option(unknown[0], options, where)
        name = error.keyword or error.argument.name
        given = error.keyword is not None or any(t.keyword for t in error.argument.tokens)
        return f"{name} needs a value" if given else f"{name} is required"
    return " ".join(str(error).split())


def _unknown_option(token: str, options: Sequence[str], where: str) -> str:
    if token in options:
        # Only a word after ``--`` is an option's name and still unknown: it is an argument
        # there, one more than the command takes.
        return f"{token} comes after --, where every word is an argument; put options before --"
    guess = closest(token, (name for name in options if name.startswith("-")))
    hint = f"did you mean {guess}?" if guess else f"see {where} --help"
    return f"unknown option {token}; {hint}"


def _unknown_command(token: str, commands: Sequence[str], where: str) -> str:
    guess = closest(token, commands)
    hint = f'did you mean "{guess}"?' if guess else f"see {where} --help"
    return f'unknown command "{token}"; {hint}'


def _group_options(app: App) -> list[str]:
    """The options a group takes itself (``--help``, ``--version``), which cyclopts lists
    beside its commands."""
    return [name for name in app if name.startswith("-") and app[name].show] + _options(app)


def _commands(app: App) -> list[str]:
    return [name for name in app if not name.startswith("-") and app[name].show]


def _options(app: App | None) -> list[str]:
    if app is None:
        return []
    try:
        arguments = app.assemble_argument_collection()
    except ValueError:  # a group without a default command has no options of its own
        return []
    return [name for argument in arguments if argument.parse for name in argument.names]
