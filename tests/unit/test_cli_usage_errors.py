"""A mistyped llmgw-cli command line: exit 2 and one line that names the unknown word and
the real one, however narrow the terminal."""

from __future__ import annotations

import os
import subprocess

import pytest

from app.usage_words import closest
from devcluster.processes import program

CLI = program("llmgw-cli")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["nodse"], 'llmgw-cli: unknown command "nodse"; did you mean "nodes"?'),
        (["replcias"], 'llmgw-cli: unknown command "replcias"; did you mean "replicas"?'),
        (["drain-p"], 'llmgw-cli: unknown command "drain-p"; did you mean "drain-progress"?'),
        (["keys", "creat"], 'llmgw-cli keys: unknown command "creat"; did you mean "create"?'),
        (["frobnicate"], 'llmgw-cli: unknown command "frobnicate"; see llmgw-cli --help'),
        # Beside the missing --name: the unknown option is what the operator got wrong.
        (
            ["keys", "create", "--model", "demo"],
            "llmgw-cli keys create: unknown option --model; did you mean --models?",
        ),
        (
            ["keys", "create", "--name", "ci", "--models", "demo", "--rpmm", "3"],
            "llmgw-cli keys create: unknown option --rpmm; did you mean --rpm?",
        ),
        (["keys", "create", "--models", "demo"], "llmgw-cli keys create: --name is required"),
        (
            ["keys", "create", "--models", "demo", "--name"],
            "llmgw-cli keys create: --name needs a value",
        ),
        (["node"], "llmgw-cli node: NODE_ID is required"),
        # A word after a command that takes none: a subcommand mistyped, or one too many.
        (
            ["models", "show", "demo"],
            'llmgw-cli models: unknown command "show"; see llmgw-cli models --help',
        ),
        (
            ["models", "aply", "demo.yaml"],
            'llmgw-cli models: unknown command "aply"; did you mean "apply"?',
        ),
        (
            ["model", "demo", "extra"],
            'llmgw-cli model: unexpected argument "extra"; see llmgw-cli model --help',
        ),
        # An option given to a group, before any of its commands, is an unknown option.
        (
            ["keys", "--output", "json"],
            "llmgw-cli keys: unknown option --output; see llmgw-cli keys --help",
        ),
        (
            ["keys", "--output=json"],
            "llmgw-cli keys: unknown option --output; see llmgw-cli keys --help",
        ),
        (["--output", "json"], "llmgw-cli: unknown option --output; see llmgw-cli --help"),
        (["--verison"], "llmgw-cli: unknown option --verison; did you mean --version?"),
        # After ``--`` an option's name is one argument too many, not a misspelling of itself.
        (
            ["cert", "node", "--", "gpu-07", "--dir", "ca"],
            "llmgw-cli cert node: --dir comes after --, where every word is an argument; put "
            "options before --",
        ),
    ],
)
def test_a_mistyped_command_line_is_one_line_and_exit_2(argv: list[str], line: str) -> None:
    environment = os.environ | {"COLUMNS": "40", "TERM": "dumb"}
    done = subprocess.run(
        [CLI, *argv], capture_output=True, text=True, env=environment, timeout=60, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")


def test_the_guess_is_the_real_name_fewest_edits_away() -> None:
    commands = ["nodes", "node", "models", "model", "replicas", "replica"]
    assert closest("nodse", commands) == "nodes"  # two letters swapped: one edit
    assert closest("nod", commands) == "node"
    assert closest("modle", commands) == "model"
    assert closest("relpica", commands) == "replica"
    assert closest("zzz", commands) is None
