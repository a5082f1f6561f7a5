"""The Rust routers the gateway benchmark compares llmgw with: installed into a venv of
their own, started in front of an engine, their CPU time counted.

* ``vllm-router`` (PyPI ``vllm-router``): ``vllm-router --worker-urls URL --port P``;
* ``sglang-router`` (PyPI ``sglang-router``): ``python -m sglang_router.launch_router
  --worker-urls URL --port P``.

Both get the one engine as their only worker and the cheapest policy, ``round_robin``
(their default, ``cache_aware``, keeps a prefix tree per request), logs at warning, their
Prometheus listener on a free port of its own, and no circuit breaker (their retries stay
on). Both are tokio programs: their
worker threads are one per core unless ``TOKIO_WORKER_THREADS`` says otherwise, which
``threads`` sets (None: their default).

The venv is ``~/.cache/llmgw-bench/routers`` (``LLMGW_BENCH_CACHE`` moves the folder),
created with ``python -m venv`` and filled with pip on first use; the routers are not
dependencies of llmgw, and nothing of theirs is imported here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROUTERS = ("vllm-router", "sglang-router")
PACKAGES = {"vllm-router": "vllm-router", "sglang-router": "sglang-router"}
CACHE_ENV = "LLMGW_BENCH_CACHE"
INSTALL_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 15.0
"""Both routers wait for their connections to drain after SIGTERM (a few seconds)."""


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "llmgw-bench"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _installed(venv: Path, package: str) -> bool:
    python = venv_python(venv)
    if not python.exists():
        return False
    check = [str(python), "-m", "pip", "show", "--quiet", package]
    return subprocess.run(check, capture_output=True).returncode == 0


def ensure_installed(names: list[str], venv: Path) -> dict[str, str]:
    """Install the routers of ``names`` into ``venv`` where missing. Returns, for each
    router that could not be installed, why (the others are ready)."""
    missing = [name for name in names if not _installed(venv, PACKAGES[name])]
    if not missing:
        return {}
    print(f"installing {', '.join(missing)} into {venv} (once)", flush=True)
    failures: dict[str, str] = {}
    if not venv_python(venv).exists():
        created = subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True
        )
        if created.returncode != 0:
            reason = f"python -m venv {venv} failed: {created.stderr.strip()[-300:]}"
            return dict.fromkeys(missing, reason)
    for name in missing:
        command = [str(venv_python(venv)), "-m", "pip", "install", "--quiet", PACKAGES[name]]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            failures[name] = f"pip install {PACKAGES[name]} took over {INSTALL_TIMEOUT_S:.0f} s"
            continue
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1:] or ["no output"]
            failures[name] = f"pip install {PACKAGES[name]} failed: {last[0]}"
    return failures


def command(name: str, venv: Path, worker_url: str, port: int, metrics_port: int) -> list[str]:
    common = ["--worker-urls", worker_url, "--host", "127.0.0.1", "--port", str(port)]
    common += ["--policy", "round_robin", "--prometheus-host", "127.0.0.1"]
    common += ["--prometheus-port", str(metrics_port)]
    # Their circuit breaker would shut the one worker out for the rest of the run after a
    # burst of failed sends (sglang-router did, once, during a 50-connection stream
    # phase), so every later request of the run failed: off. llmgw's ejection has nowhere
    # else to send either.
    common.append("--disable-circuit-breaker")
    if name == "vllm-router":
        return [str(venv / "bin" / "vllm-router"), *common, "--log-level", "warning"]
    if name == "sglang-router":
        launcher = [str(venv_python(venv)), "-m", "sglang_router.launch_router"]
        return [*launcher, *common, "--log-level", "warn"]
    raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")


@dataclass(frozen=True)
class RouterProcess:
    name: str
    process: subprocess.Popen[bytes]
    command: list[str]
    threads: int | None


def start(
    name: str,
    venv: Path,
    worker_url: str,
    port: int,
    metrics_port: int,
    threads: int | None,
    log_path: Path,
) -> RouterProcess:
    argv = command(name, venv, worker_url, port, metrics_port)
    environment = dict(os.environ)
    if threads is not None:
        environment["TOKIO_WORKER_THREADS"] = str(threads)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=environment
        )
    return RouterProcess(name, process, argv, threads)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# -- CPU of a process tree -----------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name, in parentheses, may hold spaces: the fields start after its ")".
    return text.rsplit(")", 1)[1].split()


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and int(fields[1]) == parent:
            found.append(int(entry.name))
    return found


def tree_cpu_s(pid: int) -> float:
    """User + system CPU of ``pid`` (all its threads: ``/proc/<pid>/stat`` sums them),
    of its children that it has waited for, and of every descendant still running."""
    ticks = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        fields = _stat_fields(current)
        if fields is None:
            continue
        # utime, stime, cutime, cstime: fields 14-17 of stat(5), 11-14 after the name.
        ticks += sum(int(value) for value in fields[11:15])
        pending += _children(current)
    return ticks / os.sysconf("SC_CLK_TCK")


def thread_count(pid: int) -> int:
    try:
        return len(list(Path(f"/proc/{pid}/task").iterdir()))
    except FileNotFoundError:
        return 0


def tree_threads(pid: int) -> int:
    """Threads of ``pid`` and of its running descendants."""
    total = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        total += thread_count(current)
        pending += _children(current)
    return total
