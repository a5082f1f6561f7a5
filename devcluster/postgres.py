"""A PostgreSQL cluster run from the local server binaries, for tests and development.

``LocalPostgres()`` is a throwaway cluster in a fresh temporary directory, removed by
``close()`` (or at interpreter exit); ``LocalPostgres(state_dir)`` is persistent: the
cluster in ``state_dir`` is reused, and so is the port recorded there while it is free.

A state directory holds ``data/`` (the cluster), ``socket/`` (its Unix socket),
``postgres.log`` and ``port``. ``initdb`` refuses to run as root, so when this process is
root the state directory is handed to the ``postgres`` system user and every binary runs
through ``runuser -u postgres --``.

Every failure is a ``DevDatabaseError`` whose message says what to do about it. Tests and
benchmarks start their throwaway PostgreSQL with it too.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from devcluster.errors import DevDatabaseError
from devcluster.ports import LOOPBACK as HOST
from devcluster.ports import free_port, port_is_free
from devcluster.state_files import read_state_file

SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
INSTALL_HINT = "install PostgreSQL (apt-get install postgresql) or set LLMGW_DATABASE_URL"
SYSTEM_USER = "postgres"
SUPERUSER = "postgres"
START_TIMEOUT_S = 60
LOG_TAIL_LINES = 25
# Unix sockets live in sockaddr_un.sun_path: 108 bytes with the terminating NUL.
MAX_SOCKET_PATH = 107
POSTMASTER_PID_BYTES = 64 * 1024
"""postmaster.pid is eight short lines; a file far past this is not PostgreSQL's."""
NON_DURABLE_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def find_bindir() -> Path:
    """Where ``initdb``, ``pg_ctl`` and ``postgres`` are: ``LLMGW_PG_BINDIR``, else
    ``pg_config --bindir``, else the newest ``/usr/lib/postgresql/*/bin``."""
    configured = os.environ.get("LLMGW_PG_BINDIR")
    if configured:
        if _has_server_binaries(Path(configured)):
            return Path(configured)
        raise DevDatabaseError(
            f"LLMGW_PG_BINDIR={configured} lacks {', '.join(SERVER_BINARIES)}; {INSTALL_HINT}"
        )
    for candidate in (_pg_config_bindir(), *_debian_bindirs()):
        if candidate is not None and _has_server_binaries(candidate):
            return candidate
    raise DevDatabaseError(f"PostgreSQL server binaries not found; {INSTALL_HINT}")


def _has_server_binaries(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in SERVER_BINARIES)


def _pg_config_bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    result = subprocess.run(
        [pg_config, "--bindir"], capture_output=True, text=True, check=False, timeout=30
    )
    return Path(result.stdout.strip()) if result.returncode == 0 else None


def _debian_bindirs() -> list[Path]:
    def major_version(bindir: Path) -> float:
        try:
            return float(bindir.parent.name)
        except ValueError:
            return -1.0

    return sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=major_version, reverse=True)


class LocalPostgres:
    """One cluster on 127.0.0.1, trust authentication, superuser ``postgres``.

    ``durable=False`` turns off fsync, synchronous commit and full-page writes: fast, and
    safe only for data nobody needs after a crash (tests). ``port`` pins the port.
    ``settings`` are more server settings, given on its command line (they win over
    ``durable``'s and over the configuration files).
    """

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        durable: bool = True,
        port: int | None = None,
        bindir: Path | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self._throwaway = state_dir is None
        self._state_dir = state_dir.resolve() if state_dir is not None else None
        self._durable = durable
        self._requested_port = port
        self._port: int | None = None
        self._bindir = bindir
        self._as_system_user = os.geteuid() == 0
        self._settings = dict(settings or {})

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Create the cluster if there is none, then start it unless it already runs."""
        if self._bindir is None:
            self._bindir = find_bindir()
        state_dir = self._prepare_state_dir()
        if not (state_dir / "data" / "PG_VERSION").exists():
            self._initdb()
        if self.is_running():
            self._port = self._running_port()
            return
        self._start_server()

    def stop(self) -> None:
        """Fast shutdown (open sessions are ended); the files stay."""
        if self.is_running():
            self._run("pg_ctl", "stop", "-D", str(self._data_dir), "-m", "fast", "-w")

    def restart(self) -> None:
        """Stop, then start again on the same port."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop; a throwaway cluster's files are removed too."""
        try:
            self.stop()
        finally:
            if self._throwaway and self._state_dir is not None:
                shutil.rmtree(self._state_dir, ignore_errors=True)
                self._state_dir = None
                self._port = None
                atexit.unregister(self.close)

    def is_running(self) -> bool:
        if self._state_dir is None or not self._data_dir.exists():
            return False
        return self._run("pg_ctl", "status", "-D", str(self._data_dir), check=False) == 0

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- addresses ----------------------------------------------------------------------------

    @property
    def state_dir(self) -> Path | None:
        """Where the cluster, its socket and ``postgres.log`` are (None until started)."""
        return self._state_dir

    @property
    def port(self) -> int:
        if self._port is None:
            raise DevDatabaseError("the local PostgreSQL cluster has not been started")
        return self._port

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@{HOST}:{self.port}/{database}"

    def sqlalchemy_url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://{SUPERUSER}@{HOST}:{self.port}/{database}"

    # -- steps --------------------------------------------------------------------------------

    @property
    def _data_dir(self) -> Path:
        assert self._state_dir is not None, "state dir is prepared by start()"
        return self._state_dir / "data"

    @property
    def _log_file(self) -> Path:
        assert self._state_dir is not None, "state dir is prepared by start()"
        return self._state_dir / "postgres.log"

    @property
    def _port_file(self) -> Path:
        assert self._state_dir is not None, "state dir is prepared by start()"
        return self._state_dir / "port"

    def _prepare_state_dir(self) -> Path:
        if self._state_dir is None:
            self._state_dir = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
            atexit.register(self.close)
        socket_dir = self._state_dir / "socket"
        socket_dir.mkdir(parents=True, exist_ok=True)
        if self._as_system_user:
            for path in (self._state_dir, socket_dir):
                _hand_to_system_user(path)
            if self._run("test", "-w", str(socket_dir), check=False) != 0:
                raise DevDatabaseError(
                    f"the {SYSTEM_USER} user cannot write to {socket_dir}: every directory "
                    "above it must be traversable by that user (a state dir under /tmp is)"
                )
        return self._state_dir

    def _initdb(self) -> None:
        args = ["initdb", "-D", str(self._data_dir), "-U", SUPERUSER, "-A", "trust"]
        args += ["-E", "UTF8", "--locale=C"]
        if self._throwaway or not self._durable:
            args.append("--no-sync")
        self._run(*args)

    def _start_server(self) -> None:
        port, pinned = self._choose_port()
        for _attempt in range(3):
            log_offset = self._log_file.stat().st_size if self._log_file.exists() else 0
            returncode = self._run(*self._pg_ctl_start(port), check=False)
            if returncode == 0:
                self._port = port
                self._port_file.write_text(f"{port}\n")
                return
            log = self._log_since(log_offset)
            if pinned or "could not bind" not in log:
                raise DevDatabaseError(
                    f"PostgreSQL did not start on {HOST}:{port} "
                    f"(log {self._log_file}):\n{_tail(log)}"
                )
            port = free_port()  # another process took the port between probing and binding
        raise DevDatabaseError(f"PostgreSQL found no free port (log {self._log_file})")

    def _choose_port(self) -> tuple[int, bool]:
        """The port to start on, and whether it is pinned (no other port will do)."""
        if self._requested_port is not None:
            return self._requested_port, True
        if self._port is not None:
            return self._port, True
        recorded = self._recorded_port()
        if recorded is not None and port_is_free(recorded):
            return recorded, False
        return free_port(), False

    def _recorded_port(self) -> int | None:
        try:
            return int(read_state_file(self._port_file) or "")
        except ValueError:
            return None

    def _running_port(self) -> int:
        # postmaster.pid: pid, data dir, start time, port, socket dir, listen address, ...
        pid_file = self._data_dir / "postmaster.pid"
        lines = (read_state_file(pid_file, POSTMASTER_PID_BYTES) or "").splitlines()
        if len(lines) < 4 or not lines[3].strip().isdigit():
            raise DevDatabaseError(f"PostgreSQL in {self._data_dir} runs but names no port yet")
        return int(lines[3])

    def _pg_ctl_start(self, port: int) -> list[str]:
        assert self._state_dir is not None, "state dir is prepared by start()"
        socket_dir = self._state_dir / "socket"
        socket_path = socket_dir / f".s.PGSQL.{port}"
        if len(str(socket_path)) > MAX_SOCKET_PATH:
            raise DevDatabaseError(f"socket path {socket_path} is too long; use a shorter dir")
        settings = {
            "listen_addresses": HOST,
            "port": str(port),
            "unix_socket_directories": str(socket_dir),
            "max_connections": "300",
        }
        if not self._durable:
            settings |= NON_DURABLE_SETTINGS
        settings |= self._settings
        # pg_ctl hands -o to /bin/sh, so every value is quoted for the shell.
        options = " ".join(f"-c {shlex.quote(f'{key}={value}')}" for key, value in settings.items())
        return [
            "pg_ctl", "start", "-D", str(self._data_dir), "-l", str(self._log_file),
            "-w", "-t", str(START_TIMEOUT_S), "-o", options,
        ]  # fmt: skip

    def _log_since(self, offset: int) -> str:
        try:
            with self._log_file.open("rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _run(self, program: str, *args: str, check: bool = True) -> int:
        """Run a PostgreSQL binary (or ``test``) as the user that owns the cluster."""
        if program in SERVER_BINARIES:
            if self._bindir is None:
                self._bindir = find_bindir()
            program = str(self._bindir / program)
        command = [program, *args]
        if self._as_system_user:
            command = ["runuser", "-u", SYSTEM_USER, "--", *command]
        result = subprocess.run(
            command,
            cwd=self._state_dir,
            capture_output=True,
            text=True,
            check=False,
            timeout=START_TIMEOUT_S * 2,
        )
        if check and result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise DevDatabaseError(f"{shlex.join(command)} failed:\n{_tail(output)}")
        return result.returncode


def _hand_to_system_user(path: Path) -> None:
    try:
        account = pwd.getpwnam(SYSTEM_USER)
    except KeyError as exc:
        raise DevDatabaseError(
            f"running as root needs a {SYSTEM_USER!r} system user to own the cluster; "
            f"{INSTALL_HINT}"
        ) from exc
    os.chown(path, account.pw_uid, account.pw_gid)


def _tail(text: str) -> str:
    return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])
