"""The files ``llmgw-dev`` keeps in its state directory are read only as small regular
files: a FIFO put in place of one is refused at once, naming it, rather than waited on for
ever, and a huge one is refused unread rather than flooding the cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

READERS = {
    # What each reads the state file with, run in a child so that a reader waiting on the
    # FIFO fails the test at the timeout rather than hanging the suite.
    "admin-token": "from devcluster.database import secret; secret(path)",
    "engine-ports": "from devcluster.ports import claim_engine_ports; claim_engine_ports(state)",
    "postgres/port": (
        "from devcluster.postgres import LocalPostgres; "
        "LocalPostgres(state / 'postgres')._recorded_port()"
    ),
}
CHILD = """
import sys
from pathlib import Path
from devcluster.errors import DevError
state = Path(sys.argv[1]); path = state / sys.argv[2]
try:
    {reader}
except DevError as exc:
    print(exc)
else:
    print("read")
"""
REFUSED_WITHIN_S = 15


@pytest.mark.parametrize("what", ["fifo", "huge"])
@pytest.mark.parametrize("name", sorted(READERS))
def test_a_state_file_that_is_a_fifo_or_huge_is_refused_at_once_naming_it(
    tmp_path: Path, name: str, what: str
) -> None:
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    if what == "fifo":
        os.mkfifo(path)
    else:
        with path.open("wb") as file:
            file.truncate(1 << 30)  # sparse: a gigabyte on no disk

    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(reader=READERS[name]), str(tmp_path), name],
        capture_output=True,
        text=True,
        timeout=REFUSED_WITHIN_S,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    problem = "named pipe (FIFO)" if what == "fifo" else "1,073,741,824 bytes, over the 4 KiB"
    assert done.stdout.startswith(f"cannot read {path}: "), done.stdout
    assert problem in done.stdout
    assert done.stdout.endswith("; remove it and start again\n")
