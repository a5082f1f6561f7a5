"""`llmgw-cli rollout pause MODEL --reason '...'` refuses a reason the admin API would refuse
(over 500 characters, or holding a control character) as bad usage (exit 2), naming what was
wrong, and sends nothing; a one-line reason within the bound is sent."""

from __future__ import annotations

import pytest

from app.domain.free_text import MAX_REASON_LENGTH, reason_errors
from cli.main import app
from tests.support.stub_admin import RecordingAdmin


def test_the_cli_bound_is_the_apis() -> None:
    from cli import arguments  # the module's bound, read when the test runs

    assert getattr(arguments, "MAX_REASON_LENGTH", None) == MAX_REASON_LENGTH


@pytest.mark.parametrize(
    ("reason", "refusal"),
    [
        ("x" * 501, "--reason must be at most 500 characters, got 501"),
        (
            "TTFT\x1b[2J high",
            "--reason must be one line of text, got the control character U+001B (character 5)",
        ),
        ("two\nlines", "--reason must be one line of text, got the control character U+000A"),
        ("nul\0", "--reason must be one line of text, got the control character U+0000"),
        ("del\x7f", "--reason must be one line of text, got the control character U+007F"),
    ],
)
def test_a_reason_the_api_refuses_is_bad_usage_and_nothing_is_sent(
    recording_admin: RecordingAdmin, capsys: pytest.CaptureFixture[str], reason: str, refusal: str
) -> None:
    assert reason_errors("reason", reason), "the API refuses it too"

    with pytest.raises(SystemExit) as ended:
        app(["rollout", "pause", "llama", "--reason", reason, "--admin-url", recording_admin.url])

    assert ended.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("llmgw-cli rollout pause: ")
    assert refusal in error
    assert "\x1b" not in error
    assert recording_admin.sent == []


@pytest.mark.parametrize("reason", ["x" * 500, "TTFT looks high", ""])
def test_a_reason_the_api_takes_is_sent(recording_admin: RecordingAdmin, reason: str) -> None:
    assert not reason_errors("reason", reason)

    with pytest.raises(SystemExit) as ended:
        app(["rollout", "pause", "llama", "--reason", reason, "--admin-url", recording_admin.url])

    assert ended.value.code == 1  # the stub refuses it: what matters is that it was asked
    assert recording_admin.sent == ["POST /admin/v1/models/llama/rollout/pause"]
