"""Every llmgw command line README.md and docs/*.md show in a code block names a command
the program has, with options that command takes: an operator copies them as printed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from cyclopts import App

from agent.main import app as agent_app
from app.main import app as server_app
from cli.main import app as cli_app
from devcluster.main import app as dev_app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = {
    "llmgw-cli": cli_app,
    "llmgw-server": server_app,
    "llmgw-agent": agent_app,
    "llmgw-dev": dev_app,
}
BLOCK = re.compile(r"^```[a-z]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
# A command line: the program at its start (after a prompt, a path, `docker compose run
# ...` or `VAR=value`s), up to a comment, a pipe or the end of a shell list.
COMMAND = re.compile(
    r"(?:^|[\s/(])(?P<program>llmgw-(?:cli|server|agent|dev))(?P<words>(?:[ \t]+[^\s#|;&)`]+)*)"
)
PRINTED = re.compile(r"\s*llmgw-[a-z]+( [a-z-]+)*: ")
ALWAYS = {"--help", "-h", "--version"}


def command_lines() -> Iterator[tuple[str, str, list[str]]]:
    """(where, program, words) of every command line in a code block. Left out: a line
    followed by the usage error it demonstrates (``PROGRAM ...: unknown option``), what a
    program prints (``PROGRAM COMMAND: ...``), a diagram, and quoted words (a value)."""
    for page in PAGES:
        for block in BLOCK.finditer(page.read_text()):
            lines = re.sub(r"\\\n\s*", " ", block.group(1)).splitlines()
            for n, line in enumerate(lines):
                shown_next = lines[n + 1] if n + 1 < len(lines) else ""
                if "unknown option" in shown_next or PRINTED.match(line) or "──" in line:
                    continue
                unquoted = re.sub(r"\"[^\"]*\"|'[^']*'", "VALUE", line.removeprefix("$ "))
                for found in COMMAND.finditer(unquoted):
                    where = f"{page.relative_to(ROOT)}: {line.strip()}"
                    yield where, found["program"], found["words"].split()


def resolved(app: App, words: list[str]) -> tuple[App, list[str], list[str]]:
    """The (sub)command ``words`` name, the words naming it and the rest."""
    path: list[str] = []
    for word in words:
        if word.startswith("-") or word not in app:
            break
        app = app[word]
        path.append(word)
    return app, path, words[len(path) :]


def options_of(app: App) -> set[str]:
    return {name for argument in app.assemble_argument_collection() for name in argument.names}


LINES = list(command_lines())


def test_the_pages_show_commands_to_check() -> None:
    assert len(LINES) > 50
    assert any(program == "llmgw-server" for _, program, _ in LINES)


@pytest.mark.parametrize(("where", "program", "words"), LINES, ids=[w for w, _, _ in LINES])
def test_a_command_shown_exists_with_the_options_it_is_shown_with(
    where: str, program: str, words: list[str]
) -> None:
    app, path, rest = resolved(PROGRAMS[program], words)
    if app.default_command is None:
        # A group: only its own --help, or a command of it.
        assert not rest or rest[0] in ALWAYS or rest[0] == "...", f"{where}: no command {rest[0]}"
        return
    known = options_of(app) | ALWAYS
    shown = {word.split("=")[0] for word in rest if re.fullmatch(r"--?[a-z][a-z0-9-]*(=.*)?", word)}
    assert sorted(shown - known) == [], f"{where}: {program} {' '.join(path)}"
