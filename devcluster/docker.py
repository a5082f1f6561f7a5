"""PostgreSQL in Docker for ``llmgw-dev`` on a machine without the server binaries.

One container and one named volume per state directory (their names carry a hash of its
path), so the next ``dev`` run with the same state directory finds the same log. The port
is published on 127.0.0.1 only and recorded in the state directory; ``stop()`` stops the
container and keeps the volume. Only the ``docker`` command line is used: nothing here
needs a Python Docker client.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

from devcluster.errors import DevDatabaseError
from devcluster.ports import LOOPBACK as HOST
from devcluster.ports import free_port, port_is_free
from devcluster.state_files import read_state_file

IMAGE = "postgres:15"
READY_WITHIN_S = 90.0
DOCKER_TIMEOUT_S = 120


def docker_answers() -> bool:
    """Whether a ``docker`` command exists and its daemon answers."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        result = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def container_name(state_dir: Path) -> str:
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:10]
    return f"llmgw-dev-postgres-{digest}"


def run_arguments(name: str, port: int) -> list[str]:
    """``docker run`` for a new container (trust authentication: it listens on 127.0.0.1
    only, for one developer's cluster)."""
    return [
        "run",
        "--detach",
        "--name",
        name,
        "--env",
        "POSTGRES_HOST_AUTH_METHOD=trust",
        "--publish",
        f"{HOST}:{port}:5432",
        "--volume",
        f"{name}:/var/lib/postgresql/data",
        IMAGE,
    ]


class DockerPostgres:
    def __init__(self, state_dir: Path) -> None:
        self._state_dir = state_dir.resolve()
        self._name = container_name(self._state_dir)
        self._port: int | None = None

    @property
    def state_dir(self) -> Path | None:
        return None  # the log lives in the container: ``docker logs <name>``

    @property
    def name(self) -> str:
        return self._name

    def start(self) -> None:
        self._state_dir.mkdir(parents=True, exist_ok=True)
        if self._exists():
            self._docker("start", self._name)
            self._port = self._published_port()
        else:
            self._port = self._choose_port()
            self._docker(*run_arguments(self._name, self._port))
        (self._state_dir / "docker-port").write_text(f"{self._port}\n")
        self._wait_until_ready()

    def stop(self) -> None:
        if self._exists():
            self._docker("stop", self._name)

    def url(self, database: str = "postgres") -> str:
        if self._port is None:
            raise DevDatabaseError("the PostgreSQL container has not been started")
        return f"postgresql://postgres@{HOST}:{self._port}/{database}"

    def _choose_port(self) -> int:
        recorded = (read_state_file(self._state_dir / "docker-port") or "").strip()
        port = int(recorded) if recorded.isdigit() else 0
        if port and port_is_free(port):
            return port
        return free_port()

    def _exists(self) -> bool:
        return self._docker("container", "inspect", self._name, check=False) == 0

    def _published_port(self) -> int:
        output = self._output("port", self._name, "5432/tcp")
        try:
            return int(output.strip().splitlines()[0].rsplit(":", 1)[1])
        except (IndexError, ValueError) as exc:
            raise DevDatabaseError(
                f"container {self._name} publishes no port for 5432 ({output.strip()!r}); "
                f"remove it (docker rm {self._name}) and run again"
            ) from exc

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + READY_WITHIN_S
        while time.monotonic() < deadline:
            probe = ("exec", self._name, "pg_isready", "-U", "postgres", "-h", "127.0.0.1")
            if self._docker(*probe, check=False) == 0:
                return
            time.sleep(0.5)  # polling a process we do not control; nothing to wait on
        raise DevDatabaseError(
            f"PostgreSQL in container {self._name} was not ready within {READY_WITHIN_S:.0f}s; "
            f"see docker logs {self._name}"
        )

    def _docker(self, *args: str, check: bool = True) -> int:
        result = self._run(args)
        if check and result.returncode != 0:
            raise DevDatabaseError(
                f"docker {' '.join(args[:2])} failed: {result.stderr.strip() or result.stdout}"
            )
        return result.returncode

    def _output(self, *args: str) -> str:
        result = self._run(args)
        if result.returncode != 0:
            raise DevDatabaseError(f"docker {' '.join(args[:2])} failed: {result.stderr.strip()}")
        return result.stdout

    def _run(self, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                ["docker", *args],
                capture_output=True,
                text=True,
                timeout=DOCKER_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DevDatabaseError(f"docker {' '.join(args[:2])} failed: {exc}") from exc
