"""``benchmarks/codepaths.py`` reads what every traced process called during a phase. The
site hook (``benchmarks/codepaths_site/sitecustomize.py``) writes those calls while the
process runs, whether or not it calls anything again, with a mark saying up to when: a
process SIGKILLed moments after a phase ends (as the scenario's cluster is reaped) does
not take its last calls with it. The report reads past those marks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.codepaths import phase_paths
from tests.support.waiting import wait_until_blocking

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "benchmarks" / "codepaths_site"
PROBE = """
import sys

source = "def inner():\\n    return 1\\n\\n\\ndef outer():\\n    return inner()\\n"
namespace = {}
exec(compile(source, sys.argv[1], "exec"), namespace)
namespace["outer"]()
print("called", flush=True)
sys.stdin.read()
"""
"""Calls ``outer``, which calls ``inner``, both compiled under a name inside a traced
package, then waits, calling nothing, until its standard input closes."""


def _records(path: Path) -> list[dict[str, object]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def test_a_call_is_on_file_while_the_process_that_made_it_calls_nothing_more(
    tmp_path: Path,
) -> None:
    named_in_wire = ROOT / "wire" / "codepaths_probe.py"  # a name only: no file is made
    environment = os.environ | {
        "CODEPATHS_DIR": str(tmp_path),
        "CODEPATHS_ROOT": str(ROOT),
        "PYTHONPATH": os.pathsep.join([str(SITE), str(ROOT)]),
    }
    process = subprocess.Popen(
        [sys.executable, "-c", PROBE, str(named_in_wire)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=environment,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"called\n"
        called_by = time.time()
        records = tmp_path / f"{process.pid}.jsonl"
        call = {
            "caller": ["wire/codepaths_probe.py", "outer"],
            "callee": ["wire/codepaths_probe.py", "inner"],
        }

        def on_file() -> bool:
            written = _records(records)
            return any({k: r.get(k) for k in call} == call for r in written) and any(
                isinstance(f := r.get("flushed"), float) and f >= called_by for r in written
            )

        wait_until_blocking(
            on_file, within_s=5.0, what="outer's call of inner on file, marked flushed"
        )
    finally:
        process.kill()
        process.wait()


def test_a_phase_path_is_read_past_the_flushed_marks(tmp_path: Path) -> None:
    (tmp_path / "phases.jsonl").write_text(
        json.dumps({"phase": "reconnect", "edge": "start", "t": 100.0})
        + "\n"
        + json.dumps({"phase": "reconnect", "edge": "end", "t": 102.0})
        + "\n"
    )
    chain = [["app/hub/hub.py", "AgentHub._serve_peer"], ["app/store/postgres.py", "record"]]
    called = ["app/hub/session.py", "AgentSession.receive"]
    (tmp_path / "7.jsonl").write_text(
        "\n".join(
            json.dumps(record)
            for record in [
                {"flushed": 100.5},
                {"t": 101.0, "sink": "append", "argv": ["llmgw-server", "serve"], "chain": chain},
                {"tenth": 1010, "caller": chain[0], "callee": called},
                {"flushed": 102.5},
            ]
        )
        + "\n"
    )

    path = phase_paths(tmp_path)["reconnect"]

    assert path.on_chain == {tuple(frame) for frame in chain}
    assert path.functions == path.on_chain | {tuple(called)}
