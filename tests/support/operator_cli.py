"""The installed ``llmgw-cli`` run as a subprocess, the way an operator runs it: from a
scratch home, with only the connection settings a test gives it (no llmgw setting of this
process leaks in). ``Operator`` also holds the admin API's URL and a token, for tests of an
admin API served in the test's event loop (``live_admin_api``) over a real PostgreSQL
store."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import secrets
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest_asyncio
from litestar.types import ASGIApp

from app.store.postgres import PostgresEventStore
from tests.support.admin_server import serving_admin

OPERATOR = "alice"
TOKEN = secrets.token_hex(16)
CLI_TIMEOUT_S = 60.0


def installed(script: str) -> str:
    beside_python = Path(sys.executable).parent / script
    found = str(beside_python) if beside_python.exists() else shutil.which(script)
    assert found, f"{script} is not installed (pip install -e .)"
    return found


def clean_environment(**settings: str) -> dict[str, str]:
    """This process's environment without any llmgw setting, plus ``settings``."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("LLMGW_") and key != "XDG_CONFIG_HOME"
    } | settings


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        assert self.code == 0, f"exit {self.code}: {self.stderr}"
        return json.loads(self.stdout)


def cli_environment(home: Path, settings: Mapping[str, str]) -> dict[str, str]:
    """What ``llmgw-cli`` runs with: ``home`` as its home, a wide terminal, ``settings``."""
    return clean_environment(HOME=str(home), COLUMNS="200", **settings)


async def start_cli(
    *args: str, home: Path, settings: Mapping[str, str]
) -> asyncio.subprocess.Process:
    """``llmgw-cli args...`` running in ``home``, its output piped."""
    return await asyncio.create_subprocess_exec(
        installed("llmgw-cli"),
        *args,
        cwd=home,
        env=cli_environment(home, settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def run_cli(*args: str, home: Path, settings: Mapping[str, str]) -> Result:
    """``llmgw-cli args...`` run to its end (killed if it takes over a minute)."""
    process = await start_cli(*args, home=home, settings=settings)
    return Result(*await finished(process, CLI_TIMEOUT_S))


async def finished(process: asyncio.subprocess.Process, within_s: float) -> tuple[int, str, str]:
    """``process`` run to its end, killed if it takes longer than ``within_s``: its exit
    code, stdout and stderr."""
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), within_s)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


@dataclass(frozen=True)
class Operator:
    """Runs ``llmgw-cli`` from a scratch home with the admin API's URL and the token."""

    home: Path
    admin_url: str
    token: str = TOKEN

    def settings(self, **extra: str) -> dict[str, str]:
        return {"LLMGW_ADMIN_URL": self.admin_url, "LLMGW_ADMIN_TOKEN": self.token, **extra}

    async def run(self, *args: str, **extra_env: str) -> Result:
        return await run_cli(*args, home=self.home, settings=self.settings(**extra_env))

    async def start(self, *args: str, **extra_env: str) -> asyncio.subprocess.Process:
        """``llmgw-cli args...`` running, its output piped (for commands that keep going)."""
        return await start_cli(*args, home=self.home, settings=self.settings(**extra_env))


class OnTerminal:
    """``llmgw-cli`` with a terminal for its output (a pseudo-terminal the test reads), as
    an operator at a shell sees it."""

    def __init__(self, process: subprocess.Popen[bytes], terminal: int) -> None:
        self._process = process
        self._terminal = terminal
        self._output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, operator: Operator, *args: str) -> OnTerminal:
        terminal, screen = pty.openpty()
        process = subprocess.Popen(
            [installed("llmgw-cli"), *args],
            cwd=operator.home,
            env=cli_environment(operator.home, operator.settings(TERM="xterm-256color")),
            stdin=subprocess.DEVNULL,
            stdout=screen,
            stderr=screen,
        )
        os.close(screen)
        return cls(process, terminal)

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._terminal, 65536)
            except OSError:  # EIO: the process closed its end
                return
            if not chunk:
                return
            self._output.extend(chunk)

    def text(self) -> str:
        """Everything written so far, without terminal control sequences."""
        return ANSI_CONTROL.sub("", self.raw())

    def raw(self) -> str:
        """Everything written so far, as the terminal received it."""
        return self._output.decode(errors="replace")

    async def exit_code(self) -> int:
        code = await asyncio.to_thread(self._process.wait, CLI_TIMEOUT_S)
        await asyncio.to_thread(self._reader.join, CLI_TIMEOUT_S)
        os.close(self._terminal)
        return code

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


ANSI_CONTROL = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07|[()][A-Z0-9])")


@asynccontextmanager
async def live_admin_api(
    store: PostgresEventStore,
    port: int | None = None,
    wrap: Callable[[ASGIApp], ASGIApp] | None = None,
) -> AsyncIterator[str]:
    """The admin API over ``store``, taking ``TOKEN`` as ``OPERATOR``, until the block ends
    (behind ``wrap``, if given); its URL."""
    async with serving_admin(store, tokens={TOKEN: OPERATOR}, port=port, wrap=wrap) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session")
async def operator(pg_store: PostgresEventStore, tmp_path: Path) -> AsyncIterator[Operator]:
    """An operator running ``llmgw-cli`` against a live admin API over the test's store."""
    async with live_admin_api(pg_store) as url:
        yield Operator(home=tmp_path, admin_url=url)
