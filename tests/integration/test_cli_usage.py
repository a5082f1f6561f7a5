"""What every operator command promises besides its answer: help with an example, exit codes
that mean something (2 for bad usage, 1 when the API cannot be reached), and shell
completion that a real bash completes with."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.admin_server import LOOPBACK
from tests.support.operator_cli import Operator
from tests.support.ports import free_port

pytestmark = pytest.mark.timeout(120)

COMMANDS = (
    "nodes",
    "node",
    "models",
    "models apply",
    "model",
    "scale",
    "remove",
    "replicas",
    "replica",
    "explain-placement",
    "cordon",
    "uncordon",
    "drain",
    "drain-progress",
    "events",
    "completion",
)


def nobody_listening() -> str:
    return f"http://{LOOPBACK}:{free_port()}"


@pytest.fixture
def operator(tmp_path: Path) -> Operator:
    return Operator(home=tmp_path, admin_url=nobody_listening())


async def test_every_command_has_help_with_an_example(operator: Operator) -> None:
    helps = await asyncio.gather(*(operator.run(*c.split(), "--help") for c in COMMANDS))

    for command, shown in zip(COMMANDS, helps, strict=True):
        assert shown.code == 0, shown.stderr
        example = rf"^\s+(eval \"\$\()?llmgw-cli {command}\b"
        assert re.search(example, shown.stdout, re.MULTILINE), (command, shown.stdout)


async def test_the_top_level_help_says_how_to_get_shell_completion(operator: Operator) -> None:
    shown = await operator.run("--help")

    assert "llmgw-cli --install-completion" in shown.stdout
    assert 'eval "$(llmgw-cli completion bash)"' in " ".join(shown.stdout.split())


@pytest.mark.parametrize(
    "args",
    [
        ("drain",),
        ("drain", "gpu-1", "--replica", "llama-1"),
        ("drain", "--replica", "llama-1", "--grace", "5"),
        ("drain", "gpu-1", "--grace", "0"),
        ("events", "--since", "-1"),
        ("events", "--since", "3", "--last", "2"),
        ("scale", "llama"),
        ("replicas", "--phase", "sleeping"),
        ("nodes", "--output", "yaml"),
        ("node",),
        ("completion", "tcsh"),
    ],
)
async def test_bad_usage_exits_with_2(operator: Operator, args: tuple[str, ...]) -> None:
    result = await operator.run(*args)

    assert result.code == 2, (result.stdout, result.stderr)


@pytest.mark.parametrize(
    "args",
    [
        ("nodes",),
        ("model", "llama"),
        ("replicas", "--model", "llama"),
        ("events", "--follow"),
        ("drain", "gpu-1", "--wait"),
    ],
)
async def test_without_a_server_every_command_fails_saying_where_it_looked(
    operator: Operator, args: tuple[str, ...]
) -> None:
    result = await operator.run(*args)

    assert result.code == 1
    assert f"cannot reach the admin API at {operator.admin_url}: connection refused" in (
        result.stderr
    )
    assert result.stdout == ""


def complete(script: str, line: str) -> list[str]:
    """What bash offers for ``line`` with ``script`` loaded (the word being typed last)."""
    words = line.split(" ")
    program = f"""
{script}
COMP_WORDS=({" ".join(repr(w) for w in words)})
COMP_CWORD={len(words) - 1}
COMP_LINE={line!r}
COMP_POINT={len(line)}
_llmgw_cli
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return sorted(filter(None, done.stdout.splitlines()))


async def test_bash_completes_commands_and_flags_from_the_printed_script(
    operator: Operator,
) -> None:
    printed = await operator.run("completion", "bash")

    assert printed.code == 0, printed.stderr
    assert complete(printed.stdout, "llmgw-cli dra") == ["drain", "drain-cancel", "drain-progress"]
    assert complete(printed.stdout, "llmgw-cli events --fo") == ["--follow"]


async def test_install_completion_writes_the_script_where_bash_loads_it(
    operator: Operator,
) -> None:
    installed_to = operator.home / ".local" / "share" / "bash-completion" / "completions"

    result = await operator.run("--install-completion", "--shell", "bash")

    assert result.code == 0, result.stderr
    [script] = installed_to.iterdir()
    assert "_llmgw_cli" in script.read_text()
