"""``configure_logging`` in a process of its own, as each entry point calls it: one format
on stderr for structlog's lines and the standard library's (uvicorn, websockets, httpx), chosen by
``LLMGW_LOG_FORMAT`` or, by default, by whether stderr is a terminal (a real one here, a
pseudo-terminal)."""

from __future__ import annotations

import json
import logging
import os
import pty
import subprocess
import sys

import pytest

from app.logs import SLOW_REQUEST_S, request_level

SCRIPT = """
import logging, structlog
from app.logs import configure_logging
configure_logging("info", command="llmgw-agent")
log = structlog.get_logger("app.example")
with structlog.contextvars.bound_contextvars(node_id="gpu-07"):
    log.info("agent_connected", replaced_previous=False)
log.debug("agent_heartbeat")
logging.getLogger("uvicorn.error").info("Started server process [%d]", 42)
logging.getLogger("websockets.server").info("connection open")
logging.getLogger("httpx").info('HTTP Request: GET http://127.0.0.1:20001/health "HTTP/1.1 200 OK"')
logging.getLogger("websockets.server").error("opening handshake failed")
try:
    raise RuntimeError("a bug")
except RuntimeError:
    log.exception("reconcile_pass_failed")
"""


def run(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**env, **environment},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_off_a_terminal_every_line_is_json_whoever_logged_it() -> None:
    result = run({})

    assert result.returncode == 0, result.stderr
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(e["level"], e["event"], e["logger"]) for e in entries] == [
        ("info", "agent_connected", "app.example"),
        ("info", "Started server process [42]", "uvicorn.error"),
        ("error", "opening handshake failed", "websockets.server"),
        ("error", "reconcile_pass_failed", "app.example"),
    ]
    assert entries[0]["node_id"] == "gpu-07"
    assert "node_id" not in entries[1]
    assert "RuntimeError: a bug" in entries[3]["exception"]
    assert all(list(e)[:4] == ["timestamp", "level", "event", "logger"] for e in entries)


def test_the_console_format_is_asked_for_by_name() -> None:
    result = run({"LLMGW_LOG_FORMAT": "console"})

    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert not any(line.startswith("{") for line in lines)
    assert "agent_connected" in lines[0]
    assert "node_id=gpu-07" in lines[0]
    assert "[uvicorn.error]" in lines[1]


def test_on_a_terminal_the_default_is_the_console_format() -> None:
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stderr=follower, stdout=subprocess.DEVNULL
    )
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the process has exited
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert process.wait(timeout=60) == 0
    text = output.decode(errors="replace")
    assert "agent_connected" in text
    assert '{"timestamp"' not in text


@pytest.mark.parametrize(
    ("log_format", "level", "said"),
    [
        ("xml", "info", "llmgw-agent: LLMGW_LOG_FORMAT='xml': expected one of auto, json, console"),
        ("json", "loud", "llmgw-agent: log level 'loud': expected one of debug, info, warning"),
    ],
)
def test_an_unknown_format_or_level_stops_the_process_in_one_line(
    log_format: str, level: str, said: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.replace('"info"', repr(level))],
        env={**env, "LLMGW_LOG_FORMAT": log_format},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(said)


@pytest.mark.parametrize(
    ("status", "seconds", "level"),
    [
        (200, 0.01, "DEBUG"),
        (404, 0.01, "DEBUG"),
        (429, 0.01, "DEBUG"),
        (200, SLOW_REQUEST_S, "WARNING"),
        (500, 0.01, "ERROR"),
        (503, SLOW_REQUEST_S * 10, "ERROR"),
    ],
)
def test_a_request_line_is_debug_unless_it_failed_or_was_slow(
    status: int, seconds: float, level: str
) -> None:
    assert request_level(status, seconds) == logging.getLevelNamesMapping()[level]
