"""The README's two set-up commands are what the Makefile does: ``make dev`` runs the dev
cluster with the flags given in ``ARGS``, ``make venv check`` builds the tested venv and
runs the checks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def dry_run(*arguments: str) -> str:
    shown = subprocess.run(
        ["make", "-n", "-C", str(ROOT), *arguments],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return shown.stdout


def test_make_dev_passes_args_to_the_dev_cluster() -> None:
    commands = dry_run("dev", "ARGS=--client-port 9080 --replicas 3")

    assert ".venv/bin/llmgw-dev --client-port 9080 --replicas 3" in commands


def test_the_readme_names_every_make_dev_flag_the_program_has() -> None:
    readme = (ROOT / "README.md").read_text()
    setup = readme[readme.index("## Set-up") : readme.index("make venv check")]
    shown = subprocess.run(
        [str(Path(sys.executable).with_name("llmgw-dev")), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    flags = set(re.findall(r"--[a-z][a-z-]+", shown.stdout)) - {"--help", "--version"}

    assert flags, shown.stdout
    assert {flag for flag in flags if flag not in setup} == set()


def test_make_venv_check_installs_the_lock_and_runs_every_check() -> None:
    commands = dry_run("venv", "check")

    # With ../shared/wheels present (CI's clone has it) --find-links comes in between.
    install = next(line for line in commands.splitlines() if "--require-hashes" in line)
    assert "--no-deps" in install
    assert "-r requirements/dev.txt" in commands
    for check in ("ruff check", "ruff format --check", "mypy", "pytest"):
        assert check in commands
