"""Every program says which llmgw it is: ``--version`` prints the installed package's
version, the one an agent reports in its hello."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAMS = ("llmgw-cli", "llmgw-server", "llmgw-agent", "llmgw-dev")


@pytest.mark.parametrize("program", PROGRAMS)
def test_version_is_the_installed_package_s(program: str) -> None:
    executable = Path(sys.executable).with_name(program)

    shown = subprocess.run(
        [executable, "--version"], capture_output=True, text=True, timeout=60, check=False
    )

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == importlib.metadata.version("llmgw")
