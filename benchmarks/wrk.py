"""wrk as the gateway benchmark's closed-loop load: C connections, each sending the next
request as soon as its answer is in, from one C program that costs far less CPU per
request than the aiohttp client (the benchmark records both: ``client_cpu_ms_per_1000``).

``benchmarks/wrk_post.lua`` makes wrk POST a body read from a file and print its figures
as one JSON line. wrk is the distribution's package (``apt-get install wrk``): installed
here when missing and this process may (root), else the run says so and falls back to
the aiohttp client.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "wrk_post.lua"
MARK = "LLMGW_WRK "
INSTALL_HINT = "apt-get install -y wrk (Debian/Ubuntu)"
TIMEOUT_S = 10
"""wrk's per-request timeout; its default, 2 s, counts a slow answer as an error."""


def ensure_wrk() -> str | None:
    """wrk's path, installing the distribution's package when missing and allowed; None
    when there is none."""
    found = shutil.which("wrk")
    if found or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return found
    print("installing wrk: apt-get install -y wrk", flush=True)
    install = ["apt-get", "install", "-y", "wrk"]
    if subprocess.run(install, capture_output=True, timeout=600).returncode != 0:
        # The package lists may be missing or stale: once more after refreshing them.
        subprocess.run(["apt-get", "update"], capture_output=True, timeout=600)
        subprocess.run(install, capture_output=True, timeout=600)
    return shutil.which("wrk")


@dataclass(frozen=True)
class WrkRun:
    requests: int
    errors: int
    error_kinds: dict[str, int]
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_s: float
    """wrk's own user + system CPU (its rusage when reaped)."""


def run_wrk(
    wrk: str,
    url: str,
    headers: dict[str, str],
    body_path: Path,
    connections: int,
    seconds: float,
    threads: int,
) -> WrkRun:
    """Blocks for ``seconds``: call it from a thread."""
    command = [wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s"]
    command += [f"--timeout={TIMEOUT_S}s", "-s", str(SCRIPT)]
    for name, value in headers.items():
        command += ["-H", f"{name}: {value}"]
    command.append(url)
    environment = dict(os.environ, LLMGW_WRK_BODY=str(body_path))
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=environment,
    )
    assert process.stdout is not None
    output = process.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in output.splitlines() if line.startswith(MARK)]
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}): {output[-500:]}")
    figures = json.loads(lines[-1][len(MARK) :])
    kinds = {
        kind: int(figures[kind])
        for kind in ("connect", "read", "write", "status", "timeout")
        if figures[kind]
    }
    return WrkRun(
        # wrk counts an answer that is not 2xx as a request and as a status error.
        requests=int(figures["requests"]) - int(figures["status"]),
        errors=sum(kinds.values()),
        error_kinds={f"wrk {kind}": count for kind, count in kinds.items()},
        seconds=figures["duration_us"] / 1e6,
        p50_ms=figures["p50_us"] / 1000,
        p99_ms=figures["p99_us"] / 1000,
        cpu_s=usage.ru_utime + usage.ru_stime,
    )
