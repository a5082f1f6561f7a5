"""``llmgw-server gateway`` as a process of its own, for the tests that need several or a
real one: on the test database as the runtime role, stopped on leaving (SIGTERM, then
SIGKILL after 10 s), the tail of its log printed so that pytest shows it when the test
fails."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support.cluster import SERVER
from tests.support.databases import runtime_url

LOG_TAIL_CHARS = 20_000
STOP_WITHIN_S = 10
FAST_SCRAPE = ("--scrape-interval", "0.05")
"""Engines scraped every 50 ms, so that a gateway sees its load move quickly."""


@contextlib.contextmanager
def gateway_process(
    database_url: str,
    *,
    gateway_id: str,
    port: int,
    log: Path,
    metrics_port: int = 0,
    options: Sequence[str] = (),
) -> Iterator[subprocess.Popen[bytes]]:
    """A gateway listening on ``port`` (and ``/metrics`` on ``metrics_port``, 0 for a free
    one) with ``options`` added to its command line, its output in ``log``."""
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                SERVER,
                "gateway",
                *("--database-url", runtime_url(database_url), "--port", str(port)),
                *("--gateway-id", gateway_id, "--metrics-port", str(metrics_port)),
                *options,
            ],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        print(f"----- {log} -----\n{log.read_text(errors='replace')[-LOG_TAIL_CHARS:]}")
