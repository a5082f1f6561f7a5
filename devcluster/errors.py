"""The dev cluster's exceptions: each message says what went wrong and what to do.

::

    DevError                   the cluster cannot start, or stopped by itself
    ├── StateDirInUse          another running ``llmgw-dev`` holds the state directory
    ├── DevDatabaseError       PostgreSQL could not be found, prepared, started or stopped
    ├── EnginePortsUnavailable no block of engine ports is free on this machine
    ├── CertificatesFailed     ``llmgw-cli cert`` could not issue a certificate
    ├── NotReady               a condition was not met in time
    └── ChildExited            a process the cluster started exited by itself
"""

from __future__ import annotations

from pathlib import Path


class DevError(Exception):
    """The cluster cannot start or stopped by itself; the message says what to do."""


class StateDirInUse(DevError):
    """Another running ``llmgw-dev`` holds the state directory."""


class DevDatabaseError(DevError):
    """The local cluster could not be found, prepared, started or stopped."""


class EnginePortsUnavailable(DevError):
    """No block of engine ports is free on this machine."""


class CertificatesFailed(DevError):
    """A ``llmgw-cli cert`` command failed; the message carries its output."""


class NotReady(DevError):
    """A condition was not met within its deadline."""


class ChildExited(DevError):
    """A process started here exited while it should have been running."""

    def __init__(self, name: str, returncode: int | None, log_path: Path) -> None:
        super().__init__(f"{name} exited with code {returncode}; see {log_path}")
        self.name = name
        self.returncode = returncode
        self.log_path = log_path
