"""`llmgw-cli rollout status MODEL --timeout S` without --wait is bad usage (exit 2): the
timeout bounds only a wait, and ignored it would let a script believe it set one."""

from __future__ import annotations

import pytest

from cli.main import app
from tests.support.stub_admin import RecordingAdmin


def test_a_timeout_without_wait_is_bad_usage_and_nothing_is_asked(
    recording_admin: RecordingAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        app(["rollout", "status", "llama", "--timeout", "5", "--admin-url", recording_admin.url])

    assert ended.value.code == 2
    assert "--timeout bounds --wait: give --wait too, or leave --timeout out" in (
        capsys.readouterr().err
    )
    assert recording_admin.sent == []


def test_a_timeout_with_wait_is_taken(recording_admin: RecordingAdmin) -> None:
    with pytest.raises(SystemExit) as ended:
        app(
            [
                "rollout",
                "status",
                "llama",
                "--wait",
                "--timeout",
                "5",
                "--admin-url",
                recording_admin.url,
            ]
        )

    assert ended.value.code == 1  # the stub refuses it: what matters is that it was asked
    assert recording_admin.sent[0] == "GET /admin/v1/models/llama/rollout"
