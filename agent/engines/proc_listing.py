"""Where ``/proc`` is, and the pid of every process it lists.

Stopping an engine looks through every process for its workers (``agent.engines.family``),
and a port check for the processes that hold the port (``agent.engines.port_owner``). Both
take the directory as ``proc``: ``PROC`` on a running agent, where the identity check
(``agent.engines.identity``) reads an engine's environment too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

PROC = Path("/proc")


def process_ids(proc: Path = PROC) -> Iterator[int]:
    """The pid of every process ``proc`` lists now; none if it cannot be read."""
    try:
        names = os.listdir(proc)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)
