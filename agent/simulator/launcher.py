"""Start ``llmgw-sim-engine`` as a real process and wait until it serves.

For tests and local runs of other components::

    with start_simulator("--max-num-seqs", "2") as sim:
        sim.wait_healthy()
        client = openai.OpenAI(base_url=sim.openai_base_url, api_key="unused")

Leaving the ``with`` block stops the process (SIGTERM, then SIGKILL) and reaps it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import httpx

COMMAND = "llmgw-sim-engine"


class SimulatorExited(RuntimeError):
    """The simulator process ended while it was expected to serve."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def simulator_command() -> str:
    beside_python = Path(sys.executable).parent / COMMAND
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which(COMMAND)
    if found is None:
        raise FileNotFoundError(f"{COMMAND} is not installed (pip install -e .)")
    return found


class SimulatorProcess:
    def __init__(
        self,
        process: subprocess.Popen[bytes],
        port: int,
        log_path: Path,
        *,
        remove_log: bool = False,
    ) -> None:
        self.process = process
        self.port = port
        self.log_path = log_path
        self._remove_log = remove_log

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    def stderr_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health_status(self) -> int | None:
        """The status /health answers now, or ``None`` while nothing listens."""
        try:
            return httpx.get(f"{self.base_url}/health", timeout=1.0).status_code
        except httpx.TransportError:
            return None

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SimulatorExited(
                    f"{COMMAND} exited with {self.process.returncode}:\n{self.stderr_text()}"
                )
            if self.health_status() == 200:
                return
            time.sleep(0.05)
        raise TimeoutError(f"{COMMAND} was not healthy within {timeout_s} s:\n{self.stderr_text()}")

    def wait_exit(self, timeout_s: float = 20.0) -> int:
        return self.process.wait(timeout=timeout_s)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._remove_log:
            self.log_path.unlink(missing_ok=True)
        return self.process.returncode

    def __enter__(self) -> SimulatorProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def start_simulator(
    *flags: str,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
) -> SimulatorProcess:
    """Start the simulator with ``flags`` on ``port`` (a free one when omitted). Its
    stderr goes to ``log_path``, or to a temporary file removed when it stops."""
    port = free_port() if port is None else port
    remove_log = log_path is None
    if log_path is None:
        handle, name = tempfile.mkstemp(prefix="llmgw-sim-", suffix=".log")
        os.close(handle)
        log_path = Path(name)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [simulator_command(), "--port", str(port), *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            env={**os.environ, **(env or {})},
        )
    return SimulatorProcess(process, port, log_path, remove_log=remove_log)
