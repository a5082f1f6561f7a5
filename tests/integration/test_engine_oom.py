"""An engine the kernel's OOM killer ends is told apart from one killed by hand.

The supervisor runs in a memory cgroup of its own with a small limit (its engine inherits
it), and the engine grows until the kernel's OOM killer ends it. Before, its failure read
only "engine was killed by SIGKILL". Needs a memory cgroup this test may create (root,
cgroup v1's memory controller or cgroup v2 with memory delegated at its root); skipped
otherwise, saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ports import free_port

LIMIT_BYTES = 256 * 2**20
SUPERVISED = r"""
import asyncio, json, sys
from pathlib import Path

from agent.engines import EngineSupervisor, ShardSpec, ShardState

GROWS = (
    "import os\nos.write(1, b'engine started\\n')\nheld = []\n"
    "while True:\n    held.append(bytearray(32 * 2**20))\n"
)


async def main(state_dir: str, port: int) -> None:
    failed = asyncio.Event()
    errors = []

    def changed(change):
        if change.state is ShardState.FAILED:
            errors.append(change.error)
            failed.set()

    supervisor = EngineSupervisor(Path(state_dir), changed, poll_interval_s=0.05)
    spec = ShardSpec(
        replica_id="oom-1", shard_index=0, model="m", argv=(sys.executable, "-c", GROWS), port=port
    )
    await supervisor.start(spec)
    await asyncio.wait_for(failed.wait(), 120)
    await supervisor.shutdown()
    print(json.dumps(errors))


asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


@contextlib.contextmanager
def a_memory_cgroup() -> Iterator[Path]:
    """A new memory cgroup of ``LIMIT_BYTES``: its ``cgroup.procs``."""
    name = f"llmgw-test-{uuid.uuid4().hex[:8]}"
    v1 = Path("/sys/fs/cgroup/memory")
    v2 = Path("/sys/fs/cgroup")
    if (v1 / "memory.limit_in_bytes").exists():
        group, limit_file = v1 / name, "memory.limit_in_bytes"
    elif "memory" in _read(v2 / "cgroup.subtree_control").split():
        group, limit_file = v2 / name, "memory.max"
    else:
        pytest.skip("no memory cgroup controller this test can use")
    try:
        group.mkdir()
        (group / limit_file).write_text(str(LIMIT_BYTES))
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup: {exc}")
    try:
        yield group / "cgroup.procs"
    finally:
        with contextlib.suppress(OSError):
            group.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_an_engine_ended_by_the_oom_killer_says_so(tmp_path: Path) -> None:
    with a_memory_cgroup() as procs:
        # The interpreter joins the cgroup before anything else, so its engine starts in it.
        joined = f"open({str(procs)!r}, 'w').write(str(__import__('os').getpid()))\n"
        finished = subprocess.run(
            [sys.executable, "-c", joined + SUPERVISED, str(tmp_path), str(free_port())],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
            check=False,
        )

    assert finished.returncode == 0, finished.stderr
    [error] = json.loads(finished.stdout.splitlines()[-1])
    assert error.startswith("engine was killed by SIGKILL: the kernel's OOM killer ended it: ")
    assert error.endswith("ran out of memory")
