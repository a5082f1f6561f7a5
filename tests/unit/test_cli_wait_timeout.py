"""Every command that follows something with ``--wait`` takes ``--timeout S``, as
``rollout status`` does: a drain still going after S seconds ends the wait with exit 1,
saying the time ran out and that the drain goes on (with ``--output json``, its progress
as it was on stdout); ``--timeout`` without ``--wait`` is bad usage (exit 2) and nothing is
sent, whichever the command."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from cli.config import ConnectionFlags
from cli.drain import drain_progress
from cli.drain_cancel import drain_cancel
from cli.main import app
from tests.support.stub_admin import RecordingAdmin, StubHandler, stub_admin_api

DRAIN = "drain-5c2e81d0"
RUNNING = {
    "drain_id": DRAIN,
    "node_id": "gpu-7",
    "requested_by": "alice",
    "requested_at": "2026-12-04T17:00:00Z",
    "grace_s": 86400.0,
    "state": "running",
    "finished": False,
}


class NeverEnding(StubHandler):
    """A drain that goes on and on: accepted, cancel recorded, progress always running."""

    def do_GET(self) -> None:
        self.answer(200, "application/json", json.dumps(RUNNING).encode())

    def do_POST(self) -> None:
        if self.path.endswith("/cancel"):
            body = {"changed": True, "drain": RUNNING}
        else:
            body = {"drain_id": DRAIN, "progress": f"/admin/v1/drains/{DRAIN}", "room": []}
        self.answer(200, "application/json", json.dumps(body).encode())


@pytest.fixture
def connection(monkeypatch: pytest.MonkeyPatch) -> Iterator[ConnectionFlags]:
    with stub_admin_api(NeverEnding, monkeypatch) as url:
        yield ConnectionFlags(admin_url=url)


def test_drain_progress_wait_ends_with_exit_1_when_its_timeout_runs_out(
    connection: ConnectionFlags, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, drain-progress had no --timeout: a script's wait on a stuck drain was bounded
    # only by the drain's grace (a day here), unlike `rollout status --wait --timeout`.
    started = time.monotonic()
    code = drain_progress(DRAIN, wait=True, timeout=0.3, output="json", connection=connection)

    captured = capsys.readouterr()
    assert code == 1
    assert time.monotonic() - started < 10
    assert json.loads(captured.out)["state"] == "running"
    assert captured.err == (
        f"llmgw-cli drain-progress: {DRAIN} is still running (--timeout ran out); it goes "
        f"on: llmgw-cli drain-progress {DRAIN} --wait\n"
    )


def test_drain_wait_and_drain_cancel_wait_end_the_same_way(
    connection: ConnectionFlags, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        app(
            [
                "drain",
                "gpu-7",
                "--wait",
                "--timeout",
                "0.3",
                "--admin-url",
                str(connection.admin_url),
            ]
        )
    drained = capsys.readouterr()
    cancelling = drain_cancel(DRAIN, wait=True, timeout=0.3, connection=connection)
    cancelled = capsys.readouterr()

    assert ended.value.code == 1
    assert drained.err.endswith(
        f"llmgw-cli drain: {DRAIN} is still running (--timeout ran out); it goes on: "
        f"llmgw-cli drain-progress {DRAIN} --wait\n"
    )
    assert cancelling == 1
    assert cancelled.err.startswith(f"llmgw-cli drain-cancel: {DRAIN} is still running")


@pytest.mark.parametrize(
    "command",
    [
        ["drain", "gpu-7"],
        ["drain", "--replica", "llama-2"],
        ["drain-progress", DRAIN],
        ["drain-cancel", DRAIN],
        ["rollout", "status", "llama"],
    ],
)
def test_a_timeout_without_wait_is_bad_usage_and_nothing_is_sent(
    recording_admin: RecordingAdmin, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        app([*command, "--timeout", "5", "--admin-url", recording_admin.url])

    assert ended.value.code == 2
    assert capsys.readouterr().err == (
        f"llmgw-cli {command[0]}{' status' if command[0] == 'rollout' else ''}: --timeout "
        "bounds --wait: give --wait too, or leave --timeout out\n"
    )
    assert recording_admin.sent == []


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "soon"])
def test_a_timeout_that_is_no_positive_number_is_refused_naming_it(
    recording_admin: RecordingAdmin, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    with pytest.raises(SystemExit) as ended:
        app(
            [
                "drain-progress",
                DRAIN,
                "--wait",
                "--timeout",
                value,
                "--admin-url",
                recording_admin.url,
            ]
        )

    assert ended.value.code == 2
    assert capsys.readouterr().err.startswith("llmgw-cli drain-progress: --timeout ")
    assert recording_admin.sent == []
