"""``llmgw-cli bench`` as an operator runs it: the installed console script, with only the
llmgw settings a test gives, and its report read back."""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass
from pathlib import Path

import msgspec

from cli.bench.report import BenchReport
from tests.support.cluster import CLI
from tests.support.operator_cli import finished

CLI_TIMEOUT_S = 150


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str
    report_dir: Path

    @property
    def report(self) -> BenchReport:
        return msgspec.json.decode((self.report_dir / "bench.json").read_bytes(), type=BenchReport)


async def bench(tmp_path: Path, *args: str, environment: dict[str, str] | None = None) -> Result:
    """``llmgw-cli bench ARGS`` with its report in a directory of its own under ``tmp_path``."""
    report_dir = tmp_path / f"report-{random.getrandbits(32):08x}"
    code, stdout, stderr = await llmgw_cli(
        tmp_path, "bench", *args, "--report-dir", str(report_dir), environment=environment
    )
    return Result(code, stdout, stderr, report_dir)


async def llmgw_cli(
    home: Path, *args: str, environment: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[int, str, str]:
    """The installed ``llmgw-cli`` with only the llmgw settings given, in ``cwd`` (else
    ``home``); its exit code, stdout and stderr."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("LLMGW_") and key not in ("XDG_CONFIG_HOME", "XDG_STATE_HOME")
    }
    process = await asyncio.create_subprocess_exec(
        CLI,
        *args,
        cwd=cwd or home,
        env={**env, "HOME": str(home), "COLUMNS": "200", **(environment or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return await finished(process, CLI_TIMEOUT_S)
